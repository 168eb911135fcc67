"""SIGKILL in the middle of a step, then a restart: every sample trained exactly once.

`online-rl trainer` runs as its own process on a real Kafka broker (with a real MLflow store and Ray).
It is killed with SIGKILL right after it logs (as JSON) that a step started — before that step's
checkpoint and commit — and started again. The versions it publishes across the two lifetimes have
offset ranges that tile the stream with no gap and no overlap, and the final checkpoint counts each
sample once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import IO

import pytest

from online_rl.bus import TopicPartition
from online_rl.bus.kafka import KafkaBus
from online_rl.bus.topics import Topics
from online_rl.config import Settings
from online_rl.registry import read_lineage
from online_rl.trainer import CheckpointStore
from tests.conftest import TINY_NAME
from tests.trainer.test_trainer import _pair, send

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

SAMPLES, BATCH, PUBLISH_EVERY = 24, 4, 8


def _events(stream: IO[str], transcript: list[str]) -> dict[str, object] | None:
    """The next JSON log event of the trainer (other lines are kept for the failure message)."""
    for line in stream:
        transcript.append(line)
        if line.startswith("{"):
            return dict(json.loads(line))
    return None


def test_sigkill_mid_step_then_restart_trains_every_sample_exactly_once(
    kafka_bootstrap: str, tiny_model: Path, tmp_path: Path
) -> None:
    prefix = f"k{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "ORL_CACHE_DIR": str(tmp_path / "cache"), "ORL_MODEL__NAME": TINY_NAME,
           "ORL_MODEL__PATH": str(tiny_model), "ORL_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
           "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_BUS__PARTITIONS": "2",
           "ORL_TRAINER__BATCH_SIZE": str(BATCH), "ORL_TRAINER__BATCH_TIMEOUT_S": "0.5",
           "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": str(PUBLISH_EVERY), "ORL_TRAINER__LEARNING_RATE": "1e-3",
           "ORL_MLFLOW__REGISTERED_MODEL": "policy", "ORL_LOG_FORMAT": "json"}
    settings = Settings(cache_dir=tmp_path / "cache")
    topics = Topics(prefix)
    bus = KafkaBus(kafka_bootstrap)
    bus.create_topic(topics.samples, 2)
    bus.create_topic(topics.dlq, 1)
    producer = bus.producer()
    rng = random.Random(5)
    send(producer, topics.samples, [_pair(i, rng) for i in range(SAMPLES)])
    command = [sys.executable, "-m", "online_rl.cli", "trainer", "--metrics-port", "0"]
    store = CheckpointStore(settings.checkpoint_dir)

    # lifetime 1: killed as soon as the step after the first publish has started
    first = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    transcript: list[str] = []
    killed_in = None
    try:
        assert first.stderr is not None
        published = False
        while (event := _events(first.stderr, transcript)) is not None:
            published = published or event.get("event") == "published"
            if published and event.get("event") == "step_started":
                first.send_signal(signal.SIGKILL)
                killed_in = event["step"]
                break
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(timeout=60)
    assert killed_in is not None, "".join(transcript[-40:])
    assert first.returncode == -signal.SIGKILL
    at_kill = store.load_latest()
    assert at_kill is not None and at_kill.step < killed_in  # the killed step never became durable
    assert at_kill.samples < SAMPLES

    # lifetime 2: resumes from the checkpoint and trains the rest; once the stream is quiet the time
    # trigger publishes what is left, and it exits
    second = subprocess.run([*command, "--idle-exit", "5"], env=env | {"ORL_TRAINER__PUBLISH_EVERY_S": "2"},
                            capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-4000:]
    resumed = [json.loads(line) for line in second.stderr.splitlines()
               if line.startswith("{") and '"event": "resume"' in line]
    assert resumed and resumed[0]["step"] == at_kill.step
    final = store.load_latest()
    assert final is not None and final.samples == SAMPLES  # not one more: nothing trained twice
    ends = bus.end_offsets(topics.samples)
    assert final.offsets == ends and sum(ends.values()) == SAMPLES

    import mlflow

    from online_rl.tracking import mlflow_client

    client = mlflow_client(settings)
    versions = sorted(int(v.version) for v in client.search_model_versions("name='policy'"))
    assert len(versions) >= 2 and versions == list(range(1, len(versions) + 1))
    manifests = [read_lineage(Path(mlflow.artifacts.download_artifacts(
        f"models:/policy/{v}", dst_path=str(tmp_path / f"v{v}")))) for v in versions]
    for partition in range(2):
        position = 0
        for manifest in manifests:
            window = manifest.offsets.get(topics.samples, {}).get(str(partition))
            if window is not None:
                assert window[0] == position < window[1], (partition, [m.offsets for m in manifests])
                position = window[1]
        assert position == ends[TopicPartition(topics.samples, partition)]
    assert [m.parent_version for m in manifests] == [None, *[f"policy-v{v}" for v in versions[:-1]]]
    bus.close()
