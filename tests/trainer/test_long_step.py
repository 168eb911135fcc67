"""Steps longer than the consumer's max.poll.interval.ms, and a rebalance in the middle of a step, on a
real Kafka broker: the trainer stays in its group, carries on after a refused commit and trains every
sample exactly once.

The broker's smallest session timeout (6 s) sets the poll interval here; each slow step sleeps past it
before its update (as a slow CPU would). In the second slow step another member joins the group and,
once it holds a partition, keeps it until after that step's commit; the group refuses the commit of
the records the trainer had read from that partition. The samples arrive in waves of four, two on
each partition, the next wave during the step before, so the second step's batch holds records of
both partitions and the refusal does not depend on which partition the intruder is given.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus import Bus
from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings
from online_rl.events import encode
from online_rl.registry import read_lineage
from online_rl.trainer import CheckpointStore, Trainer
from online_rl.trainer.controller import TrainerState
from online_rl.trainer.samples import Routed
from tests.conftest import TINY_NAME
from tests.trainer.test_trainer import _pair

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

POLL_INTERVAL_MS = 6000  # the broker's group.min.session.timeout.ms
STEP_S = 9.0  # longer than the poll interval


class SlowTrainer(Trainer):
    """The real trainer whose first two updates take longer than the poll interval; during the second,
    `intruder` joins the group."""

    def __init__(self, settings: Settings, bus: Bus, intruder: threading.Thread,
                 holding: threading.Event, release: threading.Event, feed: Callable[[int], None]) -> None:
        super().__init__(settings, bus)
        self.intruder, self.holding, self.release, self.feed = intruder, holding, release, feed
        self.refused_after: list[float] = []  # commits refused so far, after each step's commit

    def _update(self, state: TrainerState, routed: Routed) -> bool:
        if state.step < 2:
            if state.step == 1:  # the rebalance lands inside this step, however slow the machine
                self.intruder.start()
                assert self.holding.wait(60), "the intruder never got a partition: no rebalance happened"
            self.feed(state.step)
            time.sleep(STEP_S)
        return super()._update(state, routed)

    def _commit(self, batch: Any, state: TrainerState) -> None:
        super()._commit(batch, state)
        self.refused_after.append(self.metrics.registry.get_sample_value("orl_trainer_commits_refused_total")
                                  or 0.0)
        if len(self.refused_after) == 2:
            self.release.set()


def test_long_steps_and_a_rebalance_mid_step_train_every_sample_once(
    kafka_bootstrap: str, tiny_model: Path, tmp_path: Path, ray_runtime: None
) -> None:
    settings = Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"t{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
        mlflow={"registered_model": "policy"},  # type: ignore[arg-type]
        trainer={"batch_size": 4, "batch_timeout_s": 1.0, "learning_rate": 1e-3,  # type: ignore[arg-type]
                 "publish_every_samples": 8, "publish_every_s": 3600, "precision": "fp32"},
    )
    short = {"session.timeout.ms": POLL_INTERVAL_MS, "max.poll.interval.ms": POLL_INTERVAL_MS,
             "heartbeat.interval.ms": 500}
    bus = KafkaBus(kafka_bootstrap, consumer_extra=short)
    topics = settings.topics
    bus.create_topic(topics.samples, 2)
    bus.create_topic(topics.dlq, 1)
    rng = random.Random(3)
    samples = [_pair(i, rng) for i in range(16)]
    producer = bus.producer()

    def wave(k: int) -> None:  # samples 4k..4k+3, two on each partition
        for j, sample in enumerate(samples[4 * k: 4 * k + 4]):
            producer.produce(topics.samples, encode(sample), sample.sample_id.encode(), partition=j % 2)
        producer.flush()

    wave(0)
    fed = {0: (1,), 1: (2, 3)}  # during step 0 the wave step 1 trains; during step 1 the rest

    def feed(step: int) -> None:
        for k in fed.pop(step, ()):
            wave(k)

    holding, release = threading.Event(), threading.Event()

    def intrude() -> None:  # another member of the trainer's group, until after the slow step's commit
        consumer = bus.consumer(settings.trainer.group_id)
        consumer.subscribe([topics.samples])
        deadline = time.monotonic() + 120
        while not release.is_set() and time.monotonic() < deadline:
            consumer.poll(100, 0.2)  # reads, never commits: it only holds its partitions
            if consumer.assignment():
                holding.set()
        consumer.close()

    intruder = threading.Thread(target=intrude, daemon=True)
    trainer = SlowTrainer(settings, bus, intruder, holding, release, feed)
    state = trainer.run(idle_exit_s=8.0)

    assert holding.is_set()
    assert trainer.refused_after[0] == 0  # a step past the poll interval alone: still in the group
    # the rebalance mid-step: the commit of records from the partition taken away is refused (in that
    # step, whose batch holds records of both partitions, or a later one when they were still buffered:
    # which depends on the machine's timing), and the trainer carried on
    assert trainer.refused_after[-1] >= 1, trainer.refused_after
    assert state.samples == 16  # every sample trained, none twice
    ends = bus.end_offsets(topics.samples)
    assert state.offsets == ends
    checkpoint = CheckpointStore(settings.checkpoint_dir).load_latest()
    assert checkpoint is not None and checkpoint.samples == 16
    # the published versions' offset ranges tile the stream: nothing lost, nothing twice
    import mlflow

    from online_rl.tracking import mlflow_client

    mlflow_client(settings)
    for tp, end in ends.items():
        position = 0
        for version in trainer.published:
            folder = mlflow.artifacts.download_artifacts(f"models:/policy/{version.version}",
                                                         dst_path=str(tmp_path / version.version))
            window = read_lineage(Path(folder)).offsets.get(topics.samples, {}).get(str(tp.partition))
            if window is not None:
                assert window[0] == position < window[1]
                position = window[1]
        assert position == end
    bus.close()
