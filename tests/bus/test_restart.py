"""A consumer killed mid-batch loses nothing and re-processes nothing it had committed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from online_rl.bus import Bus
from online_rl.bus.embedded import EmbeddedBus
from online_rl.bus.kafka import KafkaBus

ROOT = Path(__file__).resolve().parents[2]
TOTAL = 240


def _lines(path: Path) -> list[tuple[int, int, int]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, partition, offset = line.split()
        out.append((int(pid), int(partition), int(offset)))
    return out


def _worker(backend: str, where: str, topic: str, group: str, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bus.worker", "--backend", backend, "--where", where,
         "--topic", topic, "--group", group, "--out", str(out)],
        cwd=ROOT,
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def test_killed_consumer_resumes_without_loss_or_committed_repeats(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    where = str(tmp_path / "bus.db") if backend == "embedded" else request.getfixturevalue("kafka_bootstrap")
    bus: Bus = EmbeddedBus(Path(where)) if backend == "embedded" else KafkaBus(where)
    topic, group = f"kill.{uuid.uuid4().hex[:8]}", f"g.{uuid.uuid4().hex[:8]}"
    bus.create_topic(topic, partitions=2)
    producer = bus.producer()
    for i in range(TOTAL):
        producer.produce(topic, str(i).encode(), key=str(i).encode())
    producer.flush()

    first = _worker(backend, where, topic, group, tmp_path)
    deadline = time.monotonic() + 120
    while len(_lines(tmp_path / "processed")) < TOTAL // 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    first_commits = _lines(tmp_path / "commits")
    assert first_commits, "the first lifetime committed nothing before the kill"
    committed = {}
    for _, partition, offset in first_commits:
        committed[partition] = max(committed.get(partition, 0), offset)

    second = _worker(backend, where, topic, group, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = {(p, o) for pid, p, o in _lines(tmp_path / "processed") if pid == second.pid}
            ends = bus.end_offsets(topic)
            if all((tp.partition, end - 1) in done or end == committed.get(tp.partition, 0)
                   for tp, end in ends.items()):
                break
            time.sleep(0.1)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait()
    bus.close()

    processed = _lines(tmp_path / "processed")
    seen = {(p, o) for _, p, o in processed}
    assert len(seen) == TOTAL, "every record is processed at least once"
    for pid, partition, offset in processed:
        if pid == second.pid:
            assert offset >= committed.get(partition, 0), (
                f"record {partition}:{offset} was committed before the kill and processed again"
            )
