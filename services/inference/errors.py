"""The inference service's errors in one place, as OpenAI-style answers (`services.common.errors`):
what the OpenAI-compatible apps map alike, and its library's exceptions mapped to status codes."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request

from online_rl.registry import AdapterRejected
from online_rl.serving import (
    AdapterLoadError,
    AdapterUnavailable,
    EngineError,
    PromptTooLong,
    UnknownModel,
    VersionConflict,
)
from services.common.errors import ApiError, install_errors, openai_body, openai_errors

__all__ = ["install_error_handlers"]

logger = logging.getLogger(__name__)


def _too_long(request: Request, exc: Exception) -> ApiError:
    assert isinstance(exc, PromptTooLong)
    return ApiError(400, "invalid_request_error", str(exc), field=exc.field, code="context_length_exceeded")


def _rejected(request: Request, exc: Exception) -> ApiError:
    return ApiError(422, "adapter_rejected", str(exc), field="source")


def _engine_failed(request: Request, exc: Exception) -> ApiError:
    logger.error("engine error on %s: %s", request.url.path, exc)
    return ApiError(503, "engine_error", f"generation failed: {exc}; retry")


def install_error_handlers(app: FastAPI) -> None:
    install_errors(app, openai_body, openai_errors(logger) | {
        UnknownModel: lambda request, exc: ApiError(404, "invalid_request_error", str(exc), field="model",
                                                    code="model_not_found"),
        PromptTooLong: _too_long,
        AdapterRejected: _rejected,
        AdapterLoadError: _rejected,
        AdapterUnavailable: lambda request, exc: ApiError(503, "adapter_unavailable", str(exc),
                                                          field="source", headers={"Retry-After": "5"}),
        VersionConflict: lambda request, exc: ApiError(409, "conflict", str(exc)),
        EngineError: _engine_failed,
    })
