"""Typed dependencies: the service and the caller's API key (scope `inference` or `admin`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from online_rl.ingest import KeyInfo
from services.inference.errors import ApiError
from services.inference.service import InferenceService

__all__ = ["AdminDep", "CallerDep", "ServiceDep"]


async def get_service(request: Request) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


ServiceDep = Annotated[InferenceService, Depends(get_service)]


def _verify(service: InferenceService, authorization: str | None, scope: str) -> KeyInfo:
    raw = authorization[7:].strip() if authorization and authorization.lower().startswith("bearer ") else None
    key = service.keys.verify(raw)
    if key is None:
        raise ApiError(401, "authentication_error",
                       "missing or unknown API key; send `Authorization: Bearer <key>` with a key made by "
                       "`online-rl keys new` (the openai client sends its api_key this way)",
                       code="invalid_api_key")
    # Admin is never implied: a key made without scopes may generate but not load adapters.
    allowed = scope in key.scopes if scope == "admin" else key.allows(scope)
    if not allowed:
        hint = "" if scope == "admin" else " (or no scopes)"
        raise ApiError(403, "permission_error", f"this API key lacks the '{scope}' scope; use a key whose "
                       f"entry lists '{scope}'{hint}", code="insufficient_scope")
    return key


async def require_caller(service: ServiceDep,
                         authorization: Annotated[str | None, Header(include_in_schema=False)] = None
                         ) -> KeyInfo:
    return _verify(service, authorization, "inference")


async def require_admin(service: ServiceDep,
                        authorization: Annotated[str | None, Header(include_in_schema=False)] = None
                        ) -> KeyInfo:
    return _verify(service, authorization, "admin")


CallerDep = Annotated[KeyInfo, Depends(require_caller)]
AdminDep = Annotated[KeyInfo, Depends(require_admin)]
