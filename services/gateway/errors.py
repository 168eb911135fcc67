"""The gateway's errors in one place, as OpenAI-style answers (`services.common.errors`): what the
OpenAI-compatible apps map alike, rollout conflicts and replicas away."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

from online_rl.rollout import ReplicaUnavailable, RolloutConflict
from services.common.errors import ApiError, install_errors, openai_body, openai_errors

__all__ = ["install_error_handlers"]

logger = logging.getLogger(__name__)


def _no_replica(request: Request, exc: Exception) -> ApiError:
    logger.error("no replica for %s: %s", request.url.path, exc)
    return ApiError(503, "service_unavailable", str(exc), headers={"Retry-After": "1"})


async def _forward(request: Request, exc: Exception) -> Response:
    from services.gateway.routes.rollout import forward

    try:
        return await forward(request, request.app.state.service)
    except ApiError as error:
        return JSONResponse(openai_body(error), status_code=error.status, headers=dict(error.headers or {}))


def install_error_handlers(app: FastAPI) -> None:
    from services.gateway.routes.rollout import ForwardToController

    install_errors(app, openai_body, openai_errors(logger) | {
        RolloutConflict: lambda request, exc: ApiError(409, "conflict", str(exc)),
        ReplicaUnavailable: _no_replica,
    })
    app.add_exception_handler(ForwardToController, _forward)
