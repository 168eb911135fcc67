"""The inference replicas behind the gateway: pooled connections, failover before the first byte,
and the admin calls that load and unload adapter versions on every replica.

A request is opened on one replica (round robin, replicas that just refused a connection last);
while nothing has come back to the client it may move to the next replica: on a connection error,
a timeout before the answer's headers, a 5xx answer, or a 404 `model_not_found` (a replica that
restarted and has not reloaded the version yet). Only a failed connection makes a replica skipped
for `cooldown_s`. A connection the replica drops before answering (a pooled one it was closing) is
first tried once more on the same replica. Once an answer starts it is the
client's.

A replica source `dns+http://host:port` stands for every address `host` resolves to, re-resolved by
`discover()` (the controller calls it every tick): a Kubernetes headless Service in front of an
autoscaled inference Deployment. Replicas that appear are loaded by the controller's next
reconcile; replicas that disappear stop being routed to.

Knows aiohttp and the inference service's wire contract (`/v1/...`, `/admin/adapters`); nothing about
FastAPI or rollouts. It implements the rollout's `Replicas` protocol (`online_rl/rollout/replicas.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from online_rl.rollout.errors import ReplicaRefusedVersion, ReplicaUnavailable
from online_rl.rollout.replicas import Replica

__all__ = ["ReplicaPool", "Upstream"]

logger = logging.getLogger(__name__)


@dataclass
class Upstream:
    """An open answer from `replica`; the caller reads or streams `response`, then releases it."""

    replica: Replica
    response: aiohttp.ClientResponse
    attempts: int
    body: bytes | None = None  # already read (an error answer read to decide on a retry)
    exhausted: bool = False  # every replica gave a retryable error; this is the last one


_FAILED = (aiohttp.ClientConnectionError, asyncio.TimeoutError)
# The replicas close a connection idle for 5 s (`timeout_keep_alive` in services/common/serve.py);
# the pool drops it first, so a request never goes out on a socket the replica is closing.
_IDLE_S = 2.0


async def _retryable(response: aiohttp.ClientResponse) -> tuple[bool, bytes | None]:
    if response.status >= 500:
        return True, await response.read()
    if response.status == 404:  # small error bodies: read to tell a retryable one apart
        body = await response.read()
        try:
            return json.loads(body).get("error", {}).get("code") == "model_not_found", body
        except ValueError:
            return False, body
    return False, None


_DNS = "dns+"


def _message(body: Any) -> str:
    """The error message of a replica's JSON error answer (or its start), for logs and the status page."""
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:500]
    return str(body)[:300] if body else ""


