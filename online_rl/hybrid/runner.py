"""`online-rl hybrid`: colocated PPO fed by the live stream, publishing versions to MLflow.

Reads the joined samples (`orl.samples`): every sample's prompt joins the prompt window, every
preference pair teaches the reward model. Once `hybrid.min_pairs` pairs have been seen, each
iteration runs `ColocatedPPO.step`; every `hybrid.publish_every_steps` iterations the adapter is
sealed with its lineage (the sample offsets it learned from, the reward model's pairs), registered
as a new version and given the `challenger` alias, so the gateway's canary takes it from there.
Offsets are committed after a publish. The reward model and the PPO state live in memory: a restart
begins again from the last committed offsets (see docs/hybrid.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.bus import Bus, CommitFailed, TopicPartition, open_bus
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.registry import PublishedVersion, load_signing_key, publish_adapter, write_lineage
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


def _observe(loop: ColocatedPPO, samples: list[TrainingSample], model: str) -> int:
    prompts, pairs = [], []
    for sample in samples:
        if sample.model != model or not sample.prompt_token_ids:
            continue
        prompts.append(sample.prompt_token_ids)
        if sample.kind == "pair" and sample.chosen is not None and sample.rejected is not None:
            chosen, rejected = sample.chosen.token_ids, sample.rejected.token_ids
            if chosen and rejected and chosen != rejected:
                pairs.append((sample.prompt_token_ids, chosen, rejected))
    loop.observe(prompts, pairs)
    return len(pairs)


def run_hybrid(settings: Settings, bus: Bus | None = None, max_steps: int | None = None,
               stop: threading.Event | None = None,
               on_step: Callable[[ColocatedPPO, dict[str, float]], None] | None = None,
               on_ready: Callable[[ColocatedPPO], None] | None = None) -> HybridRun:
    """Run the loop until `max_steps` iterations, or until `stop` is set. `on_ready` is called once
    before the first iteration, `on_step` after each (for evaluations and progress)."""
    from online_rl.hybrid.loop import ColocatedPPO
    from online_rl.tracking import ensure_experiment, mlflow_client

    if not (settings.model_dir / "config.json").is_file():
        raise ConfigError(f"model.path={settings.model_dir} holds no model (no config.json): run "
                          "`online-rl model prepare` for the embedded default, or set model.path")
    config = settings.hybrid
    key_file = settings.mlflow.signing_key_file  # read now: a bad key fails the start, not a publish
    signing_key = load_signing_key(key_file) if key_file is not None else None
    bus = bus or open_bus(settings)
    topics = settings.topics
    topic = topics.samples
    stream: Stream[TrainingSample] = Stream.from_topic(topic, bus, dlq_topic=topics.dlq,
                                                       group_id=config.group_id)
    client = mlflow_client(settings)
    resolved = config.model_dump(mode="json") | {
        f"lora_{k}": v for k, v in settings.trainer.model_dump(mode="json").items() if k in ("rank", "alpha")}
    config_hash = hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()[:16]
    experiment = ensure_experiment(client, config.experiment, settings)
    mlflow_run = client.create_run(experiment, tags={"component": "hybrid", "config_hash": config_hash,
                                                     "base_model": settings.model.name})
    run_id = mlflow_run.info.run_id
    from mlflow.entities import Param

    client.log_batch(run_id, params=[Param(k, str(v)[:500]) for k, v in sorted(resolved.items())])
    state = HybridRun()
    loop: ColocatedPPO | None = None
    failed = True
    try:
        loop = ColocatedPPO(settings)
        for batch in stream.batch(256, timeout=0.5, idle_batches=True):
            state.pairs += _observe(loop, batch.items, settings.model.name)
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
                client.log_batch(run_id, metrics=_metrics(metrics, state.steps))
                if on_step is not None:
                    on_step(loop, metrics)
                if state.steps % config.publish_every_steps == 0:
                    _publish(settings, client, run_id, loop, state, config_hash, signing_key)
                    _commit(stream, state)
            if (max_steps is not None and state.steps >= max_steps) or (stop is not None and stop.is_set()):
                break
        failed = False
    finally:
        stream.close()
        if loop is not None:
            loop.close()
        client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")
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


def _metrics(values: dict[str, float], step: int) -> list[Any]:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    return [Metric(f"hybrid_{k}", float(v), now, step) for k, v in values.items()]


def _publish(settings: Settings, client: Any, run_id: str, loop: ColocatedPPO, state: HybridRun,
             config_hash: str, signing_key: Any) -> None:
    offsets: dict[str, dict[str, list[int]]] = {}
    for tp, end in sorted(state.offsets.items()):
        first = state.published_offsets.get(tp, 0)
        if end > first:
            offsets.setdefault(tp.topic, {})[str(tp.partition)] = [first, end]
    recent = state.history[-settings.hybrid.publish_every_steps:]
    evaluation = {f"train_{k}": sum(m[k] for m in recent) / len(recent) for k in ("reward", "kl")}
    with tempfile.TemporaryDirectory(prefix="orl-hybrid-") as tmp:
        folder = Path(tmp) / "adapter"
        loop.save_adapter(str(folder))
        parent = state.published[-1].serving_name if state.published else None
        write_lineage(folder, settings.model.name, signing_key, offsets=offsets, parent_version=parent,
                      config_hash=config_hash, eval=evaluation)
        published = publish_adapter(client, run_id, folder, settings.mlflow.registered_model,
                                    artifact_path=f"hybrid/step-{state.steps:09d}")
    state.published.append(published)
    state.published_offsets = dict(state.offsets)
    logger.info("hybrid published %s at step %d", published.serving_name, state.steps,
                extra={"event": "published", "version": published.version, "step": state.steps})
