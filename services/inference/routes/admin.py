"""Admin: load adapter versions (hot swap), move aliases, unload drained versions. Scope `admin`."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from online_rl.serving import AdapterInfo
from online_rl.serving.errors import AdapterUnavailable
from services.inference.deps import AdminDep, ServiceDep
from services.inference.schemas import AdapterIn, AliasIn

__all__ = ["router"]

router = APIRouter(prefix="/admin", tags=["admin"])
logger = logging.getLogger(__name__)


def _info(info: AdapterInfo, aliases: dict[str, str]) -> dict[str, Any]:
    return {"name": info.name, "sha256": info.sha256, "source": info.source, "loaded_at": info.loaded_at,
            "in_flight": info.in_flight, "draining": info.draining,
            "aliases": sorted(a for a, t in aliases.items() if t == info.name),
            "base_model": info.manifest.base_model, "parent_version": info.manifest.parent_version}


@router.get("/adapters")
async def list_adapters(service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Loaded versions with their sha256, source, aliases and requests in flight."""
    manager = service.core.adapters
    aliases = manager.aliases()
    return {"adapters": [_info(i, aliases) for i in manager.versions()], "aliases": aliases}


@router.post("/adapters", status_code=201, responses={
    409: {"description": "The name already names other weights."},
    422: {"description": "The adapter failed verification (hash, format, base model)."}})
async def load_adapter(body: AdapterIn, service: ServiceDep, admin: AdminDep) -> dict[str, Any]:
    """Load and verify a version, then (with `alias`) point the alias at it: a hot swap. Requests in
    flight finish on the version they started with. A failure leaves serving unchanged."""
    manager = service.core.adapters
    try:
        info = await manager.load(body.source, name=body.name, alias=body.alias)
    except AdapterUnavailable as exc:  # retryable, but the operator must see why (a full disk)
        logger.warning("adapter load of %s failed: %s", body.source, exc)
        raise
    return _info(info, manager.aliases())


@router.delete("/adapters/{name}", status_code=204, responses={
    409: {"description": "An alias still points at it, or requests did not drain in time."}})
async def unload_adapter(name: str, service: ServiceDep, admin: AdminDep,
                         timeout_s: Annotated[float, Query(gt=0, le=3600)] = 60.0) -> Response:
    """Stop new requests on a version, wait for those in flight, then free it."""
    await service.core.adapters.unload(name, timeout_s=timeout_s)
    return Response(status_code=204)


@router.put("/aliases/{alias}")
async def set_alias(alias: str, body: AliasIn, service: ServiceDep, admin: AdminDep) -> dict[str, str]:
    """Point `alias` at a loaded version (atomically; in-flight requests keep their version)."""
    await service.core.adapters.set_alias(alias, body.version)
    return {"alias": alias, "version": body.version}


@router.delete("/aliases/{alias}", status_code=204)
async def delete_alias(alias: str, service: ServiceDep, admin: AdminDep) -> Response:
    await service.core.adapters.delete_alias(alias)
    return Response(status_code=204)
