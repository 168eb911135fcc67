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

from online_rl.bus import Bus, BusError, Topics
from online_rl.config import RolloutConfig, Settings
from online_rl.events import TrainingSample, decode
from online_rl.registry import alias_version, serving_name
from online_rl.rollout.controller import RolloutController, RolloutState, RolloutStore
from online_rl.rollout.health import HealthLog
from online_rl.rollout.offpolicy import OffPolicyEstimate
from online_rl.rollout.plan import Evidence, Guardrails, RolloutPlan
from online_rl.rollout.replicas import AdapterLoadFailed, ReplicaPool, ReplicaUnavailable
from online_rl.rollout.rewards import RewardTally
from online_rl.rollout.routing import Route, route_request
from online_rl.rollout.sequential import compare

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["Gate", "RolloutLoop", "plan_from_config"]

log = logging.getLogger(__name__)

# The off-policy gate: (challenger serving name, the champion's logged samples) -> the estimate.
Gate = Callable[[str, list[TrainingSample]], OffPolicyEstimate]


def plan_from_config(config: RolloutConfig) -> RolloutPlan:
    return RolloutPlan(
        steps=tuple(config.steps), min_samples=config.min_samples, margin=config.margin,
        max_step_s=config.max_step_s, on_timeout=config.on_timeout, alpha=config.alpha, tau=config.tau,
        guardrails=Guardrails(config.max_error_rate_increase, config.max_p99_latency_ratio, config.max_kl,
                              config.guardrail_min_requests))


