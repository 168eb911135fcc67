"""GET /healthz, /readyz, /metrics (`services.common.health`); ready here means a replica is up."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from services.common.health import health_router
from services.gateway.deps import ServiceDep

__all__ = ["router"]


async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when at least one replica is not being skipped. Whether the controller's last pass went
    through is reported (its error, with details, is on the authenticated GET /rollout) but does not
    stop the routing of requests. A controller standing by (role controller, without the lease)
    answers 503 `standby`, so that the controller Service reaches only the one that leads."""
    now = service.pool.clock()
    up = [r.url for r in service.pool.replicas if r.down_until <= now]
    loop = service.loop
    body = {"status": "ready" if up else "unavailable", "replicas_up": len(up),
            "replicas": len(service.pool.replicas), "role": service.settings.gateway.role,
            "controller_ok": loop.last_error is None if loop is not None else None}
    if service.leadership is not None and loop is None:
        return JSONResponse(body | {"status": "standby"}, status_code=503)
    return JSONResponse(body, status_code=200 if up else 503)


router = health_router(readyz)
