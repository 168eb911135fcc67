"""GET /healthz, /readyz, /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from services.inference.deps import ServiceDep

__all__ = ["router"]

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(service: ServiceDep) -> JSONResponse:
    """Ready when the engine is up. A bus outage does not make the service unready (answers keep
    flowing and interactions are buffered); it is reported here and in /metrics."""
    log = service.core.log
    body: dict[str, object] = {"status": "ready", "engine": service.core.engine.name,
                               "model": service.core.base_model}
    if log is not None:
        body |= {"interaction_log_buffered": log.buffered, "interaction_log_error": log.last_error}
    return JSONResponse(body)


@router.get("/metrics")
async def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics."""
    return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)
