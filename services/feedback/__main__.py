"""`python -m services.feedback`: what `online-rl serve feedback` does (settings from $ORL_CONFIG)."""

from __future__ import annotations

from services.common.serve import serve
from services.feedback.main import create_app

if __name__ == "__main__":
    serve(create_app, "feedback_api")
