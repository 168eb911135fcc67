"""Typed dependencies of the feedback routes: the service and the writer's key (scope `feedback`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends

from online_rl.ingest import KeyInfo
from services.common.app import app_service
from services.common.auth import require_scope
from services.feedback.service import FeedbackService

__all__ = ["WRITE_SCOPE", "IngestDep", "WriterKeyDep", "require_writer"]

WRITE_SCOPE = "feedback"

IngestDep = Annotated[FeedbackService, Depends(app_service)]

# `Authorization: Bearer <key>` or `X-API-Key`; the rate is spent per event when they are written.
require_writer = require_scope(WRITE_SCOPE, rate_limit="none", x_api_key=True)
WriterKeyDep = Annotated[KeyInfo, Depends(require_writer)]
