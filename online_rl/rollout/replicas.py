"""The inference replicas behind the gateway: pooled connections, failover before the first byte,
and the admin calls that load and unload adapter versions on every replica.

A request is opened on one replica (round robin, replicas that just refused a connection last);
while nothing has come back to the client it may move to the next replica: on a connection error,
a timeout before the answer's headers, a 5xx answer, or a 404 `model_not_found` (a replica that
restarted and has not reloaded the version yet). Once an answer starts it is the client's.

Knows httpx and the inference service's wire contract (`/v1/...`, `/admin/adapters`); nothing about
FastAPI or rollouts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from online_rl.errors import OnlineRLError

__all__ = ["AdapterLoadFailed", "Replica", "ReplicaPool", "ReplicaUnavailable", "Upstream"]

log = logging.getLogger(__name__)


class ReplicaUnavailable(OnlineRLError):
    """No replica could take the request."""


class AdapterLoadFailed(OnlineRLError):
    """A replica refused to load an adapter version (its message says why)."""


@dataclass
class Replica:
    url: str
    down_until: float = 0.0
    failures: int = 0


@dataclass
class Upstream:
    """An open answer from `replica`; the caller reads or streams `response`, then closes it."""

    replica: Replica
    response: httpx.Response
    attempts: int


def _retryable(response: httpx.Response) -> bool:
    if response.status_code >= 500:
        return True
    if response.status_code == 404:
        try:
            return bool(response.json().get("error", {}).get("code") == "model_not_found")
        except ValueError:
            return False
    return False


class ReplicaPool:
    """Connections to every replica, shared by all requests."""

    def __init__(self, urls: list[str], api_key: str | None, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 300.0, max_connections: int = 512, cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("gateway.replicas is empty: list the inference replicas' base URLs")
        self.replicas = [Replica(url.rstrip("/")) for url in urls]
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(read_timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._next = 0

    async def close(self) -> None:
        await self.client.aclose()

    def _order(self) -> list[Replica]:
        start = self._next % len(self.replicas)
        self._next += 1
        ring = self.replicas[start:] + self.replicas[:start]
        now = self.clock()
        return [r for r in ring if r.down_until <= now] + [r for r in ring if r.down_until > now]

    def _down(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        replica.down_until = self.clock() + self.cooldown_s
        log.warning("replica %s failed (%s); trying another", replica.url, why)

    async def send(self, method: str, path: str, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None) -> Upstream:
        """Open `method path` on a replica, moving to the next while nothing has come back."""
        last: httpx.Response | None = None
        attempts = 0
        errors: list[str] = []
        for replica in self._order():
            attempts += 1
            request = self.client.build_request(method, replica.url + path, content=content,
                                                headers={**(headers or {}), **self._auth})
            try:
                response = await self.client.send(request, stream=True)
            except httpx.TransportError as exc:
                self._down(replica, f"{type(exc).__name__}: {exc}")
                errors.append(f"{replica.url}: {type(exc).__name__}")
                continue
            if response.status_code >= 500 or response.status_code == 404:
                await response.aread()  # small error bodies: read to tell a retryable one apart
            if not _retryable(response):
                replica.down_until = 0.0
                return Upstream(replica, response, attempts)
            await response.aclose()
            if response.status_code >= 500:
                self._down(replica, f"HTTP {response.status_code}")
            errors.append(f"{replica.url}: HTTP {response.status_code}")
            last = response
        if last is not None:  # every replica answered with an error: the client gets the last one
            return Upstream(self.replicas[0], last, attempts)
        raise ReplicaUnavailable(f"no inference replica answered ({'; '.join(errors)}); check that "
                                 "gateway.replicas lists running replicas")

    # -- admin: adapter versions on every replica -------------------------------------------------
    async def _admin(self, replica: Replica, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return await self.client.request(method, replica.url + path, headers=self._auth, **kwargs)

    async def loaded(self, replica: Replica) -> set[str]:
        """The adapter versions `replica` serves now."""
        response = await self._admin(replica, "GET", "/admin/adapters")
        response.raise_for_status()
        return {a["name"] for a in response.json()["adapters"]}

    async def ensure_loaded(self, versions: Mapping[str, str]) -> dict[str, str]:
        """Load every version (serving name -> `models:/...` source) a reachable replica lacks.

        Returns the replicas that are missing some version for a passing reason (unreachable, a
        5xx): url -> why; they are reconciled on a later call, and requests fail over meanwhile.
        Raises `AdapterLoadFailed` when a replica refuses a version (bad weights, another base
        model: a 4xx), since no replica will ever serve it.
        """
        unreachable: dict[str, str] = {}

        async def one(replica: Replica) -> None:
            try:
                have = await self.loaded(replica)
                for name, source in versions.items():
                    if name in have:
                        continue
                    response = await self._admin(replica, "POST", "/admin/adapters",
                                                 json={"source": source, "name": name})
                    if response.status_code >= 500:
                        unreachable[replica.url] = f"loading {name}: HTTP {response.status_code}"
                        continue
                    if response.status_code not in (200, 201):
                        raise AdapterLoadFailed(f"replica {replica.url} refused {name} from {source}: "
                                                f"HTTP {response.status_code} {response.text[:500]}")
                    log.info("loaded %s on %s", name, replica.url)
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                unreachable[replica.url] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(one(r) for r in self.replicas))
        return unreachable

    async def unload(self, name: str, timeout_s: float = 60.0) -> None:
        """Drain and free `name` on every replica (a replica without it is fine)."""

        async def one(replica: Replica) -> None:
            try:
                response = await self._admin(replica, "DELETE", f"/admin/adapters/{name}",
                                             params={"timeout_s": timeout_s}, timeout=timeout_s + 10)
                if response.status_code not in (204, 404):
                    log.warning("replica %s kept %s: HTTP %d %s", replica.url, name, response.status_code,
                                response.text[:300])
            except httpx.TransportError as exc:
                log.warning("could not unload %s on %s: %s", name, replica.url, exc)

        await asyncio.gather(*(one(r) for r in self.replicas))
