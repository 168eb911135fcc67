"""The rollout flow: colocated PPO (or GRPO/RLOO/REINFORCE++) fed by the live stream, publishing
versions to MLflow. `online-rl hybrid` runs it, as does `online-rl trainer` with `trainer.flow: rollout`:
the single controller (`online_rl.trainer.Trainer`) runs this program's nodes on every batch,
`observe → reward_model → generate → reward → advantage → update → log → publish → commit`.

Reads the joined samples (`orl.samples`): every sample's prompt joins the prompt window, every
preference pair teaches the reward model. Once `hybrid.min_pairs` pairs have been seen, each pass runs
one iteration, phase by phase (`ColocatedPPO`'s phases); every `hybrid.publish_every_steps` iterations
the adapter is published through the run's `TrainingRun` (online_rl/registry/runs.py, the trainer's path
too): sealed with its complete lineage (the sample offsets read since the last version, the versions
that served and the reward mappings that scored the samples it used, its parent), registered as a new
version and given the `challenger` alias, so the gateway's canary takes it from there. Offsets are
committed after a publish. The reward model and the PPO state live in memory: a restart begins again
from the last committed offsets (see docs/hybrid.md).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.bus import Bus, CommitFailed, TopicPartition, open_bus
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.flow.graph import Flow, Step
from online_rl.registry import PublishedVersion, TrainingRun, VersionLineage, offset_ranges, served_by
from online_rl.stream import Stream
from online_rl.trainer.metrics import TrainerMetrics

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.hybrid.loop import ColocatedPPO

__all__ = ["HybridRun", "RolloutProgram", "run_hybrid"]

logger = logging.getLogger(__name__)


@dataclass
class HybridRun:
    steps: int = 0
    samples: int = 0
    pairs: int = 0
    published: list[PublishedVersion] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    published_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    # of the samples used since the last publish: the versions that served them, their reward mappings
    behaviour_versions: set[str] = field(default_factory=set)
    reward_mapping_versions: set[str] = field(default_factory=set)


def _observe(loop: ColocatedPPO, samples: list[TrainingSample], model: str, state: HybridRun) -> int:
    """Feed the loop the samples' prompts (with the user's words, what reward functions read), pairs and
    thumbs (a single answer with a desirable or undesirable label, not a default; those for `model`);
    the number of pairs."""
    prompts, texts, pairs, thumbs = [], [], [], []
    for sample in samples:
        if sample.model != model or not sample.prompt_token_ids:
            continue
        prompts.append(sample.prompt_token_ids)
        texts.append(next((m.content for m in reversed(sample.prompt) if m.role == "user"), ""))
        state.behaviour_versions |= served_by(sample)
        state.reward_mapping_versions.add(sample.reward_mapping_version)
        if sample.kind == "pair" and sample.chosen is not None and sample.rejected is not None:
            chosen, rejected = sample.chosen.token_ids, sample.rejected.token_ids
            if chosen and rejected and chosen != rejected:
                pairs.append((sample.prompt_token_ids, chosen, rejected))
        elif (sample.kind == "single" and sample.label is not None and not sample.defaulted
              and sample.completion is not None and sample.completion.token_ids):
            thumbs.append((sample.prompt_token_ids, sample.completion.token_ids, sample.label))
    loop.observe(prompts, pairs, texts, thumbs)
    return len(pairs)


class RolloutProgram:
    """The rollout flow's nodes and what they share: the colocated PPO loop (`ColocatedPPO`), this
    lifetime's MLflow run and the run's state. The single controller (`online_rl.trainer.Trainer`)
    opens it, runs its flow on every batch and closes it."""

    batch_size, batch_timeout_s = 256, 0.5

    def __init__(self, settings: Settings, bus: Bus, metrics: TrainerMetrics | None = None) -> None:
        if not (settings.model_dir / "config.json").is_file():
            raise ConfigError(f"model.path={settings.model_dir} holds no model (no config.json): run "
                              "`online-rl model prepare` for the embedded default, or set model.path")
        self.settings, self.bus, self.config = settings, bus, settings.hybrid
        self.state = HybridRun()
        self.metrics = metrics or TrainerMetrics()  # the trainer's Prometheus metrics, kept up to date
        self.loop: ColocatedPPO | None = None
        self.run: TrainingRun | None = None
        self.stream: Stream[TrainingSample] | None = None

    @property
    def steps(self) -> int:
        return self.state.steps

    def flow(self) -> Flow:
        return Flow("rollout", [("observe", self.observe), ("reward_model", self.reward_model),
                                ("generate", self.generate), ("reward", self.reward),
                                ("advantage", self.advantage), ("update", self.update), ("log", self.log),
                                ("publish", self.publish), ("commit", self.commit)], kind="rollout")

    def open(self) -> Stream[TrainingSample]:
        """The loop's actors up, the MLflow run open; the samples stream to read."""
        from online_rl.hybrid.loop import ColocatedPPO

        topics = self.settings.topics
        self.loop = ColocatedPPO(self.settings, self.bus)  # the bus: reward functions' dead letters
        # opened once the policy's precision is resolved: it is part of the config (and its hash)
        self.run = TrainingRun.open(self.settings, "hybrid", self.loop.group.precision)
        self.stream = Stream.from_topic(topics.samples, self.bus, dlq_topic=topics.dlq,
                                        group_id=self.config.group_id)
        return self.stream

    def busy(self, batch: Any) -> bool:
        """Whether a pass on `batch` may run an iteration (the consumer is held while it does)."""
        return bool(batch.items) or (self.loop is not None and self.loop.ready)

    def close(self, failed: bool) -> None:
        try:
            if self.run is not None:
                self.run.close(failed)
        finally:
            if self.loop is not None:
                self.loop.close()

    @property
    def ppo(self) -> ColocatedPPO:
        if self.loop is None:
            raise RuntimeError("the rollout flow is not running (call Trainer.run)")
        return self.loop

    # -- the nodes -------------------------------------------------------------------------------
    def observe(self, step: Step) -> None:
        """The batch's prompts join the window, its pairs teach the reward model; the pass ends here
        until `hybrid.min_pairs` pairs have been seen (or when the controller is stopping)."""
        state, batch = self.state, step.batch
        state.pairs += _observe(self.ppo, batch.items, self.settings.model.name, state)
        state.samples += len(batch.items)
        for tp, end in batch.offsets.items():
            state.offsets[tp] = max(state.offsets.get(tp, 0), end)
        if step.stopping or not self.ppo.ready:
            step.stop()
            return
        step.counts = True  # an iteration runs: it counts towards max_steps

    def reward_model(self, step: Step) -> None:
        self.ppo.learn_phase(step.data)

    def generate(self, step: Step) -> None:
        self.ppo.generate(step.data)

    def reward(self, step: Step) -> None:
        self.ppo.reward_phase(step.data)

    def advantage(self, step: Step) -> None:
        self.ppo.advantage(step.data)

    def update(self, step: Step) -> None:
        self.ppo.update(step.data)
        step.trained = bool(step.data.get("trained"))

    def log(self, step: Step) -> None:
        """The iteration's metrics: to the run's history and to MLflow (`hybrid_*`)."""
        assert self.run is not None
        metrics = self.ppo.finish(step.data)
        self.state.steps += 1
        self.state.history.append(metrics)
        self.run.log_metrics(metrics, self.state.steps, prefix="hybrid_")
        self.metrics.steps.inc()
        self.metrics.samples.inc(metrics["rollouts"])
        self.metrics.step_seconds.observe(metrics["iteration_s"])
        if "ppo_loss" in metrics:
            self.metrics.loss.set(metrics["ppo_loss"])
        step.data["iteration"] = metrics
        step.metrics |= metrics

    def publish(self, step: Step) -> None:
        if step.data.get("iteration") and self.state.steps % self.config.publish_every_steps == 0:
            assert self.run is not None
            _publish(self.settings, self.run, self.ppo, self.state)
            self.metrics.published_version.set(int(self.state.published[-1].version))
            step.data["published"] = True

    def commit(self, step: Step) -> None:
        if step.data.get("published") and self.stream is not None:
            _commit(self.stream, self.state)


