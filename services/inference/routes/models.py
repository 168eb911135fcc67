"""GET /v1/models: the base model, every loaded adapter version, and the aliases."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from services.inference.deps import CallerDep, ServiceDep

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models")
async def list_models(service: ServiceDep, caller: CallerDep) -> dict[str, Any]:
    """What `model` can name: the base id, a version (`<registered>-v<n>`), or an alias of one."""
    adapters = service.core.adapters
    base = adapters.base_model
    data: list[dict[str, Any]] = [{"id": base, "object": "model", "created": 0, "owned_by": "online-rl",
                                   "root": base, "parent": None}]
    for info in adapters.versions():
        if info.draining:
            continue
        data.append({"id": info.name, "object": "model", "created": int(info.loaded_at),
                     "owned_by": "online-rl", "root": base, "parent": base, "sha256": info.sha256})
    for alias, target in sorted(adapters.aliases().items()):
        data.append({"id": alias, "object": "model", "created": 0, "owned_by": "online-rl",
                     "root": base, "parent": target, "alias_of": target})
    return {"object": "list", "data": data}
