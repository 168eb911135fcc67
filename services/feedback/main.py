"""The feedback API app: `create_app(settings)` builds it; `python -m services.feedback` serves it.

A thin layer over `online_rl`: validation, auth and error mapping here; events, limits and the bus
writer in the library.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, HTTPException

from online_rl import __version__
from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from online_rl.errors import ConfigError
from services.feedback.errors import install_error_handlers
from services.feedback.routes import feedback, health
from services.feedback.service import FeedbackService

__all__ = ["create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class BodyLimit:
    """Refuses bodies over `limit` bytes with 413, whether announced by Content-Length or streamed."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._refuse(send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                # Raised while FastAPI reads the body: it passes HTTPExceptions on to the handlers.
                raise HTTPException(413, f"the body is larger than {self.limit} bytes")
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Send) -> None:
        import json

        body = json.dumps({"type": "payload_too_large",
                           "message": f"the body is larger than {self.limit} bytes",
                           "details": [{"field": "(body)", "message": "too large",
                                        "fix": "send fewer events per request"}]}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def create_app(settings: Settings, bus: Bus | None = None) -> FastAPI:
    """The feedback API over `bus` (default: the configured bus)."""
    service_bus = bus or open_bus(settings)
    service = FeedbackService(settings, service_bus)
    if len(service.keys) == 0:
        raise ConfigError(
            "feedback_api.api_keys is empty, so every write would be refused; create a key with "
            "`online-rl keys new` and set its hash in feedback_api.api_keys (or api_keys_file)"
        )
    ensure_topics(service_bus, settings.bus.partitions, service.topics)

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
    app.add_middleware(BodyLimit, limit=settings.feedback_api.max_body_bytes)
    return app
