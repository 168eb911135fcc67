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


def _assigned(consumer: object) -> list[bytes]:
    """Poll until `consumer` has its partitions; the values it read meanwhile."""
    got: list[bytes] = []
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        got += [r.value for r in consumer.poll(10, 0.5) if r.value is not None]  # type: ignore[attr-defined]
    assert consumer.assignment(), "no partition assigned within 60 s"  # type: ignore[attr-defined]
    return got


@pytest.mark.kafka
def test_a_group_offset_beyond_the_logs_end_resumes_at_the_end_instead_of_replaying(
        kafka_bootstrap: str) -> None:
    """The log lost records this group had read (a recreated topic, a broker that lost its tail): the
    group's offset lies beyond the end. `earliest` would replay the whole log (every sample again); the
    consumer starts at the end, reads only what comes next, and says how many records were lost."""
    from online_rl.bus.base import TopicPartition

    bus = KafkaBus(kafka_bootstrap)
    topic, group = f"beyond-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    bus.create_topic(topic, 1)
    producer = bus.producer()
    for i in range(5):
        producer.produce(topic, f"old-{i}".encode(), b"k")
    producer.flush()
    first = bus.consumer(group)
    first.subscribe([topic])
    _assigned(first)
    first.commit({TopicPartition(topic, 0): 100})  # as if it had read 100 records the log no longer has
    first.close()

    second = bus.consumer(group)
    second.subscribe([topic])
    got = _assigned(second)
    for i in range(3):
        producer.produce(topic, f"new-{i}".encode(), b"k")
    producer.flush()
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        got += [r.value for r in second.poll(100, 0.5) if r.value is not None]
    got += [r.value for r in second.poll(100, 1.0) if r.value is not None]
    assert got == [b"new-0", b"new-1", b"new-2"]  # none of the old records again
    assert second.offset_resets == [  # type: ignore[attr-defined]
        {"topic": topic, "partition": 0, "offset": 100, "high": 5, "lost": 95}]
    second.close()
    bus.close()
