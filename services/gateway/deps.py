"""Typed dependencies: the service and the caller's API key (scope `inference`, or `admin`), every
request spending a token of its key's rate."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from online_rl.ingest import KeyInfo
from services.common.app import app_service
from services.common.auth import require_scope
from services.gateway.service import GatewayService

__all__ = ["AdminDep", "CallerDep", "ServiceDep"]

ServiceDep = Annotated[GatewayService, Depends(app_service)]
CallerDep = Annotated[KeyInfo, Depends(require_scope("inference"))]
AdminDep = Annotated[KeyInfo, Depends(require_scope("admin"))]
