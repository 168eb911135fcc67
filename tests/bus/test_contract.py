"""The bus contract, run against the embedded log and a real Kafka broker alike."""

from __future__ import annotations

import time
import uuid

import pytest

from online_rl.bus import (
    Bus,
    CommitFailed,
    DeadLetters,
    Producer,
    TopicPartition,
    UnknownTopic,
    decode_or_dead_letter,
    partition_for,
)
from online_rl.bus.kafka import KafkaBus
from online_rl.events import Interaction
from tests.factories import BusFactory, drain


def _group() -> str:
    return f"g.{uuid.uuid4().hex[:8]}"


def _send_keyed(producer: Producer, topic: str, numbers: range) -> None:
    """Each number as a record keyed by itself (so spread over the partitions), confirmed."""
    for i in numbers:
        producer.produce(topic, str(i).encode(), key=str(i).encode())
    producer.flush()


def test_send_confirms_and_keys_keep_order_on_their_partition(bus: Bus, topic: str) -> None:
    bus.create_topic(topic, partitions=3)
    producer = bus.producer()
    meta = producer.send(topic, b"first", key=b"k0")
    assert meta.partition == partition_for(b"k0", 3)
    for i in range(60):
        producer.produce(topic, f"{i}".encode(), key=f"k{i % 4}".encode())
    confirmed = producer.flush()
    assert len(confirmed) == 60
    producer.close()

    consumer = bus.consumer(_group())
    consumer.subscribe([topic])
    records = drain(consumer, 61)
    consumer.close()
    assert len(records) == 61
    by_key: dict[bytes, list[int]] = {}
    for record in records:
        assert record.key is not None
        assert record.partition == partition_for(record.key, 3)
        if record.value != b"first":
            by_key.setdefault(record.key, []).append(int(record.value))
    for key, values in by_key.items():
        assert values == sorted(values), key


def test_commit_then_resume_in_a_new_consumer(bus: Bus, topic: str) -> None:
    bus.create_topic(topic, partitions=1)
    producer = bus.producer()
    for i in range(50):
        producer.produce(topic, str(i).encode())
    producer.flush()
    group = _group()
    first = bus.consumer(group)
    first.subscribe([topic])
    batch = drain(first, 50)
    processed = batch[:30]
    first.commit(first.next_offsets(processed))
    first.close()

    second = bus.consumer(group)
    second.subscribe([topic])
    rest = drain(second, 20)
    assert [int(r.value) for r in rest] == list(range(30, 50))
    tp = TopicPartition(topic, 0)
    assert second.committed([tp]) == {tp: 30}
    # Seek back to the stored offset and read again.
    second.seek(tp, 10)
    again = drain(second, 40)
    assert [int(r.value) for r in again] == list(range(10, 50))
    second.close()

    # A member that keeps its own offsets (the trainer's checkpoint) starts where it says, even
    # before the group's committed offset, from the moment the partition is assigned.
    third = bus.consumer(group)
    seen: list[TopicPartition] = []

    def start_at_checkpoint(assigned: list[TopicPartition]) -> dict[TopicPartition, int]:
        seen.extend(assigned)
        return {tp: 20}

    third.subscribe([topic], on_assign=start_at_checkpoint)
    resumed = drain(third, 30)
    assert seen == [tp]
    assert [int(r.value) for r in resumed] == list(range(20, 50))
    third.close()