class RolloutLoop:
    """One gateway's rollouts: state, evidence and the replicas' adapters."""

    def __init__(self, settings: Settings, pool: ReplicaPool, bus: Bus, client: MlflowClient,
                 gate: Gate | None = None, clock: Callable[[], float] = time.time) -> None:
        self.config = settings.gateway.rollout
        self.registered = settings.mlflow.registered_model
        self.base_model = settings.model.name
        self.plan = plan_from_config(self.config)
        self.controller = RolloutController(client, self.registered, self.plan,
                                            RolloutStore(settings.rollout_dir), clock)
        self.pool, self.bus, self.client, self.gate, self.clock = pool, bus, client, gate, clock
        self.topics = Topics(settings.bus.topic_prefix)
        self.tally = RewardTally(self.config.reward_bucket_s)
        self.health = HealthLog(clock=clock)
        self.champion: str | None = None  # the version MLflow's `champion` names (refreshed each tick)
        self.samples_seen = 0
        self.last_error: str | None = None
        self._champion_samples: deque[TrainingSample] = deque(maxlen=5000)  # for the off-policy gate
        self._lock = asyncio.Lock()
        self._tally_lock = threading.Lock()
        self._stop = threading.Event()
        self._feed: threading.Thread | None = None
        self._unneeded_since: dict[str, float] = {}
        self.kl: dict[str, float] = {}  # version -> KL(champion || it), measured by the gate

    # -- names --------------------------------------------------------------------------------------
    def name(self, version: str | None) -> str:
        """The serving name of a version number (None: the base model)."""
        return serving_name(self.registered, version) if version is not None else self.base_model

    def key(self, model: str) -> str:
        """The version key rewards and health are kept under (`base` for the base model)."""
        return "base" if model == self.base_model else model

    def route(self, user_id: str, override: str | None = None) -> Route:
        champion = self.name(self.champion) if self.champion is not None else None
        return route_request(self.controller.state, self.base_model, user_id, override, champion)

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
                    log.warning("reading samples failed (%s); retrying", exc)
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
                champion = self.name(self.champion)
                if (sample.behaviour_versions[0] or self.base_model) == champion:
                    self._champion_samples.append(sample)

    # -- the loop -------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Tick until cancelled; an error is logged and kept for the status page, then retried."""
        while True:
            try:
                await self.tick()
                self.last_error = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("rollout tick failed")
                self.last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.config.interval_s)

    async def tick(self) -> None:
        async with self._lock:
            self.champion = await asyncio.to_thread(alias_version, self.client, self.registered, "champion")
            state = self.controller.state
            if self.config.auto_start and (state is None or not state.active):
                await self._maybe_start()
            await self._reconcile()
            state = self.controller.state
            if state is not None and state.status == "running":
                await asyncio.to_thread(self.controller.observe, self.evidence(state))
                self._after(state)

    async def _maybe_start(self) -> None:
        version = await asyncio.to_thread(alias_version, self.client, self.registered, "challenger")
        state = self.controller.state
        if version is None or version == self.champion or (state is not None and state.challenger == version):
            return
        await self._start(version, "controller")

    async def _start(self, version: str, actor: str) -> RolloutState:
        name = self.name(version)
        try:
            missing = await self.pool.ensure_loaded({name: f"models:/{self.registered}/{version}"})
        except AdapterLoadFailed as exc:  # recorded as a rollout that ended before any exposure
            await asyncio.to_thread(self.controller.start, version, actor)
            return await asyncio.to_thread(self.controller.rollback, actor, f"could not load: {exc}")
        if len(missing) == len(self.pool.replicas):
            raise ReplicaUnavailable(f"no replica could load {name} ({missing}); trying again next tick")
        objection, evidence = await self._gate(version) if self.gate is not None else (None, {})
        state = await asyncio.to_thread(self.controller.start, version, actor, evidence)
        if objection is not None:  # recorded as a rollout that ended before any exposure
            state = await asyncio.to_thread(self.controller.rollback, actor, objection)
        return state

    async def _gate(self, version: str) -> tuple[str | None, dict[str, Any]]:
        """The off-policy gate's objection (None: go ahead) and its estimate, for the audit log."""
        assert self.gate is not None
        with self._tally_lock:
            logged = [s for s in self._champion_samples if s.completion and s.completion.logprobs]
        if len(logged) < self.config.offpolicy_min_samples:
            log.info("off-policy gate skipped for %s: %d logged champion answers (needs %d)", version,
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
                needed[self.name(version)] = f"models:/{self.registered}/{version}"
        try:
            await self.pool.ensure_loaded(needed)
        except AdapterLoadFailed as exc:
            if state is not None and state.active and self.name(state.challenger) in str(exc):
                await asyncio.to_thread(self.controller.rollback, "controller", f"could not load: {exc}")
            else:
                raise
        await self._unload_unneeded(set(needed))

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
                log.info("unloaded %s from the replicas", name)
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
        async with self._lock:
            c = self.controller
            if action == "start":
                chosen = version or await asyncio.to_thread(alias_version, self.client, self.registered,
                                                            "challenger")
                state = await self._start(chosen, actor) if chosen else await asyncio.to_thread(c.start)
            elif action == "set_weight":
                assert weight is not None
                state = await asyncio.to_thread(c.set_weight, weight, actor)
            elif action in ("promote", "rollback"):
                method = c.promote if action == "promote" else c.rollback
                args = (actor, reason) if reason else (actor,)
                state = await asyncio.to_thread(method, *args)
            else:
                state = await asyncio.to_thread(getattr(c, action), actor)
            self._after(state)
            return state

    # -- what the page and `status` show -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        state = self.controller.state
        body: dict[str, Any] = {
            "registered_model": self.registered, "base_model": self.base_model,
            "champion": {"version": self.champion, "model": self.name(self.champion)},
            "plan": {"steps": list(self.plan.steps), "min_samples": self.plan.min_samples,
                     "margin": self.plan.margin, "max_step_s": self.plan.max_step_s,
                     "alpha": self.plan.alpha},
            "rollout": None, "arms": {}, "samples_seen": self.samples_seen, "last_error": self.last_error,
            "replicas": [{"url": r.url, "down": r.down_until > self.pool.clock(), "failures": r.failures}
                         for r in self.pool.replicas],
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
