"""`python -m services.gateway`: serve the gateway with uvicorn on the configured address."""

from __future__ import annotations

import uvicorn

from online_rl.config import load_settings
from services.gateway.main import create_app


def main() -> None:
    settings = load_settings()
    uvicorn.run(create_app(settings), host=settings.gateway.host, port=settings.gateway.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
