"""The gateway's errors in one place, as OpenAI-style answers (`services/openai_errors`): auth,
rollout conflicts and replicas away mapped to status codes."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from online_rl.ingest import Forbidden, Unauthenticated
from online_rl.rollout import RolloutConflict
from online_rl.rollout.replicas import ReplicaUnavailable
from services.openai_errors import ApiError, answer, install_openai_handlers

__all__ = ["ApiError", "install_error_handlers"]

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    install_openai_handlers(app, logger)

    async def on_unauthenticated(request: Request, exc: Exception) -> JSONResponse:
        return answer(401, str(exc), "authentication_error", code="invalid_api_key")

    async def on_forbidden(request: Request, exc: Exception) -> JSONResponse:
        return answer(403, str(exc), "permission_error", code="insufficient_scope")

    async def on_conflict(request: Request, exc: Exception) -> JSONResponse:
        return answer(409, str(exc), "conflict")

    async def on_unavailable(request: Request, exc: Exception) -> JSONResponse:
        logger.error("no replica for %s: %s", request.url.path, exc)
        return answer(503, str(exc), "service_unavailable", headers={"Retry-After": "1"})

    app.add_exception_handler(Unauthenticated, on_unauthenticated)
    app.add_exception_handler(Forbidden, on_forbidden)
    app.add_exception_handler(RolloutConflict, on_conflict)
    app.add_exception_handler(ReplicaUnavailable, on_unavailable)
