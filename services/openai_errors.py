"""Errors as OpenAI-style answers, shared by the OpenAI-compatible services (inference, gateway):
`{"error": {"message", "type", "param", "code"}}`.

The `openai` client turns these into its typed exceptions (BadRequestError, AuthenticationError,
NotFoundError, ...), so callers handle our errors exactly as they handle OpenAI's. Each service adds
the handlers for its own library exceptions on top of `install_openai_handlers`.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.ingest import RateLimited

__all__ = ["ApiError", "answer", "error_body", "install_openai_handlers"]


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def error_body(message: str, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def answer(status: int, message: str, kind: str, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, kind, param, code), headers=headers)


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


def install_openai_handlers(app: FastAPI, logger: logging.Logger) -> None:
    """`ApiError`, invalid requests (400, naming each field), a key over its rate (429 with Retry-After),
    HTTP errors (413 for a body over the limit) and the unexpected (500)."""

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return answer(exc.status, exc.message, exc.kind, exc.param, exc.code)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        message, param = _validation_message(exc)
        return answer(400, message, "invalid_request_error", param)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        code = "request_too_large" if exc.status_code == 413 else None  # a streamed body over the limit
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content=error_body(str(exc.detail), kind, code=code))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return answer(500, "unexpected error; see the service logs", "server_error")

    async def on_rate_limited(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RateLimited)
        retry = max(1, round(exc.retry_after + 0.5))
        return answer(429, f"{exc}; retry after {retry}s", "requests", code="rate_limit_exceeded",
                      headers={"Retry-After": str(retry)})

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RateLimited, on_rate_limited)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
