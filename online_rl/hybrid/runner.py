"""`online-rl hybrid`: colocated PPO fed by the live stream, publishing versions to MLflow.

Reads the joined samples (`orl.samples`): every sample's prompt joins the prompt window, every
preference pair teaches the reward model. Once `hybrid.min_pairs` pairs have been seen, each
iteration runs `ColocatedPPO.step`; every `hybrid.publish_every_steps` iterations the adapter is
published through the run's `TrainingRun` (online_rl/registry/runs.py, the trainer's path too): sealed
with its complete lineage (the sample offsets read since the last version, the versions that served
and the reward mappings that scored the samples it used, its parent), registered as a new version and
given the `challenger` alias, so the gateway's canary takes it from there. Offsets are committed after
a publish. The reward model and the PPO state live in memory: a restart begins again from the last
committed offsets (see docs/hybrid.md).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from online_rl.bus import Bus, CommitFailed, TopicPartition, open_bus
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.registry import PublishedVersion, TrainingRun, VersionLineage, offset_ranges, served_by
from online_rl.stream import Stream

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.hybrid.loop import ColocatedPPO

__all__ = ["HybridRun", "run_hybrid"]

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
    """Feed the loop the samples' prompts (with the user's words, what reward functions read) and pairs
    (those for `model`); the number of pairs."""
    prompts, texts, pairs = [], [], []
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
    loop.observe(prompts, pairs, texts)
    return len(pairs)


def run_hybrid(settings: Settings, bus: Bus | None = None, max_steps: int | None = None,
               stop: threading.Event | None = None,
               on_step: Callable[[ColocatedPPO, dict[str, float]], None] | None = None,
               on_ready: Callable[[ColocatedPPO], None] | None = None) -> HybridRun:
    """Run the loop until `max_steps` iterations, or until `stop` is set. `on_ready` is called once
    before the first iteration, `on_step` after each (for evaluations and progress)."""
    from online_rl.hybrid.loop import ColocatedPPO

    if not (settings.model_dir / "config.json").is_file():
        raise ConfigError(f"model.path={settings.model_dir} holds no model (no config.json): run "
                          "`online-rl model prepare` for the embedded default, or set model.path")
    config = settings.hybrid
    bus = bus or open_bus(settings)
    topics = settings.topics
    topic = topics.samples
    stream: Stream[TrainingSample] = Stream.from_topic(topic, bus, dlq_topic=topics.dlq,
                                                       group_id=config.group_id)
    state = HybridRun()
    loop: ColocatedPPO | None = None
    run: TrainingRun | None = None
    failed = True
    try:
        loop = ColocatedPPO(settings, bus)  # the bus: reward functions' failures go to its dead letters
        # opened once the policy's precision is resolved: it is part of the config (and its hash)
        run = TrainingRun.open(settings, "hybrid", loop.group.precision)
        for batch in stream.batch(256, timeout=0.5, idle_batches=True):
            state.pairs += _observe(loop, batch.items, settings.model.name, state)
            state.samples += len(batch.items)
            for tp, end in batch.offsets.items():
                state.offsets[tp] = max(state.offsets.get(tp, 0), end)
            if stop is not None and stop.is_set():
                break
            if not loop.ready:
                continue
            if state.steps == 0 and on_ready is not None:
                on_ready(loop)
            # an iteration may outlast max.poll.interval.ms: the consumer keeps polling meanwhile
            with stream.consumer.hold() if stream.consumer is not None else contextlib.nullcontext():
                metrics = loop.step()
                state.steps += 1
                state.history.append(metrics)
                run.log_metrics(metrics, state.steps, prefix="hybrid_")
                if on_step is not None:
                    on_step(loop, metrics)
                if state.steps % config.publish_every_steps == 0:
                    _publish(settings, run, loop, state)
                    _commit(stream, state)
            if (max_steps is not None and state.steps >= max_steps) or (stop is not None and stop.is_set()):
                break
        failed = False
    finally:
        stream.close()
        try:
            if run is not None:
                run.close(failed)
        finally:
            if loop is not None:
                loop.close()
    return state


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
