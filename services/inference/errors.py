"""Errors as OpenAI-style answers, in one place: `{"error": {"message", "type", "param", "code"}}`.

The `openai` client turns these into its typed exceptions (BadRequestError, AuthenticationError,
NotFoundError, ...), so callers handle our errors exactly as they handle OpenAI's.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.registry import AdapterRejected
from online_rl.serving import (
    AdapterLoadError,
    AdapterUnavailable,
    EngineError,
    PromptTooLong,
    UnknownModel,
    VersionConflict,
)

__all__ = ["ApiError", "error_body", "install_error_handlers"]

logger = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _answer(status: int, message: str, kind: str, param: str | None = None,
            code: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, kind, param, code))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    parts, first = [], None
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "(body)"
        first = first or field
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            message = "is not supported by this server; remove it"
        elif error.get("type") == "missing":
            message = "is required"
        parts.append(f"{field}: {message}")
    return "; ".join(parts) or "invalid request", first


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _answer(exc.status, exc.message, exc.kind, exc.param, exc.code)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return _answer(400, message, "invalid_request_error", param)

    async def on_unknown_model(request: Request, exc: Exception) -> JSONResponse:
        return _answer(404, str(exc), "invalid_request_error", "model", "model_not_found")

    async def on_too_long(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, PromptTooLong)
        return _answer(400, str(exc), "invalid_request_error", exc.field, "context_length_exceeded")

    async def on_rejected(request: Request, exc: Exception) -> JSONResponse:
        return _answer(422, str(exc), "adapter_rejected", "source")

    async def on_fetch_failed(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"Retry-After": "5"},
                            content=error_body(str(exc), "adapter_unavailable", "source"))

    async def on_conflict(request: Request, exc: Exception) -> JSONResponse:
        return _answer(409, str(exc), "conflict")

    async def on_engine(request: Request, exc: Exception) -> JSONResponse:
        logger.error("engine error on %s: %s", request.url.path, exc)
        return _answer(503, f"generation failed: {exc}; retry", "engine_error")

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content=error_body(str(exc.detail), kind))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return _answer(500, "unexpected error; see the service logs", "server_error")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(UnknownModel, on_unknown_model)
    app.add_exception_handler(PromptTooLong, on_too_long)
    app.add_exception_handler(AdapterRejected, on_rejected)
    app.add_exception_handler(AdapterLoadError, on_rejected)
    app.add_exception_handler(AdapterUnavailable, on_fetch_failed)
    app.add_exception_handler(VersionConflict, on_conflict)
    app.add_exception_handler(EngineError, on_engine)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
