"""The feedback API app: `create_app(settings)` builds it; `python -m services.feedback` serves it.

A thin layer over `online_rl`: validation, auth and error mapping here; events, limits and the bus
writer in the library.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from online_rl import __version__
from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from online_rl.errors import ConfigError
from services.feedback.errors import install_error_handlers
from services.feedback.routes import feedback, health
from services.feedback.service import FeedbackService
from services.limits import BodyLimit

__all__ = ["create_app"]


def _too_large(limit: int) -> dict[str, Any]:
    return {"type": "payload_too_large", "message": f"the body is larger than {limit} bytes",
            "details": [{"field": "(body)", "message": "too large", "fix": "send fewer events per request"}]}


def create_app(settings: Settings, bus: Bus | None = None) -> FastAPI:
    """The feedback API over `bus` (default: the configured bus)."""
    service_bus = bus or open_bus(settings)
    service = FeedbackService(settings, service_bus)
    if len(service.keys) == 0:
        raise ConfigError(
            "feedback_api.api_keys is empty, so every write would be refused; create a key with "
            "`online-rl keys new` and set its hash in feedback_api.api_keys (or api_keys_file)"
        )
    ensure_topics(service_bus, service.topics, settings.bus.partitions)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.close)  # waits for the writer without blocking the loop

    app = FastAPI(
        title="online-rl feedback API",
        version=__version__,
        description="Post users' judgements of served responses. Each response of the inference "
        "service carries a `request_id`; feedback on it is joined with what was served and "
        "used for training. Authenticate with `Authorization: Bearer <API key>`.",
        lifespan=lifespan,
    )
    app.state.service = service
    install_error_handlers(app)
    app.include_router(feedback.router)
    app.include_router(health.router)
    app.add_middleware(BodyLimit, limit=settings.feedback_api.max_body_bytes, refusal=_too_large)
    return app
