"""Joiner replicas as real processes on one broker: one SIGKILLed and one added mid-stream, every
sample still comes out exactly once (the task model of docs/event-log.md, "Scaling out")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx
import pytest

from online_rl.bus import Topics, partition_for
from online_rl.bus.kafka import KafkaBus
from online_rl.events import TrainingSample, decode, encode
from online_rl.ports import free_port
from tests.factories import interaction, preference, thumbs

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

PARTITIONS = 6
WAVES, PER_WAVE, PAIRS_PER_WAVE = 8, 50, 10


def test_three_joiners_one_killed_one_added_every_sample_once(kafka_bootstrap: str, tmp_path: Path) -> None:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix=prefix)
    env = {**os.environ, "ORL_CACHE_DIR": str(tmp_path), "ORL_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
           "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_BUS__PARTITIONS": str(PARTITIONS),
           "ORL_JOIN__WINDOW_S": "3", "ORL_JOIN__RETENTION_S": "600"}
    metrics_port = free_port()
    logs: list[Path] = []

    def start(instance: str, *extra: str) -> subprocess.Popen[bytes]:
        log = tmp_path / f"joiner-{instance}.log"
        logs.append(log)
        return subprocess.Popen([sys.executable, "-m", "online_rl.cli", "join", *extra],
                                env={**env, "ORL_JOIN__INSTANCE": instance}, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT)

    bus = KafkaBus(kafka_bootstrap)
    joiners = {name: start(name, *(["--metrics-port", str(metrics_port)] if name == "j0" else []))
               for name in ("j0", "j1", "j2")}
    expected_pairs: set[tuple[str, str]] = set()
    try:
        deadline = time.monotonic() + 120
        while not all(bus_has(bus, t) for t in (topics.interactions, topics.join_pairs)):
            assert time.monotonic() < deadline, "the joiners did not create their topics"
            time.sleep(0.5)
        producer = bus.producer()
        for wave in range(WAVES):
            now = time.time()
            ids = [f"w{wave}-{i}" for i in range(PER_WAVE)]
            for i, rid in enumerate(ids):
                producer.produce(topics.interactions, encode(interaction(rid, created_at=now)), rid.encode())
                producer.produce(topics.feedback, encode(thumbs(rid, up=i % 2 == 0, created_at=now + 0.1)),
                                 rid.encode())
            for i in range(PAIRS_PER_WAVE):
                a, b = ids[i], ids[PER_WAVE - 1 - i]
                producer.produce(topics.feedback, encode(preference(a, b, created_at=now + 0.2)), a.encode())
                expected_pairs.add((a, b))
            producer.flush()
            if wave == 2:
                joiners["j1"].send_signal(signal.SIGKILL)  # no hand-over: its tasks move after the session
            if wave == 4:
                joiners["j3"] = start("j3")
            time.sleep(2.0)
        assert sum(partition_for(a.encode(), PARTITIONS) != partition_for(b.encode(), PARTITIONS)
                   for a, b in expected_pairs) > len(expected_pairs) // 2
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        assert "orl_joiner_tasks " in metrics and 'orl_joiner_records_total{outcome="joined"}' in metrics

        expected = WAVES * PER_WAVE + len(expected_pairs)
        deadline = time.monotonic() + 240
        samples: list[TrainingSample] = []
        while time.monotonic() < deadline:
            samples = [decode(r.value or b"", TrainingSample)
                       for r in bus.read_all(topics.samples, timeout=60)]
            if len(samples) >= expected:
                break
            time.sleep(3.0)
        time.sleep(5.0)  # anything doubled would show up now
        samples = [decode(r.value or b"", TrainingSample) for r in bus.read_all(topics.samples, timeout=60)]
    finally:
        for proc in joiners.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in joiners.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        bus.close()
    tails = "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in logs)
    counts = Counter(s.sample_id for s in samples)
    assert [k for k, c in counts.items() if c > 1] == [], tails
    singles = {s.completion.request_id: s.reward for s in samples if s.kind == "single" and s.completion}
    want = {f"w{w}-{i}": 1.0 if i % 2 == 0 else 0.0 for w in range(WAVES) for i in range(PER_WAVE)}
    assert singles == want, (len(singles), len(want), tails)
    pairs = {(s.chosen.request_id, s.rejected.request_id) for s in samples if s.chosen and s.rejected}
    assert pairs == expected_pairs, tails
    assert joiners["j0"].returncode == 0 and joiners["j3"].returncode == 0, tails
    # The added joiner took tasks over (restored from the changelog), the killed one's among them.
    assert "restored" in (tmp_path / "joiner-j3.log").read_text(), tails


def bus_has(bus: KafkaBus, topic: str) -> bool:
    try:
        return bus.partitions(topic) == PARTITIONS
    except Exception:
        return False
