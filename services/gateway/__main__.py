"""`python -m services.gateway`: serve the gateway with uvicorn on the configured address."""

from __future__ import annotations

from online_rl.config import load_settings
from services.gateway.main import create_app
from services.limits import serve


def main() -> None:
    settings = load_settings()
    api = settings.gateway
    serve(create_app(settings), api.host, api.port, api.max_concurrency)


if __name__ == "__main__":
    main()
