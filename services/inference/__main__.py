"""`python -m services.inference`: serve the inference API with uvicorn on the configured address."""

from __future__ import annotations

from online_rl.config import load_settings
from services.inference.main import create_app
from services.limits import serve


def main() -> None:
    settings = load_settings()
    api = settings.inference
    serve(create_app(settings), api.host, api.port, api.max_concurrency)


if __name__ == "__main__":
    main()
