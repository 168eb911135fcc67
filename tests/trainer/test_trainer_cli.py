"""`online-rl trainer` as its own process: it trains what arrives, and SIGTERM stops it cleanly with
its last step checkpointed and committed (on the embedded bus, with a real MLflow store and Ray)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from online_rl.bus import TopicPartition, ensure_topics
from online_rl.bus.embedded import EmbeddedBus
from online_rl.config import Settings
from online_rl.ports import free_port
from online_rl.trainer import CheckpointStore
from tests.conftest import TINY_NAME
from tests.trainer.test_trainer import _pair, send

pytestmark = pytest.mark.slow


def test_sigterm_finishes_the_step_checkpoints_commits_and_exits(tiny_model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ORL_CACHE_DIR": str(tmp_path / "cache"), "ORL_MODEL__NAME": TINY_NAME,
           "ORL_MODEL__PATH": str(tiny_model), "ORL_TRAINER__BATCH_SIZE": "4",
           "ORL_TRAINER__BATCH_TIMEOUT_S": "0.5", "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": "8",
           "ORL_MLFLOW__REGISTERED_MODEL": "policy"}
    env.pop("ORL_KAFKA__BOOTSTRAP_SERVERS", None)
    settings = Settings(cache_dir=tmp_path / "cache")
    bus = EmbeddedBus(settings.bus_path)
    topics = settings.topics
    ensure_topics(bus, topics, 1)
    producer = bus.producer()
    rng = random.Random(3)
    send(producer, topics.samples, [_pair(i, rng) for i in range(8)])

    port = free_port()
    command = [sys.executable, "-m", "online_rl.cli", "trainer", "--metrics-port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store = CheckpointStore(settings.checkpoint_dir)
    try:
        deadline, scraped = time.monotonic() + 180, ""
        while time.monotonic() < deadline and process.poll() is None:
            latest = store.load_latest() if (store.root / "latest").exists() else None
            # (the write-ahead checkpoint of a publish already reads 8 samples: wait for the version too)
            if latest is not None and latest.samples == 8:
                scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
                if "orl_trainer_last_published_version 1.0" in scraped:
                    break
            time.sleep(1)
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        assert "orl_trainer_samples_total 8.0" in scraped
        assert "orl_trainer_last_published_version 1.0" in scraped
        assert "orl_trainer_lag_records 0.0" in scraped
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert "trained 8 samples" in output and "published this run: policy-v1" in output
    checkpoint = store.load_latest()
    tp = TopicPartition(topics.samples, 0)
    assert checkpoint is not None and checkpoint.offsets == {tp: 8}
    consumer = bus.consumer(settings.trainer.group_id)
    assert consumer.committed([tp]) == {tp: 8}
    consumer.close()
    bus.close()
