"""`python -m services.inference`: serve the inference API with uvicorn on the configured address."""

from __future__ import annotations

import uvicorn

from online_rl.config import load_settings
from services.inference.main import create_app


def main() -> None:
    settings = load_settings()
    uvicorn.run(create_app(settings), host=settings.inference.host, port=settings.inference.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
