"""`python -m services.gateway`: what `online-rl serve gateway` does (settings from $ORL_CONFIG)."""

from __future__ import annotations

from services.common.serve import serve
from services.gateway.main import create_app

if __name__ == "__main__":
    serve(create_app, "gateway")
