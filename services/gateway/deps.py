"""Typed dependencies: the service and the caller's API key (scope `inference`, or `admin`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from online_rl.ingest import KeyInfo, authorize
from services.gateway.service import GatewayService

__all__ = ["AdminDep", "CallerDep", "ServiceDep"]


async def get_service(request: Request) -> GatewayService:
    service: GatewayService = request.app.state.service
    return service


ServiceDep = Annotated[GatewayService, Depends(get_service)]


async def require_caller(service: ServiceDep,
                         authorization: Annotated[str | None, Header(include_in_schema=False)] = None
                         ) -> KeyInfo:
    key = authorize(service.keys, authorization, "inference")
    service.buckets.take(key.key_id)  # RateLimited: 429 with Retry-After
    return key


async def require_admin(service: ServiceDep,
                        authorization: Annotated[str | None, Header(include_in_schema=False)] = None
                        ) -> KeyInfo:
    key = authorize(service.keys, authorization, "admin")
    service.buckets.take(key.key_id)
    return key


CallerDep = Annotated[KeyInfo, Depends(require_caller)]
AdminDep = Annotated[KeyInfo, Depends(require_admin)]
