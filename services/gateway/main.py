"""The gateway app: `create_app(settings)` builds it; `python -m services.gateway` serves it.

A thin layer over `online_rl.rollout`: the HTTP pass-through, the control API and the page here;
routing, the replicas and the rollout controller's loop in the library.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from online_rl.bus import Bus, ensure_topics, open_bus
from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.rollout.driver import Gate, LogprobScorer, RolloutLoop
from online_rl.tracking import mlflow_client
from services.common.app import edge_app
from services.common.serve import require_api_keys
from services.gateway.errors import install_error_handlers
from services.gateway.replicas import ReplicaPool
from services.gateway.routes import health, page, proxy, rollout
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
    client = mlflow_client(settings)
    if gate is None and api.rollout.offpolicy_gate:
        gate = LogprobScorer(settings.model_dir, client, settings.mlflow.registered_model)
    loop = RolloutLoop(settings, pool, service_bus, client, gate=gate)
    service = GatewayService(settings, pool, loop)

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
        if own_bus:
            service_bus.close()

    return edge_app(
        "online-rl gateway",
        "The canary gateway: OpenAI-compatible completions routed to the champion or the challenger "
        "version (sticky per user), and the rollout control API. Authenticate with "
        "`Authorization: Bearer <API key>` (scope `inference`; `admin` for /rollout).",
        lifespan, service, install_error_handlers, [m.router for m in (proxy, rollout, page, health)],
        api.max_body_bytes,
    )
