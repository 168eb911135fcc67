"""The rollout controller's loop: from a new `challenger` in MLflow to a promoted or rolled-back one.

Every `interval_s` it:
1. reads MLflow's `champion` and `challenger` aliases; a new challenger (and no rollout running)
   is loaded into every replica first (hot swap), then, after the optional off-policy gate, its
   rollout starts at the plan's first weight;
2. reconciles the replicas: the champion and the running challenger are loaded everywhere (a
   replica that restarted gets them back); versions no longer needed are drained and unloaded once
   they have been unneeded for a whole interval (requests routed just before still finish);
3. judges the running step on the evidence since it began — reward per version from the joined
   samples on the bus (a feed thread tallies them), the gateway's error rate and p99 latency per
   version — and carries out the plan's decision.

It is the only writer of the rollout state: the gateway's routes read it for every request and
call its controls (pause, resume, weight, promote, roll back), serialised with the loop by one lock.
Knows the bus, MLflow, the replica pool and the controller; nothing about HTTP routes.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from online_rl.bus import Bus, BusError
from online_rl.config import RolloutConfig, Settings
from online_rl.events import TrainingSample, decode
from online_rl.registry import alias_version, serving_name
from online_rl.rollout.driver.decisions import RolloutController
from online_rl.rollout.errors import ReplicaRefusedVersion, ReplicaUnavailable, RolloutConflict
from online_rl.rollout.health import HealthLog
from online_rl.rollout.offpolicy import OffPolicyEstimate
from online_rl.rollout.plan import Evidence, Guardrails, RolloutPlan
from online_rl.rollout.replicas import Replicas
from online_rl.rollout.rewards import RewardTally
from online_rl.rollout.routing import Route, route_request
from online_rl.rollout.sequential import compare
from online_rl.rollout.state import RolloutState, RolloutStore

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["Gate", "RolloutLoop", "plan_from_config"]

logger = logging.getLogger(__name__)

# The off-policy gate: (challenger serving name, the champion's logged samples) -> the estimate.
Gate = Callable[[str, list[TrainingSample]], OffPolicyEstimate]


def plan_from_config(config: RolloutConfig) -> RolloutPlan:
    return RolloutPlan(
        steps=tuple(config.steps), min_samples=config.min_samples, margin=config.margin,
        max_step_samples=config.max_step_samples, max_step_s=config.max_step_s, on_timeout=config.on_timeout,
        alpha=config.alpha, tau=config.tau,
        guardrails=Guardrails(config.max_error_rate_increase, config.max_p99_latency_ratio, config.max_kl,
                              config.guardrail_min_requests))


class RolloutLoop:
    """One gateway's rollouts: state, evidence and the replicas' adapters."""

    def __init__(self, settings: Settings, pool: Replicas, bus: Bus, client: MlflowClient,
                 gate: Gate | None = None, clock: Callable[[], float] = time.time,
                 store: RolloutStore | None = None) -> None:
        self.config = settings.gateway.rollout
        self.registered = settings.mlflow.registered_model
        self.base_model = settings.model.name
        self.holdout = settings.gateway.holdout
        self.plan = plan_from_config(self.config)
        self.controller = RolloutController(client, self.registered, self.plan,
                                            store or RolloutStore(settings.rollout_dir), clock)
        self.pool, self.bus, self.client, self.gate, self.clock = pool, bus, client, gate, clock
        self.topics = settings.topics
        self.tally = RewardTally(self.config.reward_bucket_s)
        self.health = HealthLog(clock=clock)
        self.champion: str | None = None  # the version MLflow's `champion` names (refreshed each tick)
        self.samples_seen = 0
        self.last_error: str | None = None
        self._logged: dict[str, deque[TrainingSample]] = {}  # per version, newest: for the off-policy gate
        self._lock = asyncio.Lock()
        self._tally_lock = threading.Lock()
        self._stop = threading.Event()
        self._feed: threading.Thread | None = None
        self._unneeded_since: dict[str, float] = {}
        self.lagging: dict[str, str] = {}  # replica url -> why it lacks a version it should serve
        self.kl: dict[str, float] = {}  # version -> KL(champion || it), measured by the gate
        state = self.controller.state
        if state is not None and state.active and state.history:  # a restart: keep the gate's KL
            kl = (state.history[0].get("evidence") or {}).get("kl")
            if kl is not None:
                self.kl[state.challenger] = float(kl)

    # -- names --------------------------------------------------------------------------------------
    def name(self, version: str | None) -> str:
        """The serving name of a version number (None: the base model)."""
        return serving_name(self.registered, version) if version is not None else self.base_model

    def key(self, model: str) -> str:
        """The version key rewards and health are kept under (`base` for the base model)."""
        return "base" if model == self.base_model else model

    def route(self, user_id: str, override: str | None = None) -> Route:
        champion = self.name(self.champion) if self.champion is not None else None
        return route_request(self.controller.state, self.base_model, user_id, override, champion,
                             self.holdout)

    # -- the reward feed ------------------------------------------------------------------------------
    def start_feed(self) -> None:
        self._feed = threading.Thread(target=self._read_samples, name="orl-rollout-feed", daemon=True)
        self._feed.start()

    def stop_feed(self) -> None:
        self._stop.set()
        if self._feed is not None:
            self._feed.join(timeout=10)

    def _read_samples(self) -> None:
        # A throw-away group from the earliest offset: the tally is rebuilt from the topic at each
        # start, so a restarted gateway sees the evidence its predecessor saw. Nothing is committed.
        consumer = self.bus.consumer(f"orl-rollout-{uuid.uuid4().hex[:12]}", auto_offset_reset="earliest")
        consumer.subscribe([self.topics.samples])
        try:
            while not self._stop.is_set():
                try:
                    records = consumer.poll(500, 0.5)
                except BusError as exc:
                    logger.warning("reading samples failed (%s); retrying", exc)
                    self._stop.wait(1.0)
                    continue
                for record in records:
                    try:
                        sample = decode(record.value or b"", TrainingSample)
                    except Exception:
                        continue
                    self.add_sample(sample)
        finally:
            consumer.close()

    def add_sample(self, sample: TrainingSample) -> None:
        with self._tally_lock:
            if self.tally.add(sample):
                self.samples_seen += 1
                version = self.key(sample.behaviour_versions[0] or self.base_model)
                self._logged.setdefault(version, deque(maxlen=2000)).append(sample)

    # -- the loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Tick until cancelled; the stages' errors are logged and kept for the status page."""
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # never let the loop die
                logger.exception("rollout tick failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.config.interval_s)

    async def tick(self) -> None:
        """One pass of the stages. Each runs even when an earlier one failed (MLflow away must not
        stop a running step from being judged, nor a replica away stop MLflow from being synced)."""
        problems = []
        async with self._lock:
            for stage in (self._discover, self._sync_mlflow, self._refresh_champion, self._maybe_start,
                          self._reconcile, self._judge):
                try:
                    await stage()
                except Exception as exc:  # recorded; the next tick retries
                    logger.warning("rollout stage %s failed: %s", stage.__name__, exc, exc_info=True)
                    problems.append(f"{stage.__name__.strip('_')}: {type(exc).__name__}: {exc}")
        self.last_error = "; ".join(problems) or None

    async def _discover(self) -> None:
        await self.pool.discover()

    async def _sync_mlflow(self) -> None:
        state = self.controller.state
        if state is None or not state.mlflow_pending:
            return
        if not await asyncio.to_thread(self.controller.sync_mlflow):
            raise RuntimeError(f"MLflow has not taken the {state.mlflow_pending} of version "
                               f"{state.challenger} yet")

    async def _refresh_champion(self) -> None:
        """Follow MLflow's `champion`, loading a new one into the replicas before routing to it."""
        version = await asyncio.to_thread(alias_version, self.client, self.registered, "champion")
        if version == self.champion:
            return
        if version is not None:
            missing = await self.pool.ensure_loaded({self.name(version): self._uri(version)})
            if len(missing) == len(self.pool.replicas):
                raise ReplicaUnavailable(f"no replica could load the champion {self.name(version)}: "
                                         f"{missing}")
        logger.info("champion is now %s", self.name(version))
        self.champion = version

    async def _maybe_start(self) -> None:
        state = self.controller.state
        if not self.config.auto_start or (state is not None and state.active):
            return
        version = await asyncio.to_thread(alias_version, self.client, self.registered, "challenger")
        if version is None or version == self.champion:
            return
        if state is not None and state.challenger == version:  # its rollout has ended already
            return
        await self._start(version, "controller")

    async def _judge(self) -> None:
        state = self.controller.state
        if state is not None and state.status == "running":
            await asyncio.to_thread(self.controller.observe, self.evidence(state))
            self._after(state)

    def _uri(self, version: str) -> str:
        return f"models:/{self.registered}/{version}"

    async def _start(self, version: str, actor: str) -> RolloutState:
        """Load `version` everywhere, let the gate judge it, then start its rollout — or record it
        as rejected before any exposure."""
        await asyncio.to_thread(self.controller.check_version, version)
        name = self.name(version)
        try:
            missing = await self.pool.ensure_loaded({name: self._uri(version)})
        except ReplicaRefusedVersion as exc:
            return await asyncio.to_thread(self.controller.reject, version, f"could not load: {exc}", actor)
        if len(missing) == len(self.pool.replicas):
            raise ReplicaUnavailable(f"no replica could load {name} ({missing}); trying again next tick")
        objection, evidence = await self._gate(version) if self.gate is not None else (None, {})
        if objection is not None:
            return await asyncio.to_thread(self.controller.reject, version, objection, actor, evidence)
        return await asyncio.to_thread(self.controller.start, version, actor, evidence)

    async def _gate(self, version: str) -> tuple[str | None, dict[str, Any]]:
        """The off-policy gate's objection (None: go ahead) and its estimate, for the audit log."""
        assert self.gate is not None
        with self._tally_lock:
            champion = self.key(self.name(self.champion))
            logged = [s for s in self._logged.get(champion, ()) if s.completion and s.completion.logprobs]
        if len(logged) < self.config.offpolicy_min_samples:
            logger.info("off-policy gate skipped for %s: %d logged champion answers (needs %d)", version,
                        len(logged), self.config.offpolicy_min_samples)
            return None, {"offpolicy": "skipped", "offpolicy_logged": len(logged)}
        estimate = await asyncio.to_thread(self.gate, self.name(version), logged)
        if estimate.kl is not None:
            self.kl[version] = estimate.kl
        evidence = {"offpolicy_value": estimate.value, "offpolicy_logged_value": estimate.logged_value,
                    "offpolicy_ess": estimate.effective_samples, "offpolicy_logged": estimate.samples,
                    "kl": estimate.kl}
        if estimate.effective_samples < self.config.offpolicy_min_ess:
            return None, evidence | {"offpolicy": "too few effective samples to judge"}
        if estimate.value < estimate.logged_value - self.config.offpolicy_margin:
            return (f"off-policy gate: estimated reward {estimate.value:.3f} vs the champion's "
                    f"{estimate.logged_value:.3f} on {estimate.samples} logged answers "
                    f"(ESS {estimate.effective_samples:.1f})"), evidence
        return None, evidence | {"offpolicy": "passed"}

    async def _reconcile(self) -> None:
        state = self.controller.state
        needed: dict[str, str] = {}
        versions = [self.champion] + ([state.champion, state.challenger] if state and state.active else [])
        for version in versions:
            if version is not None:
                needed[self.name(version)] = self._uri(version)
        try:
            self._note_lagging(await self.pool.ensure_loaded(needed))
        except ReplicaRefusedVersion as exc:
            if state is None or not state.active or exc.name != self.name(state.challenger):
                raise
            await asyncio.to_thread(self.controller.rollback, "controller", f"could not load: {exc}")
        await self._unload_unneeded(set(needed))

    def _note_lagging(self, missing: dict[str, str]) -> None:
        """Keep (for the status page) and log, once per new reason, the replicas that lack a version
        they should serve; requests for it fail over to the others meanwhile."""
        for url, why in missing.items():
            if self.lagging.get(url) != why:
                logger.warning("replica %s lacks a version it should serve (%s); retrying every %.0fs",
                               url, why, self.config.interval_s)
        for url in set(self.lagging) - set(missing):
            logger.info("replica %s serves every version it should again", url)
        self.lagging = dict(missing)

    async def _unload_unneeded(self, needed: set[str]) -> None:
        prefix = f"{self.registered}-v"
        loaded: set[str] = set()
        for replica in self.pool.replicas:
            try:
                loaded |= await self.pool.loaded(replica)
            except Exception:
                continue
        now = self.clock()
        for name in sorted(n for n in loaded if n.startswith(prefix) and n not in needed):
            first = self._unneeded_since.setdefault(name, now)
            if now - first >= self.config.interval_s:
                await self.pool.unload(name)
                self._unneeded_since.pop(name, None)
                logger.info("unloaded %s from the replicas", name)
        for name in list(self._unneeded_since):
            if name in needed:
                del self._unneeded_since[name]

    def _after(self, state: RolloutState) -> None:
        if state.status == "promoted":
            self.champion = state.challenger

    def evidence(self, state: RolloutState) -> Evidence:
        """Each version's rewards and health since the step began. At full weight the champion
        serves nobody, so its side is everything it served since the rollout began."""
        since = state.step_started
        champion_since = since if state.weight < 1.0 else state.started
        challenger, champion = self.key(self.name(state.challenger)), self.key(self.name(state.champion))
        with self._tally_lock:
            ch = self.tally.stats(challenger, since)
            cp = self.tally.stats(champion, champion_since)
        return Evidence(ch, cp, self.health.health(challenger, since),
                        self.health.health(champion, champion_since), self.kl.get(state.challenger))

    # -- a person's controls (the REST API and the CLI) ---------------------------------------------
    async def control(self, action: str, actor: str, weight: float | None = None,
                      version: str | None = None, reason: str | None = None) -> RolloutState:
        """A person's action: start, pause, resume, set_weight, promote or rollback."""
        c = self.controller
        if action == "start":
            if c.state is not None and c.state.active:  # before loading anything
                raise RolloutConflict(f"rollout {c.state.rollout_id} of version {c.state.challenger} is "
                                      f"{c.state.status}: promote or roll it back first")
            async with self._lock:
                chosen = version or await asyncio.to_thread(alias_version, self.client, self.registered,
                                                            "challenger")
                if chosen is None:
                    return await asyncio.to_thread(c.start)  # raises: nothing to roll out
                return await self._start(chosen, actor)
        async with self._lock:
            if action == "set_weight":
                if weight is None:
                    raise ValueError("set_weight needs a weight in [0, 1]")
                state = await asyncio.to_thread(c.set_weight, weight, actor)
            elif action in ("promote", "rollback"):
                method = c.promote if action == "promote" else c.rollback
                args = (actor, reason) if reason else (actor,)
                state = await asyncio.to_thread(method, *args)
            elif action == "pause":
                state = await asyncio.to_thread(c.pause, actor)
            elif action == "resume":
                state = await asyncio.to_thread(c.resume, actor)
            else:
                raise ValueError(f"unknown rollout action {action!r}")
            self._after(state)
            return state

    # -- what the page and `status` show -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        state = self.controller.state
        body: dict[str, Any] = {
            "registered_model": self.registered, "base_model": self.base_model,
            "champion": {"version": self.champion, "model": self.name(self.champion)},
            "plan": {"steps": list(self.plan.steps), "min_samples": self.plan.min_samples,
                     "margin": self.plan.margin, "max_step_samples": self.plan.step_samples_limit,
                     "max_step_s": self.plan.max_step_s,
                     "alpha": self.plan.alpha},
            "rollout": None, "arms": {}, "samples_seen": self.samples_seen, "last_error": self.last_error,
            "replicas": [{"url": r.url, "down": r.down_until > self.pool.clock(), "failures": r.failures,
                          "lacking": self.lagging.get(r.url)} for r in self.pool.replicas],
        }
        if state is None:
            return body
        body["rollout"] = {k: v for k, v in asdict(state).items() if k != "history"}
        evidence = self.evidence(state)
        arms = {"champion": (self.name(state.champion), evidence.champion, evidence.champion_health),
                "challenger": (self.name(state.challenger), evidence.challenger, evidence.challenger_health)}
        for arm, (model, stats, health) in arms.items():
            body["arms"][arm] = {
                "model": model, "rewards": stats.n, "mean_reward": stats.mean if stats.n else None,
                "requests": health.requests, "error_rate": health.error_rate,
                "p99_latency_s": health.p99_latency_s}
        comparison = compare(evidence.challenger, evidence.champion, self.plan.alpha, self.plan.tau)
        body["comparison"] = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                              for k, v in asdict(comparison).items()}
        return body

    def series(self) -> dict[str, list[dict[str, float]]]:
        with self._tally_lock:
            return {v: [asdict(p) for p in self.tally.series(v)] for v in self.tally.versions()}
