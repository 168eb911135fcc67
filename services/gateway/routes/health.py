"""GET /healthz, /readyz, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.gateway.deps import ServiceDep

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when at least one replica is not being skipped. Whether the controller's last pass went
    through is reported (its error, with details, is on the authenticated GET /rollout) but does not
    stop the routing of requests."""
    now = service.pool.clock()
    up = [r.url for r in service.pool.replicas if r.down_until <= now]
    body = {"status": "ready" if up else "unavailable", "replicas_up": len(up),
            "replicas": len(service.pool.replicas), "controller_ok": service.loop.last_error is None}
    return JSONResponse(body, status_code=200 if up else 503)


@router.get("/metrics")
async def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
