"""The gateway app: `create_app(settings)` builds it; `python -m services.gateway` serves it.

A thin layer over `online_rl.rollout`: the HTTP pass-through, the control API and the page here;
routing, the replicas and the rollout controller's loop in the library. `gateway.role` picks what the
process does: `all` routes and runs the rollout (one process, state in its folder); `proxy` routes by
the rollout state on the bus; `controller` routes as a proxy and runs the rollout while it holds the
controller lease (docs/deploy.md, "Scaling the gateway").
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from mlflow import MlflowClient

from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.rollout.driver import Gate, LogprobScorer, RolloutLoop
from online_rl.rollout.lease import make_lease
from online_rl.rollout.shared import HealthReporter, RolloutFeed
from online_rl.tracking import mlflow_client
from services.common.app import edge_app
from services.common.serve import require_api_keys
from services.gateway.errors import install_error_handlers
from services.gateway.leader import Leadership
from services.gateway.replicas import ReplicaPool
from services.gateway.routes import health, page, proxy, rollout
from services.gateway.routing import LocalRouting, Routing, SharedRouting
from services.gateway.service import GatewayService

__all__ = ["create_app"]


def create_app(settings: Settings, bus: Bus | None = None, gate: Gate | None = None) -> FastAPI:
    """The gateway over `settings.gateway.replicas`, reading joined samples from `bus` (default: the
    configured bus) and running the rollout controller against the configured MLflow store; `gate`
    (default: the local scorer when gateway.rollout.offpolicy_gate is on) judges before exposure."""
    require_api_keys(settings, "gateway")
    api = settings.gateway
    if api.upstream_api_key is None:
        raise ConfigError("gateway.upstream_api_key is empty: set the raw key (scopes inference,admin) the "
                          "gateway presents to the replicas, e.g. ORL_GATEWAY__UPSTREAM_API_KEY")
    own_bus = bus is None
    service_bus = bus or open_bus(settings)
    ensure_topics(service_bus, settings.topics, settings.bus.partitions)
    pool = ReplicaPool(api.replicas, api.upstream_api_key.get_secret_value(), api.connect_timeout_s,
                       api.read_timeout_s, api.max_connections, api.replica_cooldown_s)
    if api.role == "all":
        client, gate = _controller_parts(settings, gate)
        loop = RolloutLoop(settings, pool, service_bus, client, gate=gate)
        service = GatewayService(settings, pool, LocalRouting(loop), loop=loop)
        lifespan = _one_process(service, loop, pool, service_bus if own_bus else None)
    else:
        feed = RolloutFeed(service_bus, settings.topics)
        reporter = HealthReporter(service_bus, settings.topics, api.health_report_s)
        routing: Routing = SharedRouting(settings, feed, reporter)
        leadership = None
        if api.role == "controller":
            client, gate = _controller_parts(settings, gate)
            identity = f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"
            lease = make_lease(api.election, api.lock_file or settings.rollout_dir / "controller.lock",
                               api.lease_name, identity, api.lease_duration_s)
            leadership = Leadership(settings, pool, service_bus, client, gate, lease, _advertised(settings))
        service = GatewayService(settings, pool, routing, feed=feed, leadership=leadership)
        lifespan = _shared(service, feed, reporter, leadership, pool, service_bus if own_bus else None)

    return edge_app(
        "online-rl gateway",
        "The canary gateway: OpenAI-compatible completions routed to the champion or the challenger "
        "version (sticky per user), and the rollout control API. Authenticate with "
        "`Authorization: Bearer <API key>` (scope `inference`; `admin` for /rollout).",
        lifespan, service, install_error_handlers, [m.router for m in (proxy, rollout, page, health)],
        api.max_body_bytes,
    )


Lifespan = contextlib.AbstractAsyncContextManager[None]


def _controller_parts(settings: Settings, gate: Gate | None) -> tuple[MlflowClient, Gate | None]:
    """What runs a rollout needs besides the replicas and the bus: MLflow, and the off-policy gate
    (the given one, else the local scorer when gateway.rollout.offpolicy_gate is on)."""
    client = mlflow_client(settings)
    if gate is None and settings.gateway.rollout.offpolicy_gate:
        gate = LogprobScorer(settings.model_dir, client, settings.mlflow.registered_model)
    return client, gate


def _one_process(service: GatewayService, loop: RolloutLoop, pool: ReplicaPool,
                 own_bus: Bus | None) -> Callable[[FastAPI], Lifespan]:
    api = service.settings.gateway

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop.start_feed()
        # One pass before serving, so the champion is loaded and known before the first request
        # routes; if a replica is slow to load, serving starts anyway (the pass goes on, unhurried).
        first = asyncio.create_task(loop.tick(), name="orl-rollout-first-tick")
        await asyncio.wait({first}, timeout=api.startup_tick_s)
        task = asyncio.create_task(loop.run(), name="orl-rollout-loop")
        yield
        for running in (first, task):
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running
        await asyncio.to_thread(loop.stop_feed)
        await pool.close()
        if own_bus is not None:
            own_bus.close()

    return lifespan


def _shared(service: GatewayService, feed: RolloutFeed, reporter: HealthReporter,
            leadership: Leadership | None, pool: ReplicaPool,
            own_bus: Bus | None) -> Callable[[FastAPI], Lifespan]:
    api = service.settings.gateway

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        feed.start()
        reporter.start()
        # Route by the newest state on the bus from the first request on (it is short: one record
        # per key); serving starts anyway if the bus is slow, by no rollout until the state arrives.
        await asyncio.to_thread(feed.caught_up.wait, api.startup_tick_s)
        await pool.discover()
        tasks = [asyncio.create_task(_discover_forever(pool, api.rollout.interval_s), name="orl-discover")]
        if leadership is not None:
            tasks.append(asyncio.create_task(leadership.run(), name="orl-controller-lease"))
        yield
        for running in tasks:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await running
        await asyncio.to_thread(reporter.stop)
        await asyncio.to_thread(feed.stop)
        await pool.close()
        if own_bus is not None:
            own_bus.close()

    return lifespan


async def _discover_forever(pool: ReplicaPool, every_s: float) -> None:
    """Proxies follow the replicas' addresses themselves (the controller's loop does it for its own pool)."""
    while True:
        await asyncio.sleep(every_s)
        with contextlib.suppress(Exception):
            await pool.discover()


def _advertised(settings: Settings) -> str:
    api = settings.gateway
    if api.advertise_url:
        return api.advertise_url.rstrip("/")
    host = "127.0.0.1" if api.host in ("0.0.0.0", "::", "") else api.host
    return f"http://{host}:{api.port}"
