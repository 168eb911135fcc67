"""The inference service's errors in one place, as OpenAI-style answers (`services/openai_errors`):
its library's exceptions mapped to status codes."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from online_rl.registry import AdapterRejected
from online_rl.serving import (
    AdapterLoadError,
    AdapterUnavailable,
    EngineError,
    PromptTooLong,
    UnknownModel,
    VersionConflict,
)
from services.openai_errors import ApiError, answer, error_body, install_openai_handlers

__all__ = ["ApiError", "error_body", "install_error_handlers"]

logger = logging.getLogger(__name__)


def install_error_handlers(app: FastAPI) -> None:
    install_openai_handlers(app, logger)

    async def on_unknown_model(request: Request, exc: Exception) -> JSONResponse:
        return answer(404, str(exc), "invalid_request_error", "model", "model_not_found")

    async def on_too_long(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PromptTooLong)
        return answer(400, str(exc), "invalid_request_error", exc.field, "context_length_exceeded")

    async def on_rejected(request: Request, exc: Exception) -> JSONResponse:
        return answer(422, str(exc), "adapter_rejected", "source")

    async def on_fetch_failed(request: Request, exc: Exception) -> JSONResponse:
        return answer(503, str(exc), "adapter_unavailable", "source", headers={"Retry-After": "5"})

    async def on_conflict(request: Request, exc: Exception) -> JSONResponse:
        return answer(409, str(exc), "conflict")

    async def on_engine(request: Request, exc: Exception) -> JSONResponse:
        logger.error("engine error on %s: %s", request.url.path, exc)
        return answer(503, f"generation failed: {exc}; retry", "engine_error")

    app.add_exception_handler(UnknownModel, on_unknown_model)
    app.add_exception_handler(PromptTooLong, on_too_long)
    app.add_exception_handler(AdapterRejected, on_rejected)
    app.add_exception_handler(AdapterLoadError, on_rejected)
    app.add_exception_handler(AdapterUnavailable, on_fetch_failed)
    app.add_exception_handler(VersionConflict, on_conflict)
    app.add_exception_handler(EngineError, on_engine)
