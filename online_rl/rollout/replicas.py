"""What the rollout needs of the inference replicas, as a protocol: list them, find new ones, say
which adapter versions each holds, load versions everywhere and unload them. The gateway's aiohttp
pool (`services/gateway/replicas.py`) is the implementation; tests may bring their own.

Pure: no HTTP client here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Replica", "Replicas"]


@dataclass
class Replica:
    url: str
    down_until: float = 0.0
    failures: int = 0


class Replicas(Protocol):
    """The replicas one gateway serves from."""

    replicas: list[Replica]
    clock: Callable[[], float]

    async def discover(self) -> bool:
        """Re-resolve the replica sources; True when the set of replicas changed."""
        ...

    async def loaded(self, replica: Replica) -> set[str]:
        """The adapter versions `replica` holds now."""
        ...

    async def ensure_loaded(self, versions: Mapping[str, str]) -> dict[str, str]:
        """Load `versions` (serving name -> source URI) on every replica that lacks them; the replicas
        that could not (url -> why). Raises `ReplicaRefusedVersion` when a replica refuses a version."""
        ...

    async def unload(self, name: str, timeout_s: float = 60.0) -> None:
        """Unload `name` from every replica (after its requests in flight have finished)."""
        ...
