"""Role `controller`: run the rollout while this process holds the controller lease.

Every third of `gateway.lease_duration_s` the lease is taken or renewed. On taking it the controller
builds the rollout loop over the state on the bus (`BusRolloutStore`: where the previous holder left
it), reads the proxies' health reports into the guardrails and ticks; after each tick it publishes
its heartbeat (the champion, who leads, where to reach it). On losing it (a renewal failed) it stops
at once. The standbys route requests as proxies meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from mlflow import MlflowClient

from online_rl.bus import Bus
from online_rl.config import Settings
from online_rl.registry import alias_version
from online_rl.rollout.driver import Gate, RolloutLoop
from online_rl.rollout.lease import Lease
from online_rl.rollout.shared import BusRolloutStore, RolloutFeed
from services.gateway.replicas import ReplicaPool

__all__ = ["Leadership"]

logger = logging.getLogger(__name__)


class Leadership:
    def __init__(self, settings: Settings, pool: ReplicaPool, bus: Bus, client: MlflowClient,
                 gate: Gate | None, lease: Lease, url: str) -> None:
        self.settings, self.pool, self.bus, self.client, self.gate = settings, pool, bus, client, gate
        self.lease, self.url = lease, url
        self.loop: RolloutLoop | None = None
        self.since: float | None = None  # when this process took the lease
        self.takeovers = 0
        self._store: BusRolloutStore | None = None
        self._health: RolloutFeed | None = None
        self._ticks: asyncio.Task[None] | None = None

    @property
    def leading(self) -> bool:
        return self.loop is not None

    async def run(self) -> None:
        renew_s = self.settings.gateway.lease_duration_s / 3
        try:
            while True:
                held = await asyncio.to_thread(self.lease.acquire)
                if held and self.loop is None:
                    try:
                        await self._take_over()
                    except Exception:  # the bus or MLflow away: give the lease back and try again
                        logger.exception("taking over the rollout failed")
                        await self._step_down()
                        await asyncio.to_thread(self.lease.release)
                elif not held and self.loop is not None:
                    logger.warning("controller %s lost the lease; standing by", self.lease.identity)
                    await self._step_down()
                await asyncio.sleep(renew_s)
        finally:
            await self._step_down()
            await asyncio.to_thread(self.lease.release)

    async def _take_over(self) -> None:
        settings = self.settings
        store = self._store = BusRolloutStore(settings.rollout_dir, self.bus, settings.topics)
        loop = await asyncio.to_thread(RolloutLoop, settings, self.pool, self.bus, self.client, self.gate,
                                       time.time, store)
        health = self._health = RolloutFeed(self.bus, settings.topics,
                                            on_health=lambda v, at, s, ok: loop.health.record(v, s, ok, at))
        health.start()
        loop.start_feed()
        # Proxies relay the admin API to whoever the newest heartbeat names: say so before the first tick.
        champion = await asyncio.to_thread(alias_version, self.client, settings.mlflow.registered_model,
                                           "champion")
        await asyncio.to_thread(store.heartbeat, champion, self.lease.identity, self.url)
        self.loop, self.since = loop, time.time()
        self.takeovers += 1
        state = loop.controller.state
        where = (f"rollout {state.rollout_id} ({state.status}, weight {state.weight})" if state
                 else "no rollout")
        logger.info("controller %s took the lease; the rollout continues from %s", self.lease.identity, where,
                    extra={"event": "controller_took_over", "controller": self.lease.identity})
        self._ticks = asyncio.create_task(self._tick_forever(loop, store), name="orl-rollout-loop")

    async def _tick_forever(self, loop: RolloutLoop, store: BusRolloutStore) -> None:
        while True:
            try:
                await loop.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the loop die
                logger.exception("rollout tick failed")
                loop.last_error = f"{type(exc).__name__}: {exc}"
            try:
                await asyncio.to_thread(store.heartbeat, loop.champion, self.lease.identity, self.url)
            except Exception as exc:
                logger.warning("could not publish the controller's heartbeat: %s", exc)
            await asyncio.sleep(loop.config.interval_s)

    async def _step_down(self) -> None:
        task, self._ticks = self._ticks, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        loop, self.loop, self.since = self.loop, None, None
        if loop is not None:
            await asyncio.to_thread(loop.stop_feed)
        health, self._health = self._health, None
        if health is not None:
            await asyncio.to_thread(health.stop)
        store, self._store = self._store, None
        if store is not None:
            store.close()
