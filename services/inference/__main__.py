"""`python -m services.inference`: what `online-rl serve inference` does (settings from $ORL_CONFIG)."""

from __future__ import annotations

from services.common.serve import serve
from services.inference.main import create_app

if __name__ == "__main__":
    serve(create_app, "inference")
