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

from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from services.common.app import edge_app
from services.common.errors import ApiError, feedback_body
from services.common.serve import require_api_keys
from services.feedback.errors import install_error_handlers
from services.feedback.routes import feedback, health
from services.feedback.service import FeedbackService

__all__ = ["create_app"]


def _too_large(limit: int) -> dict[str, Any]:
    detail = {"field": "(body)", "message": "too large", "fix": "send fewer events per request"}
    return feedback_body(ApiError(413, "payload_too_large", f"the body is larger than {limit} bytes",
                                  details=[detail]))


def create_app(settings: Settings, bus: Bus | None = None) -> FastAPI:
    """The feedback API over `bus` (default: the configured bus)."""
    require_api_keys(settings, "feedback_api")
    service_bus = bus or open_bus(settings)
    service = FeedbackService(settings, service_bus)
    ensure_topics(service_bus, service.topics, settings.bus.partitions)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.close)  # waits for the writer without blocking the loop

    return edge_app(
        "online-rl feedback API",
        "Post users' judgements of served responses. Each response of the inference "
        "service carries a `request_id`; feedback on it is joined with what was served and "
        "used for training. Authenticate with `Authorization: Bearer <API key>`.",
        lifespan, service, install_error_handlers, [feedback.router, health.router],
        settings.feedback_api.max_body_bytes, too_large=_too_large,
    )