def _dns_source(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of a `dns+http://host:port` source."""
    parts = urlsplit(url[len(_DNS):])
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ValueError(f"gateway.replicas entry {url!r} is not dns+http://host:port (e.g. "
                         "dns+http://online-rl-inference-pods:8081 for a headless Service)")
    return parts.scheme, parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


class ReplicaPool:
    """Connections to every replica, shared by all requests (aiohttp: about half httpx's cost per
    relayed request, measured in bench/gateway.py's set-up)."""

    def __init__(self, urls: list[str], api_key: str | None, connect_timeout_s: float = 2.0,
                 read_timeout_s: float = 300.0, max_connections: int = 512, cooldown_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not urls:
            raise ValueError("gateway.replicas is empty: list the inference replicas' base URLs")
        self._fixed = [url.rstrip("/") for url in urls if not url.startswith(_DNS)]
        self._dns = [_dns_source(url) for url in urls if url.startswith(_DNS)]
        self.replicas = [Replica(url) for url in self._fixed]
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self.cooldown_s = cooldown_s
        self.clock = clock
        self._next = 0

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:  # made on the serving loop, at first use
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=_IDLE_S),
                timeout=self._timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def discover(self) -> bool:
        """Re-resolve the `dns+` sources; returns whether the replica set changed. A name that does
        not resolve counts as no replicas (a Service scaled to zero); the fixed URLs always stay."""
        if not self._dns:
            return False
        loop = asyncio.get_running_loop()
        urls = list(self._fixed)
        for scheme, host, port in self._dns:
            try:
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as exc:
                logger.warning("replica source %s://%s:%d does not resolve: %s", scheme, host, port, exc)
                continue
            for address in sorted({str(info[4][0]) for info in infos}):
                shown = f"[{address}]" if ":" in address else address
                urls.append(f"{scheme}://{shown}:{port}")
        known = {r.url: r for r in self.replicas}
        fresh = [known.get(url) or Replica(url) for url in dict.fromkeys(urls)]
        changed = [r.url for r in fresh] != [r.url for r in self.replicas]
        if changed:
            logger.info("replicas now: %s", ", ".join(r.url for r in fresh) or "none")
        self.replicas = fresh
        return changed

    def _order(self) -> list[Replica]:
        if not self.replicas:
            return []
        start = self._next % len(self.replicas)
        self._next += 1
        ring = self.replicas[start:] + self.replicas[:start]
        now = self.clock()
        return [r for r in ring if r.down_until <= now] + [r for r in ring if r.down_until > now]

    def _down(self, replica: Replica, why: str) -> None:
        replica.failures += 1
        replica.down_until = self.clock() + self.cooldown_s
        logger.warning("replica %s failed (%s); trying another", replica.url, why)

    async def send(self, method: str, path: str, content: bytes | None = None,
                   headers: Mapping[str, str] | None = None) -> Upstream:
        """Open `method path` on a replica, moving to the next while nothing has come back."""
        last: Upstream | None = None
        errors: list[str] = []
        for attempt, replica in enumerate(self._order(), 1):
            try:
                response = await self._open(replica, method, path, content, headers)
            except _FAILED as exc:
                self._down(replica, f"{type(exc).__name__}: {exc}")
                errors.append(f"{replica.url}: {type(exc).__name__}")
                continue
            try:
                retry, body = await _retryable(response)
            except _FAILED as exc:  # the error answer broke off: as good as no answer
                response.release()
                self._down(replica, f"{type(exc).__name__}: {exc}")
                continue
            if not retry:
                replica.down_until = 0.0
                return Upstream(replica, response, attempt, body)
            response.release()  # (an error answer is no reason to skip the replica for others)
            errors.append(f"{replica.url}: HTTP {response.status}")
            last = Upstream(replica, response, attempt, body, exhausted=True)
        if last is not None:  # every replica answered with an error: the client gets the last one
            return last
        raise ReplicaUnavailable(f"no inference replica answered ({'; '.join(errors)}); check that "
                                 "gateway.replicas lists running replicas")

    async def _open(self, replica: Replica, method: str, path: str, content: bytes | None,
                    headers: Mapping[str, str] | None) -> aiohttp.ClientResponse:
        """The answer's headers from `replica`. A connection that broke off before any answer (reset,
        closed: a pooled connection the replica had just closed) is tried once more before the replica
        counts as failed (the broken connection is discarded; the pool keeps none idle past 2 s, so
        the retry almost always opens a new one); a refused connection is not."""
        send = {**(headers or {}), **self._auth}
        try:
            return await self._client().request(method, replica.url + path, data=content, headers=send)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):  # never connected: the replica is down
                raise
            logger.info("replica %s dropped a connection (%s); once more on a new one", replica.url, exc)
            return await self._client().request(method, replica.url + path, data=content, headers=send)

    # -- admin: adapter versions on every replica -------------------------------------------------
    async def _admin(self, replica: Replica, method: str, path: str, timeout_s: float = 120.0,
                     **kwargs: Any) -> tuple[int, Any]:
        """(status, JSON body or text) of an admin call."""
        limit = aiohttp.ClientTimeout(total=timeout_s)
        async with self._client().request(method, replica.url + path, headers=self._auth, timeout=limit,
                                          **kwargs) as response:
            text = await response.text()
            try:
                return response.status, json.loads(text) if text else None
            except ValueError:
                return response.status, text

    async def loaded(self, replica: Replica) -> set[str]:
        """The adapter versions `replica` serves now."""
        status, body = await self._admin(replica, "GET", "/admin/adapters", timeout_s=10)
        if status != 200:
            raise ReplicaUnavailable(f"replica {replica.url} answered /admin/adapters with {status}: {body}")
        return {a["name"] for a in body["adapters"]}

    async def ensure_loaded(self, versions: Mapping[str, str]) -> dict[str, str]:
        """Load every version (serving name -> `models:/...` source) a reachable replica lacks.

        Returns the replicas that are missing some version for a passing reason (unreachable, a
        5xx): url -> why; they are reconciled on a later call, and requests fail over meanwhile.
        Raises `ReplicaRefusedVersion` when a replica refuses a version (bad weights, another base
        model: a 4xx), since no replica will ever serve it.
        """
        unreachable: dict[str, str] = {}

        async def one(replica: Replica) -> None:
            try:
                have = await self.loaded(replica)
                for name, source in versions.items():
                    if name in have:
                        continue
                    status, body = await self._admin(replica, "POST", "/admin/adapters",
                                                     json={"source": source, "name": name})
                    if status >= 500:  # with the replica's own words (a full disk, MLflow away)
                        unreachable[replica.url] = f"loading {name}: HTTP {status} {_message(body)}".rstrip()
                        continue
                    if status not in (200, 201):
                        raise ReplicaRefusedVersion(name, f"replica {replica.url} refused {name} from "
                                                          f"{source}: HTTP {status} {str(body)[:500]}")
                    logger.info("loaded %s on %s", name, replica.url)
            except (*_FAILED, ReplicaUnavailable) as exc:
                unreachable[replica.url] = f"{type(exc).__name__}: {exc}"

        await asyncio.gather(*(one(r) for r in self.replicas))
        return unreachable

    async def unload(self, name: str, timeout_s: float = 60.0) -> None:
        """Drain and free `name` on every replica (a replica without it is fine)."""

        async def one(replica: Replica) -> None:
            try:
                status, body = await self._admin(replica, "DELETE", f"/admin/adapters/{name}",
                                                 timeout_s=timeout_s + 10,
                                                 params={"timeout_s": str(timeout_s)})
                if status not in (204, 404):
                    logger.warning("replica %s kept %s: HTTP %d %s", replica.url, name, status,
                                   str(body)[:300])
            except _FAILED as exc:
                logger.warning("could not unload %s on %s: %s", name, replica.url, exc)

        await asyncio.gather(*(one(r) for r in self.replicas))
