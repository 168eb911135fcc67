"""GET /healthz, /readyz and /metrics, the same three operations routes in every app.

`/healthz` (the process is alive) and `/metrics` (the app's `state.service.metrics.registry`, in
Prometheus' text format) are the same everywhere; what makes an app ready is its own, so each app
passes its `readyz` endpoint. Knows nothing of what any app measures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["health_router"]


async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


async def metrics(request: Request) -> Response:
    """Prometheus metrics."""
    registry = request.app.state.service.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def health_router(readyz: Callable[..., Any],
                  responses: dict[int | str, dict[str, Any]] | None = None) -> APIRouter:
    """The operations routes, with the app's `readyz` (its docstring is the route's description;
    `responses` documents its other answers)."""
    router = APIRouter(tags=["operations"])
    router.add_api_route("/healthz", healthz, methods=["GET"])
    router.add_api_route("/readyz", readyz, methods=["GET"], responses=responses)
    router.add_api_route("/metrics", metrics, methods=["GET"])
    return router
