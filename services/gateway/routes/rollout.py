"""The rollout control API (scope `admin`): status, history, reward series, start, pause, resume,
set the weight, promote, roll back. Every change is audited with the caller's key id.

Where this process does not run the rollout (a proxy; a controller standing by) the call is relayed,
with the caller's key, to the controller that does, as its newest heartbeat on the bus names it; with
no controller alive the answer is 503 (the proxies keep routing by the last rollout state).
`POST /rollout/routes` is answered by this process: the arm and version it gives each user.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Depends, Query, Request, Response

from online_rl.ingest import KeyInfo
from online_rl.rollout.driver import RolloutLoop
from services.common.errors import ApiError
from services.gateway.deps import AdminDep, ServiceDep
from services.gateway.schemas import ReasonIn, RoutesIn, StartIn, WeightIn
from services.gateway.service import GatewayService

__all__ = ["ForwardToController", "forward", "router"]

router = APIRouter(prefix="/rollout", tags=["rollout"])


class ForwardToController(Exception):
    """This process does not run the rollout: the call goes to the one that does (`forward`)."""


def _loop(service: ServiceDep, admin: AdminDep) -> RolloutLoop:
    loop = service.loop
    if loop is None:
        raise ForwardToController()
    return loop


LoopDep = Annotated[RolloutLoop, Depends(_loop)]


RELAYED = "x-orl-relayed"


async def forward(request: Request, service: GatewayService) -> Response:
    """Relay the admin call to the controller that runs the rollout (`gateway.controller_url` when set,
    else where its heartbeat says), once: a relayed call is never relayed again."""
    feed, api = service.feed, service.settings.gateway
    heard = feed.controller if feed is not None else {}
    url = api.controller_url or heard.get("url")
    age = feed.heartbeat_age() if feed is not None else None
    limit = api.lease_duration_s + 3 * api.rollout.interval_s
    named_me = service.leadership is not None and heard.get("controller") == service.leadership.lease.identity
    if RELAYED in request.headers or named_me:  # this process was named, but no longer leads
        raise ApiError(503, "service_unavailable", "the rollout controller is changing hands; retry",
                       code="no_controller", headers={"Retry-After": "1"})
    if not isinstance(url, str) or age is None or age > limit:
        last = "never" if age is None else f"{age:.0f} s ago"
        raise ApiError(503, "service_unavailable", "no rollout controller is alive (last heard from "
                       f"{last}); the proxies keep routing by the last rollout state. Start a gateway "
                       "with role controller, or wait for a standby to take the lease", code="no_controller",
                       headers={"Retry-After": str(max(1, round(api.lease_duration_s / 3)))})
    headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
    headers[RELAYED] = "1"
    try:  # (a start loads adapters into every replica and may run the gate: minutes, not seconds)
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0, connect=api.connect_timeout_s)) as client:
            answer = await client.request(request.method, url.rstrip("/") + request.url.path,
                                          params=request.query_params, content=await request.body(),
                                          headers=headers)
    except httpx.HTTPError as exc:
        raise ApiError(503, "service_unavailable", f"the rollout controller at {url} did not answer ({exc}); "
                       "retry", code="no_controller", headers={"Retry-After": "1"}) from exc
    passed = {k: answer.headers[k] for k in ("retry-after",) if k in answer.headers}
    return Response(answer.content, status_code=answer.status_code, headers=passed,
                    media_type=answer.headers.get("content-type", "application/json"))


def _actor(admin: KeyInfo) -> str:
    return f"key:{admin.key_id}"


@router.get("")
async def status(loop: LoopDep, service: ServiceDep) -> dict[str, Any]:
    """The rollout now: versions, weight, step, reward and health per arm, the comparison."""
    return _status(loop, service)


async def _after_control(service: GatewayService) -> None:
    """A person's decision reaches the proxies at once: the state went out when it was saved, the
    champion it implies goes out now."""
    if service.leadership is not None:
        await service.leadership.beat()


def _status(loop: RolloutLoop, service: GatewayService) -> dict[str, Any]:
    body = loop.status()
    if service.leadership is not None:
        lead = service.leadership
        body["controller"] = {"identity": lead.lease.identity, "url": lead.url, "since": lead.since,
                              "takeovers": lead.takeovers}
    return body


@router.post("/routes")
async def routes(body: RoutesIn, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """The arm and version this process gives each of `users` now (every gateway process answers the
    same: the split is a function of the rollout state and the user id). Nothing is forwarded."""
    state = service.routing.state
    out = []
    for user in body.users:
        route = service.routing.route(user)
        out.append({"user": user, "arm": route.arm, "model": route.model})
    return {"rollout_id": state.rollout_id if state is not None else None, "routes": out}


@router.get("/history")
async def history(loop: LoopDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> dict[str, Any]:
    """The audit log, newest last: every decision with its actor, reason and evidence."""
    entries = await asyncio.to_thread(loop.controller.store.entries)  # (a read of the bus, off the loop)
    return {"entries": entries[-limit:]}


@router.get("/series")
async def series(loop: LoopDep) -> dict[str, Any]:
    """Reward per version over time (time buckets with 95% bands), for the page's chart."""
    return {"bucket_s": loop.tally.bucket_s, "versions": loop.series()}


@router.post("/start", status_code=201, responses={409: {"description": "A rollout is already running."}})
async def start(loop: LoopDep, service: ServiceDep, admin: AdminDep,
                body: StartIn | None = None) -> dict[str, Any]:
    """Start a rollout of `version` (default: MLflow's `challenger`), loading it into every replica."""
    await loop.control("start", _actor(admin), version=body.version if body else None)
    await _after_control(service)
    return _status(loop, service)


@router.post("/pause", responses={409: {"description": "No running rollout."}})
async def pause(loop: LoopDep, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Freeze the traffic split; the plan takes no decision until resumed."""
    await loop.control("pause", _actor(admin))
    await _after_control(service)
    return _status(loop, service)


@router.post("/resume", responses={409: {"description": "No paused rollout."}})
async def resume(loop: LoopDep, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Resume a paused rollout (the step's clock restarts)."""
    await loop.control("resume", _actor(admin))
    await _after_control(service)
    return _status(loop, service)


@router.put("/weight", responses={409: {"description": "No active rollout."}})
async def set_weight(body: WeightIn, loop: LoopDep, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Set the challenger's share of traffic by hand (the plan's next step may move it again)."""
    await loop.control("set_weight", _actor(admin), weight=body.weight)
    await _after_control(service)
    return _status(loop, service)


@router.post("/promote", responses={409: {"description": "No active rollout."}})
async def promote(loop: LoopDep, service: ServiceDep, admin: AdminDep,
                  body: ReasonIn | None = None) -> dict[str, Any]:
    """Promote the challenger now: MLflow's `champion` moves to it; everyone gets it."""
    reason = body.reason if body else None
    await loop.control("promote", _actor(admin), reason=reason)
    await _after_control(service)
    return _status(loop, service)


@router.post("/rollback", responses={409: {"description": "No active rollout."}})
async def rollback(loop: LoopDep, service: ServiceDep, admin: AdminDep,
                   body: ReasonIn | None = None) -> dict[str, Any]:
    """Roll the challenger back now: traffic to 0, `champion` kept, the adapter unloaded."""
    reason = body.reason if body else None
    await loop.control("rollback", _actor(admin), reason=reason)
    await _after_control(service)
    return _status(loop, service)
