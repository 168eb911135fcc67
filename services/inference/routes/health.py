"""GET /healthz, /readyz, /metrics (`services.common.health`); ready here means the engine is up."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from services.common.health import health_router
from services.inference.deps import ServiceDep

__all__ = ["router"]


async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when the engine is up. A bus outage does not make the service unready (answers keep
    flowing and interactions are buffered); it is reported here and in /metrics."""
    log = service.core.log
    body: dict[str, object] = {"status": "ready", "engine": service.core.engine.name,
                               "model": service.core.base_model}
    if log is not None:
        body |= {"interaction_log_buffered": log.buffered, "interaction_log_error": log.last_error}
    return JSONResponse(body)


router = health_router(readyz)
