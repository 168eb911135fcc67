"""What every service's edge refuses before any handler runs: bodies over a size, and how it is served.

`BodyLimit` answers 413 to a body over `limit` bytes, whether its Content-Length announces it (refused
before a byte is read) or it streams in chunks (refused once the count passes the limit, so memory
never holds more than the limit); either way the 413 closes the connection, so the rest of the body is
never read. `serve` runs an app under uvicorn with a cap on concurrent
connections and tasks (503 past it) and a keep-alive timeout, so idle or slow clients cannot hold
every worker.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Receive, Scope, Send

__all__ = ["BodyLimit", "openai_too_large", "serve"]


def openai_too_large(limit: int) -> dict[str, Any]:
    """The OpenAI-style body of a 413."""
    return {"error": {"message": f"the request body is larger than {limit} bytes",
                      "type": "invalid_request_error", "param": None, "code": "request_too_large"}}


class _TooLarge(Exception):
    """Raised from `receive` into the app once the body passes the limit; caught around the app."""


class BodyLimit:
    """Refuses bodies over `limit` bytes with 413 and the body `refusal(limit)`."""

    def __init__(self, app: Any, limit: int,
                 refusal: Callable[[int], dict[str, Any]] = openai_too_large) -> None:
        self.app, self.limit, self.refusal = app, limit, refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(send)
            return
        seen, started = 0, False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                if not started:  # the refusal closes the connection, so the rest is not read at all
                    await self._refuse(send)
                raise _TooLarge
            return message

        async def guarded(message: Message) -> None:
            nonlocal started
            if seen > self.limit:
                return  # the app's own answer to the aborted read: the 413 went already
            started = True
            await send(message)

        with contextlib.suppress(_TooLarge):
            await self.app(scope, counted, guarded)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(self.refusal(self.limit)).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def serve(app: Any, host: str, port: int, max_concurrency: int) -> None:
    """Serve `app` until stopped: at most `max_concurrency` connections and tasks at once (uvicorn
    answers 503 past it), idle keep-alive connections closed after 5 s."""
    import uvicorn

    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False,
                limit_concurrency=max_concurrency, timeout_keep_alive=5)
