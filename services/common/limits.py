"""What every service's edge refuses before any handler runs: bodies over a size.

`BodyLimit` answers 413 to a body over `limit` bytes, whether its Content-Length announces it (refused
before a byte is read) or it streams in chunks (refused once the count passes the limit, so memory
never holds more than the limit); either way the 413 closes the connection, so the rest of the body is
never read. What the server itself caps (connections, tasks, idle keep-alive) is set in `serve`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from services.common.errors import ApiError, openai_body

__all__ = ["BodyLimit", "openai_too_large"]


def openai_too_large(limit: int) -> dict[str, Any]:
    """The OpenAI-style body of a 413."""
    message = f"the request body is larger than {limit} bytes"
    return openai_body(ApiError(413, "invalid_request_error", message, code="request_too_large"))


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