def run_hybrid(settings: Settings, bus: Bus | None = None, max_steps: int | None = None,
               stop: threading.Event | None = None,
               on_step: Callable[[ColocatedPPO, dict[str, float]], None] | None = None,
               on_ready: Callable[[ColocatedPPO], None] | None = None) -> HybridRun:
    """The rollout flow on the single controller, until `max_steps` iterations, or until `stop` is set.
    `on_ready` is called once before the first iteration, `on_step` after each (for evaluations and
    progress): two nodes added to the flow."""
    from online_rl.trainer import Trainer

    trainer = Trainer(settings, bus or open_bus(settings), flow="rollout")
    program = trainer.rollout
    assert program is not None
    if on_ready is not None:
        def ready(step: Step) -> None:
            if program.state.steps == 0:
                on_ready(program.ppo)

        trainer.flow.add("on_ready", ready, before="reward_model")
    if on_step is not None:
        trainer.flow.add("on_step", lambda step: on_step(program.ppo, step.data["iteration"]), after="log")
    trainer.run(max_steps=max_steps, stop=stop)
    return program.state


def _commit(stream: Stream[TrainingSample], state: HybridRun) -> None:
    """Commit everything the published version learned from. A commit refused after a rebalance loses
    nothing that was published: the partitions' new owner (or this loop, re-joining) re-reads from the
    last commit, and those records only feed prompts and reward-model pairs again."""
    if stream.consumer is None:
        return
    try:
        refused: object = stream.consumer.commit_owned(state.published_offsets)
    except CommitFailed as exc:
        refused = exc
    if refused:
        logger.warning("hybrid: the group refused the commit (%s); carrying on", refused,
                       extra={"event": "commit_refused", "step": state.steps})


def _publish(settings: Settings, run: TrainingRun, loop: ColocatedPPO, state: HybridRun) -> None:
    # the iterations that trained (one skipped for want of scored rollouts reports no reward)
    recent = [m for m in state.history[-settings.hybrid.publish_every_steps:] if "reward" in m]
    trained = {f"train_{k}": sum(m[k] for m in recent) / len(recent) for k in ("reward", "kl")
               } if recent else {}
    lineage = VersionLineage(
        offsets=offset_ranges(state.offsets, state.published_offsets),
        behaviour_versions=state.behaviour_versions, reward_mapping_versions=state.reward_mapping_versions,
        parent_version=state.published[-1].serving_name if state.published else None,
        eval=trained,
        kl_anchor="base")  # the reference of the KL penalty: the base (the adapter disabled)

    def save(folder: Path) -> None:
        loop.save_adapter(str(folder))

    published = run.publish(save, lineage, artifact_path=f"hybrid/step-{state.steps:09d}")
    state.published.append(published)
    state.published_offsets = dict(state.offsets)
    state.behaviour_versions, state.reward_mapping_versions = set(), set()
    logger.info("hybrid published %s at step %d", published.serving_name, state.steps,
                extra={"event": "published", "version": published.version, "step": state.steps})
