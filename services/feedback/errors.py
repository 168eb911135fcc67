"""The feedback API's errors in one place, in its wire format (`services.common.errors.feedback_body`):
each exception the API answers, the `ApiError` it becomes, and the reason it is counted under in
`orl_feedback_rejected_total`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.bus import BusError
from online_rl.ingest import Forbidden, OverLimit, RateLimited, Unauthenticated
from services.common.errors import ApiError, feedback_body, field_of, install_errors, retry_after, unexpected
from services.feedback.deps import WRITE_SCOPE

__all__ = ["install_error_handlers"]

logger = logging.getLogger(__name__)

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


def _count(request: Request, reason: str) -> None:
    request.app.state.service.metrics.rejected.labels(reason).inc()


def _validation_details(exc: RequestValidationError) -> list[dict[str, str]]:
    details = []
    for error in exc.errors():
        message = str(error.get("msg", "invalid"))
        fix = _FIXES.get(str(error.get("type", "")), "see the message")
        if fix == "see the message" and message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
            fix = message
        details.append({"field": field_of(error), "message": message, "fix": fix})
    return details


def _invalid(request: Request, exc: Exception) -> ApiError:
    """422 with a detail per field; the message names the first."""
    assert isinstance(exc, RequestValidationError)
    details = _validation_details(exc)
    _count(request, "invalid")
    first = details[0] if details else {"field": "(body)", "message": "invalid"}
    return ApiError(422, "validation_error", f"{first['field']}: {first['message']}", details=details)


def _refused(request: Request, exc: Exception) -> ApiError:
    assert isinstance(exc, ApiError)
    if exc.status == 422:
        _count(request, "invalid")
    return exc


def _unauthenticated(request: Request, exc: Exception) -> ApiError:
    _count(request, "unauthenticated")
    return ApiError(401, "unauthenticated", "missing or unknown API key",
                    fix="send `Authorization: Bearer <key>` with a key made by `online-rl keys new`")


def _forbidden(request: Request, exc: Exception) -> ApiError:
    """A key without the API's one scope (a key bound to another user is refused in the route, with
    the field that names the user)."""
    _count(request, "forbidden")
    return ApiError(403, "forbidden", f"this API key lacks the '{WRITE_SCOPE}' scope",
                    fix=f"use a key whose entry lists '{WRITE_SCOPE}' (or no scopes)")


def _rate_limited(request: Request, exc: Exception) -> ApiError:
    assert isinstance(exc, RateLimited)
    _count(request, "rate_limited")
    retry = retry_after(exc)
    return ApiError(429, "rate_limited", str(exc), fix=f"retry after {retry}s or send fewer events",
                    headers={"Retry-After": str(retry)})


def _bus_unavailable(request: Request, exc: Exception) -> ApiError:
    service = request.app.state.service
    _count(request, "bus_unavailable")
    retry = str(service.settings.feedback_api.retry_after_s)
    return ApiError(503, "bus_unavailable", f"the event bus did not confirm the write ({exc})",
                    fix=f"retry after {retry}s with the same event ids (a repeat is counted once)",
                    headers={"Retry-After": retry})


def _over_limit(request: Request, exc: Exception) -> ApiError:
    _count(request, "over_limit")
    return ApiError(422, "validation_error", str(exc), field="events",
                    fix="split the events over several requests")


def _http(request: Request, exc: Exception) -> ApiError:
    """Starlette's own answers (400 for a body that is no UTF-8, 404, 405, 413), with their headers."""
    assert isinstance(exc, StarletteHTTPException)
    kind, fix = "http_error", "see the API reference at /docs"
    if exc.status_code == 400:
        fix = "send a UTF-8 JSON body"
    elif exc.status_code == 413:
        kind, fix = "payload_too_large", "send fewer events per request"
    return ApiError(exc.status_code, kind, str(exc.detail), field="(body)", fix=fix, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    install_errors(app, feedback_body, {
        ApiError: _refused,
        RequestValidationError: _invalid,
        StarletteHTTPException: _http,
        Unauthenticated: _unauthenticated,
        Forbidden: _forbidden,
        RateLimited: _rate_limited,
        BusError: _bus_unavailable,
        OverLimit: _over_limit,
        Exception: unexpected(logger, "internal_error", "unexpected error; see the logs"),
    })
