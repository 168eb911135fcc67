"""Typed dependencies of the feedback routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from online_rl.ingest import KeyInfo
from services.feedback.errors import ApiError
from services.feedback.service import FeedbackService

__all__ = ["IngestDep", "WriterKeyDep", "authenticate"]

WRITE_SCOPE = "feedback"


async def get_service(request: Request) -> FeedbackService:
    service: FeedbackService = request.app.state.service
    return service


IngestDep = Annotated[FeedbackService, Depends(get_service)]


async def require_writer(
    service: IngestDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> KeyInfo:
    """The caller's API key, from `Authorization: Bearer <key>` or `X-API-Key`."""
    return authenticate(service, authorization, x_api_key)


def authenticate(service: FeedbackService, authorization: str | None, x_api_key: str | None) -> KeyInfo:
    """Verify the key and its write scope, or raise the 401/403 `ApiError`."""
    raw = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        raw = authorization[7:].strip()
    key = service.keys.verify(raw)
    if key is None:
        service.metrics.rejected.labels("unauthenticated").inc()
        raise ApiError(401, "unauthenticated", "missing or unknown API key",
                       fix="send `Authorization: Bearer <key>` with a key made by `online-rl keys new`")
    if not key.allows(WRITE_SCOPE):
        service.metrics.rejected.labels("forbidden").inc()
        raise ApiError(403, "forbidden", f"this API key lacks the '{WRITE_SCOPE}' scope",
                       fix=f"use a key whose entry lists '{WRITE_SCOPE}' (or no scopes)")
    return key


WriterKeyDep = Annotated[KeyInfo, Depends(require_writer)]
