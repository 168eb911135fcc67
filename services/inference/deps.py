"""Typed dependencies: the service and the caller's API key (scope `inference` or `admin`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from online_rl.ingest import Forbidden, KeyInfo, Unauthenticated, authorize
from services.inference.errors import ApiError
from services.inference.service import InferenceService

__all__ = ["AdminDep", "CallerDep", "ServiceDep"]


async def get_service(request: Request) -> InferenceService:
    service: InferenceService = request.app.state.service
    return service


ServiceDep = Annotated[InferenceService, Depends(get_service)]


def _verify(service: InferenceService, authorization: str | None, scope: str) -> KeyInfo:
    try:
        key = authorize(service.keys, authorization, scope)
    except Unauthenticated as exc:
        raise ApiError(401, "authentication_error", str(exc), code="invalid_api_key") from exc
    except Forbidden as exc:
        raise ApiError(403, "permission_error", str(exc), code="insufficient_scope") from exc
    if "admin" not in key.scopes:  # an operator's key (the gateway's, relaying every user) is not limited
        service.buckets.take(key.key_id)  # RateLimited: 429 with Retry-After
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
