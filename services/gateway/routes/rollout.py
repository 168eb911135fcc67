"""The rollout control API (scope `admin`): status, history, reward series, start, pause, resume,
set the weight, promote, roll back. Every change is audited with the caller's key id."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from online_rl.ingest import KeyInfo
from services.gateway.deps import AdminDep, ServiceDep
from services.gateway.schemas import ReasonIn, StartIn, WeightIn

__all__ = ["router"]

router = APIRouter(prefix="/rollout", tags=["rollout"])


def _actor(admin: KeyInfo) -> str:
    return f"key:{admin.key_id}"


@router.get("")
async def status(service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """The rollout now: versions, weight, step, reward and health per arm, the comparison."""
    return service.loop.status()


@router.get("/history")
async def history(service: ServiceDep, admin: AdminDep,
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> dict[str, Any]:
    """The audit log, newest last: every decision with its actor, reason and evidence."""
    return {"entries": service.loop.controller.store.entries()[-limit:]}


@router.get("/series")
async def series(service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Reward per version over time (time buckets with 95% bands), for the page's chart."""
    return {"bucket_s": service.loop.tally.bucket_s, "versions": service.loop.series()}


@router.post("/start", status_code=201, responses={409: {"description": "A rollout is already running."}})
async def start(service: ServiceDep, admin: AdminDep, body: StartIn | None = None) -> dict[str, Any]:
    """Start a rollout of `version` (default: MLflow's `challenger`), loading it into every replica."""
    await service.loop.control("start", _actor(admin), version=body.version if body else None)
    return service.loop.status()


@router.post("/pause", responses={409: {"description": "No running rollout."}})
async def pause(service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Freeze the traffic split; the plan takes no decision until resumed."""
    await service.loop.control("pause", _actor(admin))
    return service.loop.status()


@router.post("/resume", responses={409: {"description": "No paused rollout."}})
async def resume(service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Resume a paused rollout (the step's clock restarts)."""
    await service.loop.control("resume", _actor(admin))
    return service.loop.status()


@router.put("/weight", responses={409: {"description": "No active rollout."}})
async def set_weight(body: WeightIn, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Set the challenger's share of traffic by hand (the plan's next step may move it again)."""
    await service.loop.control("set_weight", _actor(admin), weight=body.weight)
    return service.loop.status()


@router.post("/promote", responses={409: {"description": "No active rollout."}})
async def promote(service: ServiceDep, admin: AdminDep, body: ReasonIn | None = None) -> dict[str, Any]:
    """Promote the challenger now: MLflow's `champion` moves to it; everyone gets it."""
    reason = body.reason if body else None
    await service.loop.control("promote", _actor(admin), reason=reason)
    return service.loop.status()


@router.post("/rollback", responses={409: {"description": "No active rollout."}})
async def rollback(service: ServiceDep, admin: AdminDep, body: ReasonIn | None = None) -> dict[str, Any]:
    """Roll the challenger back now: traffic to 0, `champion` kept, the adapter unloaded."""
    reason = body.reason if body else None
    await service.loop.control("rollback", _actor(admin), reason=reason)
    return service.loop.status()
