"""The gateway's errors in one place, as OpenAI-style bodies: `{"error": {message, type, param, code}}`."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from online_rl.ingest import Forbidden, Unauthenticated
from online_rl.rollout import RolloutConflict
from online_rl.rollout.replicas import ReplicaUnavailable

__all__ = ["ApiError", "error_body", "install_error_handlers"]

logger = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str, param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.param, self.code = status, kind, message, param, code


def error_body(message: str, kind: str, param: str | None = None,
               code: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _answer(status: int, message: str, kind: str, param: str | None = None,
            code: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, kind, param, code))


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _answer(exc.status, exc.message, exc.kind, exc.param, exc.code)

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        field = ".".join(str(p) for p in first["loc"] if p != "body") or None
        return _answer(400, f"{field or 'body'}: {first['msg']}", "invalid_request_error", field)

    async def on_unauthenticated(request: Request, exc: Exception) -> JSONResponse:
        return _answer(401, str(exc), "authentication_error", code="invalid_api_key")

    async def on_forbidden(request: Request, exc: Exception) -> JSONResponse:
        return _answer(403, str(exc), "permission_error", code="insufficient_scope")

    async def on_conflict(request: Request, exc: Exception) -> JSONResponse:
        return _answer(409, str(exc), "conflict")

    async def on_unavailable(request: Request, exc: Exception) -> JSONResponse:
        logger.error("no replica for %s: %s", request.url.path, exc)
        return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                            content=error_body(str(exc), "service_unavailable"))

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
        return JSONResponse(status_code=exc.status_code, headers=exc.headers,
                            content=error_body(str(exc.detail), kind))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return _answer(500, "unexpected error; see the gateway's logs", "server_error")

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(Unauthenticated, on_unauthenticated)
    app.add_exception_handler(Forbidden, on_forbidden)
    app.add_exception_handler(RolloutConflict, on_conflict)
    app.add_exception_handler(ReplicaUnavailable, on_unavailable)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)