def test_two_consumers_share_a_group_and_take_over_when_one_leaves(
    make_bus: BusFactory, topic: str
) -> None:
    bus = make_bus(session_timeout=6.0)
    bus.create_topic(topic, partitions=4)
    group = _group()
    a, b = bus.consumer(group), bus.consumer(group)
    revoked: list[TopicPartition] = []
    a.subscribe([topic], on_revoke=revoked.extend)
    a.poll(10, 3.0)
    assert len(a.assignment()) == 4
    b.subscribe([topic])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (a.assignment() and b.assignment()
                                                and len(a.assignment()) + len(b.assignment()) == 4):
        a.poll(10, 0.2)
        b.poll(10, 0.2)
    assert set(a.assignment()).isdisjoint(b.assignment())
    assert len(a.assignment()) + len(b.assignment()) == 4
    assert revoked, "a must hand partitions back when b joins"

    producer = bus.producer()
    for i in range(40):
        producer.produce(topic, str(i).encode(), key=str(i).encode())
    producer.flush()
    seen: list[int] = []
    deadline = time.monotonic() + 30
    while len(seen) < 40 and time.monotonic() < deadline:
        for consumer in (a, b):
            got = consumer.poll(100, 0.2)
            seen.extend(int(r.value) for r in got)
            consumer.commit(consumer.next_offsets(got))
    assert sorted(seen) == list(range(40))

    b.close()
    for i in range(40, 50):
        producer.produce(topic, str(i).encode(), key=str(i).encode())
    producer.flush()
    rest = drain(a, 10)
    assert sorted(int(r.value) for r in rest) == list(range(40, 50))
    assert len(a.assignment()) == 4
    a.close()


def test_work_committed_in_on_revoke_is_not_handed_out_again(make_bus: BusFactory, topic: str) -> None:
    bus = make_bus(session_timeout=6.0)
    bus.create_topic(topic, partitions=2)
    producer = bus.producer()
    _send_keyed(producer, topic, range(20))
    group = _group()
    a = bus.consumer(group)
    processed: list[int] = []
    done: dict[TopicPartition, int] = {}

    def hand_back(partitions: list[TopicPartition]) -> None:
        a.commit({tp: done[tp] for tp in partitions if tp in done})

    a.subscribe([topic], on_revoke=hand_back)
    for record in drain(a, 20):
        processed.append(int(record.value or b""))
        done[record.tp] = record.offset + 1
    b = bus.consumer(group)
    b.subscribe([topic])
    again: list[int] = []
    deadline = time.monotonic() + 30
    while not b.assignment() and time.monotonic() < deadline:
        a.poll(10, 0.2)
        again.extend(int(r.value or b"") for r in b.poll(10, 0.2))
    again.extend(int(r.value or b"") for r in b.poll(100, 1.0))
    assert sorted(processed) == list(range(20))
    assert again == [], "records committed in on_revoke were handed to the new owner again"
    a.close()
    b.close()


def test_commit_for_a_partition_no_longer_owned_is_refused(make_bus: BusFactory, topic: str) -> None:
    bus = make_bus(session_timeout=6.0)
    bus.create_topic(topic, partitions=2)
    producer = bus.producer()
    _send_keyed(producer, topic, range(10))
    group = _group()
    a = bus.consumer(group)
    a.subscribe([topic])
    got = drain(a, 10)
    b = bus.consumer(group)
    b.subscribe([topic])
    deadline = time.monotonic() + 30
    while not b.assignment() and time.monotonic() < deadline:
        a.poll(10, 0.2)
        b.poll(10, 0.2)
    lost = [tp for tp in a.next_offsets(got) if tp not in a.assignment()]
    assert lost
    with pytest.raises(CommitFailed):
        a.commit({tp: off for tp, off in a.next_offsets(got).items() if tp in lost})
    a.close()
    b.close()


def test_hold_keeps_the_group_membership_through_a_long_step(make_bus: BusFactory, topic: str) -> None:
    bus = make_bus(session_timeout=6.0)
    bus.create_topic(topic, partitions=1)
    producer = bus.producer()
    for i in range(5):
        producer.produce(topic, str(i).encode())
    producer.flush()
    consumer = bus.consumer(_group())
    consumer.subscribe([topic])
    batch = drain(consumer, 5)
    with consumer.hold():
        time.sleep(9.0)  # longer than the session and max poll interval
    consumer.commit(consumer.next_offsets(batch))
    assert consumer.committed([TopicPartition(topic, 0)]) == {TopicPartition(topic, 0): 5}
    producer.send(topic, b"5")
    assert [r.value for r in drain(consumer, 1)] == [b"5"]
    consumer.close()


