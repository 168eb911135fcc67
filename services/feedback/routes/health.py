"""GET /healthz, /readyz, /metrics (`services.common.health`); ready here means the bus takes writes."""

from __future__ import annotations

import asyncio

from fastapi.responses import JSONResponse

from services.common.health import health_router
from services.feedback.deps import IngestDep

__all__ = ["router"]


async def readyz(service: IngestDep) -> JSONResponse:
    """Ready while the bus answers and no write failed in the last `write_timeout_s` seconds (a failed
    write makes the pod unready for that long, then the bus's answer decides: with no traffic at all, a
    pod becomes ready again as soon as the bus is back)."""
    try:
        await asyncio.wait_for(asyncio.to_thread(service.bus.partitions, service.topics.feedback), 3.0)
    except Exception as exc:  # any failure to reach the bus means not ready
        return JSONResponse(status_code=503, content={"status": "unavailable", "reason": str(exc)[:300]})
    if not service.writer.alive:
        return JSONResponse(status_code=503,
                            content={"status": "unavailable", "reason": "bus writer stopped"})
    error = service.writer.recent_error(service.settings.feedback_api.write_timeout_s)
    if error is not None:
        return JSONResponse(status_code=503, content={"status": "unavailable", "reason": error[:300]})
    return JSONResponse(content={"status": "ready"})


router = health_router(readyz, responses={503: {"description": "The bus does not accept writes."}})
