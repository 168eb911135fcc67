"""Errors as HTTP answers: one error type, `ApiError`, and the two wire formats it is written in.

`openai_body` is what the OpenAI-compatible apps (inference, gateway) answer,
`{"error": {"message", "type", "param", "code"}}`, which the `openai` client turns into its typed
exceptions (BadRequestError, AuthenticationError, ...), so callers handle our errors as they handle
OpenAI's. `feedback_body` is the feedback API's `ErrorBody`, `{"type", "message", "details"}`, each
detail naming a field and how to fix it.

`install_errors` gives an app its format and its table of translations: each exception type the app
maps, with the `ApiError` it becomes. `openai_errors` is the part of the table the OpenAI-compatible
apps share; each app adds its own library's exceptions. Knows nothing of any app's routes or state.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.ingest import Forbidden, RateLimited, Unauthenticated

__all__ = ["ApiError", "Body", "Translate", "feedback_body", "field_of", "install_errors", "openai_body",
           "openai_errors", "retry_after", "unexpected"]


class ApiError(Exception):
    """An answered error: its status, type and message, the request field at fault (OpenAI's `param`),
    OpenAI's `code`, the feedback API's `fix` (or its whole `details`) and any headers to send."""

    def __init__(self, status: int, kind: str, message: str, *, field: str | None = None,
                 code: str | None = None, fix: str = "", details: list[dict[str, str]] | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field, self.code = status, kind, message, field, code
        self.fix, self.details, self.headers = fix, details, headers


Body = Callable[[ApiError], dict[str, Any]]
Translate = Callable[[Request, Exception], ApiError]


def openai_body(error: ApiError) -> dict[str, Any]:
    """The OpenAI wire format."""
    return {"error": {"message": error.message, "type": error.kind, "param": error.field, "code": error.code}}


def feedback_body(error: ApiError) -> dict[str, Any]:
    """The feedback API's wire format: with a `fix`, one detail naming the field and the fix."""
    details = error.details
    if details is None and error.fix:
        details = [{"field": error.field or "", "message": error.message, "fix": error.fix}]
    return {"type": error.kind, "message": error.message, "details": details or []}


def install_errors(app: FastAPI, body: Body, translations: Mapping[type[Exception], Translate]) -> None:
    """Answer every exception type in `translations` (the nearest class wins, as Starlette picks
    handlers) with the `ApiError` its translation makes, written by `body`. An `ApiError` is answered
    as it is, unless `translations` translates it too."""

    def handler(translate: Translate) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
        async def answer(request: Request, exc: Exception) -> JSONResponse:
            error = translate(request, exc)
            return JSONResponse(status_code=error.status, content=body(error), headers=error.headers)

        return answer

    table: dict[type[Exception], Translate] = {ApiError: _as_is, **translations}
    for kind, translate in table.items():
        app.add_exception_handler(kind, handler(translate))


def _as_is(request: Request, exc: Exception) -> ApiError:
    assert isinstance(exc, ApiError)
    return exc


def field_of(error: Mapping[str, Any]) -> str:
    """The dotted field a pydantic error is about (`(body)` for the body as a whole)."""
    return ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "(body)"


def retry_after(exc: RateLimited) -> int:
    """The whole seconds a client over its rate is told to wait (at least 1)."""
    return max(1, round(exc.retry_after + 0.5))


def unexpected(logger: logging.Logger, kind: str, message: str) -> Translate:
    """Any other exception: logged with its traceback on `logger`, answered 500."""

    def translate(request: Request, exc: Exception) -> ApiError:
        logger.exception("unexpected error on %s", request.url.path)
        return ApiError(500, kind, message)

    return translate


def _openai_invalid(request: Request, exc: Exception) -> ApiError:
    """400 naming each field; the first is `param`."""
    assert isinstance(exc, RequestValidationError)
    parts, first = [], None
    for error in exc.errors():
        field = field_of(error)
        first = first or field
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if error.get("type") == "extra_forbidden":
            message = "is not supported by this server; remove it"
        elif error.get("type") == "missing":
            message = "is required"
        parts.append(f"{field}: {message}")
    return ApiError(400, "invalid_request_error", "; ".join(parts) or "invalid request", field=first)


def _openai_http(request: Request, exc: Exception) -> ApiError:
    """Starlette's own answers (404, 405; 413 for a streamed body over the limit), with their headers."""
    assert isinstance(exc, StarletteHTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    code = "request_too_large" if exc.status_code == 413 else None
    return ApiError(exc.status_code, kind, str(exc.detail), code=code, headers=exc.headers)


def _openai_rate_limited(request: Request, exc: Exception) -> ApiError:
    assert isinstance(exc, RateLimited)
    retry = retry_after(exc)
    return ApiError(429, "requests", f"{exc}; retry after {retry}s", code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry)})


def openai_errors(logger: logging.Logger) -> dict[type[Exception], Translate]:
    """What the OpenAI-compatible apps translate alike: invalid requests (400), Starlette's answers,
    a key over its rate (429 with Retry-After), the auth refusals (401, 403) and the unexpected (500,
    logged on `logger`)."""
    return {
        RequestValidationError: _openai_invalid,
        StarletteHTTPException: _openai_http,
        RateLimited: _openai_rate_limited,
        Unauthenticated: lambda request, exc: ApiError(401, "authentication_error", str(exc),
                                                       code="invalid_api_key"),
        Forbidden: lambda request, exc: ApiError(403, "permission_error", str(exc),
                                                 code="insufficient_scope"),
        Exception: unexpected(logger, "server_error", "unexpected error; see the service logs"),
    }
