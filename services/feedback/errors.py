"""Errors as HTTP answers, in one place: every error body is `ErrorBody`."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.bus import BusError
from online_rl.ingest import OverLimit, RateLimited

__all__ = ["ApiError", "install_error_handlers"]

logger = logging.getLogger(__name__)


class ApiError(Exception):
    """An error with its status code, type, message and how to fix it."""

    def __init__(self, status: int, kind: str, message: str, fix: str = "",
                 headers: dict[str, str] | None = None, field: str = "") -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.fix, self.headers = status, kind, message, fix, headers
        self.field = field


def _body(kind: str, message: str, details: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details or []}


_FIXES = {
    "missing": "add this field",
    "extra_forbidden": "remove this field; it is not part of the request",
    "float_parsing": "send a number",
    "float_type": "send a number",
    "int_parsing": "send an integer",
    "string_type": "send a string",
    "string_too_long": "send a shorter string",
    "string_too_short": "send a non-empty string",
    "string_pattern_mismatch": "use only letters, digits and ._:@/+=- (at most 128 characters)",
    "enum": "use one of the allowed values",
    "literal_error": "use one of the allowed values",
    "json_invalid": "send a valid JSON body",
    "too_short": "send at least one item",
    "too_long": "send fewer items",
    "value_error": "see the message",
}


def _validation_details(exc: RequestValidationError) -> list[dict[str, str]]:
    details = []
    for error in exc.errors():
        loc = [str(p) for p in error.get("loc", ()) if p != "body"]
        field = ".".join(loc) or "(body)"
        message = str(error.get("msg", "invalid"))
        fix = _FIXES.get(str(error.get("type", "")), "see the message")
        if fix == "see the message" and message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
            fix = message
        details.append({"field": field, "message": message, "fix": fix})
    return details


def install_error_handlers(app: FastAPI) -> None:
    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        details = _validation_details(exc)
        request.app.state.service.metrics.rejected.labels("invalid").inc()
        first = details[0] if details else {"field": "(body)", "message": "invalid"}
        return JSONResponse(
            status_code=422,
            content=_body("validation_error", f"{first['field']}: {first['message']}", details),
        )

    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        details = [{"field": exc.field, "message": exc.message, "fix": exc.fix}] if exc.fix else []
        if exc.status == 422:
            request.app.state.service.metrics.rejected.labels("invalid").inc()
        return JSONResponse(status_code=exc.status, content=_body(exc.kind, exc.message, details),
                            headers=exc.headers)

    async def on_rate_limited(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RateLimited)
        request.app.state.service.metrics.rejected.labels("rate_limited").inc()
        retry = max(1, round(exc.retry_after + 0.5))
        return JSONResponse(status_code=429, headers={"Retry-After": str(retry)},
                            content=_body("rate_limited", str(exc),
                                          [{"field": "", "message": str(exc),
                                            "fix": f"retry after {retry}s or send fewer events"}]))

    async def on_bus_error(request: Request, exc: Exception) -> JSONResponse:
        service = request.app.state.service
        service.metrics.rejected.labels("bus_unavailable").inc()
        retry = str(service.settings.feedback_api.retry_after_s)
        message = f"the event bus did not confirm the write ({exc})"
        return JSONResponse(status_code=503, headers={"Retry-After": retry},
                            content=_body("bus_unavailable", message, [{
                                "field": "", "message": message,
                                "fix": f"retry after {retry}s with the same event ids "
                                       "(a repeat is counted once)"}]))

    async def on_over_limit(request: Request, exc: Exception) -> JSONResponse:
        request.app.state.service.metrics.rejected.labels("over_limit").inc()
        return JSONResponse(status_code=422, content=_body("validation_error", str(exc), [
            {"field": "events", "message": str(exc), "fix": "split the events over several requests"}]))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return JSONResponse(status_code=500,
                            content=_body("internal_error", "unexpected error; see the logs"))

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = str(exc.detail)
        kind, fix = "http_error", "see the API reference at /docs"
        if exc.status_code == 400:
            fix = "send a UTF-8 JSON body"
        elif exc.status_code == 413:
            kind, fix = "payload_too_large", "send fewer events per request"
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content=_body(kind, message,
                                          [{"field": "(body)", "message": message, "fix": fix}]))

    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RateLimited, on_rate_limited)
    app.add_exception_handler(BusError, on_bus_error)
    app.add_exception_handler(OverLimit, on_over_limit)
    app.add_exception_handler(Exception, on_unexpected)
