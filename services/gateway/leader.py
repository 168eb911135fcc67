"""Role `controller`: run the rollout while this process holds the controller lease.

Every third of `gateway.lease_duration_s` the lease is taken or renewed (a renewal that takes longer
than that counts as failed). A renewal that succeeded keeps this process acting for two thirds of the
duration from when it began, so a holder whose renewals fail (the API server slow or away) stops
before any other candidate may take the lease over; `loop` is None from then on, and every route and
tick checks it. On taking the lease the controller builds the rollout loop over the state on the bus
(`BusRolloutStore`: where the previous holder left it), reads the proxies' health reports into the
guardrails and ticks; a heartbeat (the champion, who leads, where to reach it) goes out on taking
over, every renewal period and after each person's control. On losing the lease it stops. The
standbys route requests as proxies meanwhile.
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
        self.renew_s = settings.gateway.lease_duration_s / 3
        self.since: float | None = None  # when this process took the lease
        self.takeovers = 0
        self._loop: RolloutLoop | None = None
        self._valid_until = 0.0  # monotonic: acting past it could overlap another holder
        self._store: BusRolloutStore | None = None
        self._health: RolloutFeed | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._taking: asyncio.Task[None] | None = None
        self._ticked = False

    @property
    def loop(self) -> RolloutLoop | None:
        """The rollout loop, while this process holds a lease it renewed in time; else None."""
        if self._loop is not None and time.monotonic() < self._valid_until:
            return self._loop
        return None

    async def run(self) -> None:
        try:
            while True:
                started = time.monotonic()
                try:
                    await self._renew(started)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a malformed Lease, a failed step-down: logged, retried next period
                    logger.exception("the controller lease loop failed; retrying")
                await asyncio.sleep(max(0.0, self.renew_s - (time.monotonic() - started)))
        finally:
            await self._step_down()
            await asyncio.to_thread(self.lease.release)

    async def _renew(self, started: float) -> None:
        try:
            held = await asyncio.wait_for(asyncio.to_thread(self.lease.acquire), timeout=self.renew_s)
        except TimeoutError:
            held = False
        if held:
            self._valid_until = started + 2 * self.renew_s
            if self._loop is None and self._taking is None:
                self._taking = asyncio.create_task(self._take_over(), name="orl-controller-take-over")
        elif self._loop is not None or self._taking is not None:
            logger.warning("controller %s could not renew the lease; standing by", self.lease.identity,
                           extra={"event": "controller_stepped_down", "controller": self.lease.identity})
            await self._step_down()

    async def _take_over(self) -> None:
        settings = self.settings
        store = BusRolloutStore(settings.rollout_dir, self.bus, settings.topics)
        loop: RolloutLoop | None = None
        health: RolloutFeed | None = None
        try:
            loop = await asyncio.to_thread(RolloutLoop, settings, self.pool, self.bus, self.client, self.gate,
                                           time.time, store)
            target = loop
            health = RolloutFeed(self.bus, settings.topics,
                                 on_health=lambda v, at, s, ok: target.health.record(v, s, ok, at))
            health.start()
            loop.start_feed()
            champion = await asyncio.to_thread(alias_version, self.client, settings.mlflow.registered_model,
                                               "champion")
            # Proxies relay the admin API to whoever the newest heartbeat names: say so before ticking
            # (the loop's first pass loads that champion into the replicas and follows it from then on).
            await asyncio.to_thread(store.heartbeat, champion, self.lease.identity, self.url)
        except BaseException as exc:  # the bus or MLflow away, or stepping down: nothing half-started stays
            if loop is not None:
                await asyncio.to_thread(loop.stop_feed)
            if health is not None:
                await asyncio.to_thread(health.stop)
            await asyncio.to_thread(store.close)
            self._taking = None
            if isinstance(exc, asyncio.CancelledError):
                raise
            logger.exception("controller %s could not take the rollout over; trying again",
                             self.lease.identity)
            return
        self._loop, self._store, self._health = loop, store, health
        self.since = time.time()
        self.takeovers += 1
        self._taking = None
        state = loop.controller.state
        where = (f"rollout {state.rollout_id} ({state.status}, weight {state.weight})" if state
                 else "no rollout")
        logger.info("controller %s took the lease; the rollout continues from %s", self.lease.identity, where,
                    extra={"event": "controller_took_over", "controller": self.lease.identity})
        self._tasks = [asyncio.create_task(self._tick_forever(loop), name="orl-rollout-loop"),
                       asyncio.create_task(self._beat_forever(), name="orl-controller-heartbeat")]

    async def _tick_forever(self, loop: RolloutLoop) -> None:
        while True:
            if self.loop is loop:  # only while the lease is surely ours
                try:
                    await loop.tick()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # never let the loop die
                    logger.exception("rollout tick failed")
                    loop.last_error = f"{type(exc).__name__}: {exc}"
                self._ticked = True  # the loop follows MLflow's champion from its first pass on
                await self.beat()
            await asyncio.sleep(loop.config.interval_s)

    async def _beat_forever(self) -> None:
        while True:
            await self.beat()
            await asyncio.sleep(min(self.renew_s, self.settings.gateway.rollout.interval_s))

    async def beat(self) -> None:
        """Publish the heartbeat now (also after a person's control: a promotion names its champion at
        once, so proxies do not route by the old one until the next tick)."""
        loop, store = self.loop, self._store
        if loop is None or store is None or not self._ticked:  # (the take-over published one already)
            return
        try:
            await asyncio.to_thread(store.heartbeat, loop.champion, self.lease.identity, self.url)
        except Exception as exc:
            logger.warning("could not publish the controller's heartbeat: %s", exc)

    async def _step_down(self) -> None:
        self._valid_until = 0.0
        running = [*self._tasks, *([self._taking] if self._taking is not None else [])]
        self._tasks, self._taking = [], None
        for task in running:
            task.cancel()
        for task in running:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        loop, self._loop, self.since, self._ticked = self._loop, None, None, False
        if loop is not None:
            await asyncio.to_thread(loop.stop_feed)
        health, self._health = self._health, None
        if health is not None:
            await asyncio.to_thread(health.stop)
        store, self._store = self._store, None
        if store is not None:
            await asyncio.to_thread(store.close)
