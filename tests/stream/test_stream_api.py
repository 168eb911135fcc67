"""The Stream API: fluent transformations, cold-start mixing, and batches that carry offsets."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from online_rl.bus import TopicPartition, Topics, ensure_topics
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample, encode
from online_rl.stream import Stream
from online_rl.stream.join import JoinConfig, JoinState
from tests.factories import BusFactory, interaction, thumbs


def _samples(count: int) -> list[TrainingSample]:
    state = JoinState(JoinConfig(window_s=1.0, retention_s=1.0))
    for i in range(count):
        state.add_interaction(interaction(f"r{i}", created_at=100.0))
        state.add_feedback(thumbs(f"r{i}", up=i % 2 == 0, created_at=100.5))
    return state.advance(200.0)


def test_map_filter_and_batch_on_local_items() -> None:
    stream = Stream.from_iterable(range(10)).map(lambda x: x * 10).filter(lambda x: x % 20 == 0)
    batches = list(stream.batch(2))
    assert [b.items for b in batches] == [[0, 20], [40, 60], [80]]


def test_mix_adds_the_declared_share_of_cold_start_items(tmp_path: Path) -> None:
    cold = tmp_path / "cold.jsonl"
    cold.write_text("\n".join(json.dumps({"cold": i}) for i in range(3)) + "\n")
    out = list(Stream.from_iterable(range(80)).mix(cold, weight=0.2))
    cold_items = [x for x in out if isinstance(x, dict)]
    assert len(out) == 100 and len(cold_items) == 20
    assert {c["cold"] for c in cold_items} == {0, 1, 2}


def test_mix_rejects_bad_weights_and_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"weight=1.5"):
        Stream.from_iterable([1]).mix([{"a": 1}], weight=1.5)
    with pytest.raises(ConfigError, match="does not exist"):
        Stream.from_iterable([1]).mix(tmp_path / "nope.jsonl", weight=0.1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"ok": 1}\n{oops\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2"):
        Stream.from_iterable([1]).mix(bad, weight=0.1)


def test_batches_from_a_topic_cover_every_consumed_offset(make_bus: BusFactory, tmp_path: Path) -> None:
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    SAMPLES, DLQ = topics.samples, topics.dlq
    samples = _samples(12)
    producer = bus.producer()
    for sample in samples:
        producer.produce(SAMPLES, encode(sample), sample.sample_id.encode())
    producer.produce(SAMPLES, b"\x01garbage", b"bad")
    producer.flush()
    ends = bus.end_offsets(SAMPLES)
    cold = tmp_path / "cold.jsonl"
    cold.write_text(samples[0].model_dump_json() + "\n")

    group = f"trainer-{uuid.uuid4().hex[:6]}"
    stream = (
        Stream.from_topic(SAMPLES, bus, group_id=group, poll_timeout=0.3, dlq_topic=DLQ)
        .filter(lambda s: bool(s.label))
        .mix(cold, weight=0.25, parse=TrainingSample.model_validate)
    )
    trained: list[TrainingSample] = []
    covered: dict[TopicPartition, int] = {}
    for batch in stream.batch(4, timeout=2.0):
        trained.extend(batch.items)
        batch.commit()
        for tp, offset in batch.offsets.items():
            covered[tp] = max(covered.get(tp, 0), offset)
        if covered == {tp: end for tp, end in ends.items() if end}:
            break
    live = [s for s in trained if s.sample_id != samples[0].sample_id or s.label]
    assert sorted({s.sample_id for s in live}) == sorted(s.sample_id for s in samples if s.label)
    assert sum(1 for s in trained if s.sample_id == samples[0].sample_id) >= 2  # live + cold copies
    stream.close()

    consumer = bus.consumer(group)
    assert consumer.committed(list(ends)) == ends
    consumer.close()
    assert any(r.header("source.topic") == SAMPLES.encode() for r in bus.read_all(DLQ))


def test_a_stream_waits_out_the_bus_away_and_a_missing_topic_fails_at_start(make_bus: BusFactory) -> None:
    """After its first poll, a bus that is away (or a restarted cluster that does not know the topic
    for a moment) makes the stream wait, not end: the trainer keeps its consumer and its place. A topic
    missing at the first poll is a configuration error and ends it."""
    from online_rl.bus import BusUnavailable, UnknownTopic

    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=1, topics=topics)
    samples = _samples(4)
    producer = bus.producer()
    for sample in samples:
        producer.produce(topics.samples, encode(sample), sample.sample_id.encode())
    producer.flush()
    stream = Stream.from_topic(topics.samples, bus, group_id=f"g-{uuid.uuid4().hex[:6]}", poll_timeout=0.2,
                               dlq_topic=topics.dlq)
    assert stream.consumer is not None
    consumer, poll, calls, raised = stream.consumer, stream.consumer.poll, [0], []

    def flaky(max_records: int = 500, timeout: float = 1.0) -> list:
        calls[0] += 1
        # once a poll has answered with the group formed: the bus away, then the topic unknown
        if calls[0] > 1 and consumer.assignment() and len(raised) < 2:
            raised.append((BusUnavailable, UnknownTopic)[len(raised)]("the cluster is coming back"))
            raise raised[-1]
        return poll(1 if not raised else max_records, timeout)

    stream.consumer.poll = flaky  # type: ignore[method-assign]
    got = next(iter(stream.batch(4, timeout=60.0)))
    assert sorted(s.sample_id for s in got.items) == sorted(s.sample_id for s in samples)
    assert [type(e) for e in raised] == [BusUnavailable, UnknownTopic]
    stream.close()

    with pytest.raises(UnknownTopic, match="nothing"):  # a topic that does not exist: said at once
        Stream.from_topic(f"{topics.prefix}.nothing", bus, group_id="g-missing", dlq_topic=topics.dlq)
    fresh = Stream.from_topic(topics.samples, bus, group_id="g-fresh", poll_timeout=0.2, dlq_topic=topics.dlq)
    assert fresh.consumer is not None

    def unknown(max_records: int = 500, timeout: float = 1.0) -> list:
        raise UnknownTopic("no such topic")

    fresh.consumer.poll = unknown  # type: ignore[method-assign]
    with pytest.raises(UnknownTopic):  # before any poll answered: the configuration is wrong
        next(iter(fresh.batch(4, timeout=1.0)))
    fresh.close()
