"""The OpenAI-compatible pass-through: POST /v1/chat/completions, /v1/completions; GET /v1/models.

For each request the rollout picks the version (sticky per user; `X-ORL-Version` forces one for
testing), the body's `model` is set to that version's serving name and `user` to the user id (so
the replica's logged interaction names both), and the request is relayed — streamed answers byte
for byte. The answer names the version in `X-ORL-Version` (and the replica's body field `model`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import aiohttp
from fastapi import APIRouter, Header, Request, Response
from fastapi.responses import StreamingResponse

from online_rl.ingest import Forbidden, KeyInfo
from online_rl.rollout import ReplicaUnavailable, Route
from services.common.errors import ApiError
from services.gateway.deps import CallerDep, ServiceDep
from services.gateway.service import GatewayService

__all__ = ["router"]

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["completions"])
_RELAYED = ("x-request-id", "x-model-version")


@router.post("/chat/completions")
async def chat_completions(request: Request, service: ServiceDep, caller: CallerDep,
                           x_orl_version: Annotated[str | None, Header()] = None,
                           x_orl_user: Annotated[str | None, Header()] = None) -> Response:
    """Answer a chat with the version the rollout assigns to the user (a key bound to a user: that
    user; else the `user` field, else the `X-ORL-User` header, else the API key).
    `X-ORL-Version: champion|challenger|<name>` forces one (keys with the `tester` scope)."""
    return await _relay(service, request, "/v1/chat/completions", caller, x_orl_version, x_orl_user)


@router.post("/completions")
async def completions(request: Request, service: ServiceDep, caller: CallerDep,
                      x_orl_version: Annotated[str | None, Header()] = None,
                      x_orl_user: Annotated[str | None, Header()] = None) -> Response:
    """Continue a raw prompt with the version the rollout assigns to the user."""
    return await _relay(service, request, "/v1/completions", caller, x_orl_version, x_orl_user)


@router.get("/models")
async def models(service: ServiceDep, caller: CallerDep) -> Response:
    """The models a replica serves (base model, loaded versions, aliases)."""
    upstream = await service.pool.send("GET", "/v1/models")
    data = upstream.body if upstream.body is not None else await upstream.response.read()
    upstream.response.release()
    return Response(data, status_code=upstream.response.status, media_type="application/json")


def _body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise ApiError(400, "invalid_request_error", f"the body is not JSON ({exc}); send an OpenAI "
                       "completion request as a JSON object") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request_error", "the body must be a JSON object (an OpenAI request)")
    return body


def _route(service: GatewayService, body: dict[str, Any], caller: KeyInfo, override: str | None,
           header_user: str | None) -> tuple[Route, str]:
    if override and not caller.allows("tester"):
        raise ApiError(403, "permission_error", "X-ORL-Version needs a key with the 'tester' scope "
                       "(forcing a version is for testing; real users follow the rollout)",
                       field="X-ORL-Version", code="insufficient_scope")
    named = body.get("user") or header_user
    if named is not None and (not isinstance(named, str) or len(named) > 256):
        raise ApiError(400, "invalid_request_error", "user must be a string of at most 256 characters "
                       "(the id the traffic split is sticky on)", field="user")
    try:  # a key bound to one user is served as that user: it cannot pick another's arm
        user = caller.user_for(named) or f"key-{caller.key_id}"
    except Forbidden as exc:
        raise ApiError(403, "permission_error", f"{exc}; leave `user` out (the key's own user is "
                       "used) or send that user's key", field="user", code="user_mismatch") from exc
    try:
        return service.routing.route(user, override), user
    except ValueError as exc:
        raise ApiError(400, "invalid_request_error", str(exc), field="X-ORL-Version") from exc


async def _relay(service: GatewayService, request: Request, path: str, caller: KeyInfo,
                 override: str | None, header_user: str | None) -> Response:
    started = time.perf_counter()
    body = _body(await request.body())
    route, user = _route(service, body, caller, override, header_user)
    body["model"], body["user"] = route.model, user
    try:
        upstream = await service.pool.send("POST", path, json.dumps(body).encode(),
                                           {"content-type": "application/json"})
    except ReplicaUnavailable:
        _done(service, route, started, False)
        raise
    if upstream.attempts > 1:
        service.metrics.failovers.inc(upstream.attempts - 1)
    response = upstream.response
    headers = {"X-ORL-Version": route.model, "X-ORL-Arm": route.arm}
    state = service.routing.state
    if state is not None and state.active:
        headers["X-ORL-Rollout"] = state.rollout_id
    headers |= {k: response.headers[k] for k in _RELAYED if k in response.headers}
    content_type = response.headers.get("content-type", "application/json")
    if upstream.exhausted and response.status == 404:  # the version is on no replica (yet)
        response.release()
        _done(service, route, started, False)
        raise ApiError(503, "service_unavailable", f"{route.model} is not loaded on any replica yet; retry",
                       code="version_unavailable")
    if response.status != 200 or not content_type.startswith("text/event-stream"):
        try:
            data = upstream.body if upstream.body is not None else await response.read()
        finally:
            response.release()
        _done(service, route, started, response.status < 500)
        return Response(data, status_code=response.status, headers=headers, media_type=content_type)
    return StreamingResponse(_stream(service, route, response, started), media_type="text/event-stream",
                             headers=headers)


async def _stream(service: GatewayService, route: Route, response: aiohttp.ClientResponse,
                  started: float) -> AsyncIterator[bytes]:
    ok = True
    try:
        async for chunk in response.content.iter_any():
            if b'data: {"error"' in chunk:
                ok = False  # the replica reported a failure inside the stream
            yield chunk
    except (TimeoutError, aiohttp.ClientError) as exc:  # too late to move the request
        ok = False
        logger.warning("stream from %s broke: %s", route.model, exc)
        payload = {"error": {"message": "the replica stopped mid-answer; retry", "type": "server_error"}}
        yield b"data: " + json.dumps(payload).encode() + b"\n\n"
    finally:
        response.release()
        _done(service, route, started, ok)


def _done(service: GatewayService, route: Route, started: float, ok: bool) -> None:
    elapsed = time.perf_counter() - started
    if not route.forced:  # a tester's forced requests are not the arm's evidence
        service.routing.record(route.model, elapsed, ok)
    service.metrics.requests.labels(route.model, route.arm, "ok" if ok else "error").inc()
    service.metrics.latency.labels(route.arm).observe(elapsed)
