"""Typed dependencies: the service and the caller's API key (scope `inference` or `admin`). A key
with the `admin` scope (an operator's, such as the gateway's relaying every user) spends no rate."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from online_rl.ingest import KeyInfo
from services.common.app import app_service
from services.common.auth import require_scope
from services.inference.service import InferenceService

__all__ = ["AdminDep", "CallerDep", "ServiceDep"]

ServiceDep = Annotated[InferenceService, Depends(app_service)]
CallerDep = Annotated[KeyInfo, Depends(require_scope("inference", rate_limit="keys without admin"))]
AdminDep = Annotated[KeyInfo, Depends(require_scope("admin", rate_limit="keys without admin"))]