def test_a_partition_lost_during_a_hold_is_read_again_when_it_comes_back(
        make_bus: BusFactory, topic: str) -> None:
    """A step held through a rebalance that takes a partition away (a session lost in an outage, or a
    new member) and the partition given back after the step: its new records reach the consumer.
    (Kafka's client kept the hold's pause on the partition across the rebalance, so the trainer never
    read it again after a whole-cluster outage.)"""
    bus = make_bus(session_timeout=6.0)
    bus.create_topic(topic, partitions=2)
    producer = bus.producer()
    _send_keyed(producer, topic, range(10))
    group = _group()
    a = bus.consumer(group)
    a.subscribe([topic])
    a.commit(a.next_offsets(drain(a, 10)))
    b = bus.consumer(group)
    with a.hold():  # a's step: its partitions paused while b joins (on Kafka, b takes one meanwhile)
        b.subscribe([topic])
        deadline = time.monotonic() + 20
        while not b.assignment() and time.monotonic() < deadline:
            b.poll(10, 0.2)
        moved_in_hold = len(a.assignment()) < 2
    # the embedded bus hands a partition over at the holder's next poll, Kafka's during the hold
    assert moved_in_hold or not isinstance(bus, KafkaBus), a.assignment()
    deadline = time.monotonic() + 30
    while not (b.assignment() and len(a.assignment()) == 1) and time.monotonic() < deadline:
        a.poll(10, 0.2)
        b.poll(10, 0.2)
    assert b.assignment() and len(a.assignment()) == 1, (a.assignment(), b.assignment())
    lost = b.assignment()
    b.close()  # ... and leaves after a's step: a owns both partitions again
    _send_keyed(producer, topic, range(10, 20))
    got = drain(a, 10, timeout=45)
    assert sorted(int(r.value or b"") for r in got) == list(range(10, 20)), (lost, got)
    assert {TopicPartition(r.topic, r.partition) for r in got} >= set(lost)
    a.close()


def test_transaction_writes_records_and_offsets_together_or_not_at_all(bus: Bus, topic: str) -> None:
    source, sink = topic + ".in", topic + ".out"
    bus.create_topic(source, 1)
    bus.create_topic(sink, 1)
    plain = bus.producer()
    for i in range(6):
        plain.produce(source, str(i).encode())
    plain.flush()
    group = _group()
    consumer = bus.consumer(group)
    consumer.subscribe([source])
    batch = drain(consumer, 6)
    txn = bus.producer(transactional_id=f"tx-{topic}")
    txn.begin_transaction()
    txn.produce(sink, b"aborted")
    txn.abort_transaction()
    txn.begin_transaction()
    for record in batch[:3]:
        txn.produce(sink, record.value)
    txn.commit_transaction(consumer.next_offsets(batch[:3]), consumer)
    out = list(bus.read_all(sink))
    assert [r.value for r in out] == [b"0", b"1", b"2"]
    tp = TopicPartition(source, 0)
    assert consumer.committed([tp]) == {tp: 3}
    consumer.close()
    txn.close()


def test_unknown_topic_is_a_clear_error(bus: Bus) -> None:
    with pytest.raises(UnknownTopic, match="create it first"):
        bus.partitions(f"missing.{uuid.uuid4().hex[:6]}")


def test_undecodable_records_go_to_the_dead_letter_topic(bus: Bus, topic: str) -> None:
    bus.create_topic(topic, 1)
    dlq = f"{topic}.dlq"
    bus.create_topic(dlq, 1)
    producer = bus.producer()
    producer.produce(topic, b"\x01\x93garbage", key=b"r1")
    producer.flush()
    consumer = bus.consumer(_group())
    consumer.subscribe([topic])
    records = drain(consumer, 1)
    dead = DeadLetters(producer, "test", dlq)
    assert decode_or_dead_letter(records, Interaction, dead) == []
    producer.flush()
    letters = list(bus.read_all(dlq))
    consumer.close()
    assert len(letters) == 1
    letter = letters[0]
    assert letter.value == b"\x01\x93garbage" and letter.key == b"r1"
    assert letter.header("source.topic") == topic.encode()
    assert letter.header("source.offset") == b"0"
    assert b"MalformedRecord" in (letter.header("reason") or b"")
