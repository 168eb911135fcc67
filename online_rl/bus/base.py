"""The bus contract: what every backend (Kafka, embedded) provides, with identical semantics.

- Producers: `produce` queues a record, `flush` waits until every queued record is durably
  written (Kafka: acks=all, idempotent) and raises `DeliveryError` otherwise; `send` does both for
  one record. A transactional producer writes records and a consumer group's offsets atomically.
- Consumers: explicit commits only (the next offset to read, per partition), `seek`, pause-free
  `hold()` for long processing steps, rebalance callbacks that hand partitions back.
- Keys pick partitions with Kafka's Java-compatible murmur2 hash on both backends.

Backends know nothing about events; events know nothing about backends.
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

from online_rl.bus.errors import BusError, BusUnavailable

__all__ = [
    "AssignCallback",
    "Bus",
    "Consumer",
    "Producer",
    "RebalanceCallback",
    "Record",
    "RecordMetadata",
    "TopicPartition",
    "murmur2",
    "partition_for",
]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int


class Record(NamedTuple):
    """One record read from the bus (a named tuple: cheap to build on the hot path)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # None: a tombstone (compacted topics)
    timestamp: float
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)

    def header(self, name: str) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a confirmed record was written."""

    topic: str
    partition: int
    offset: int


Headers = Sequence[tuple[str, bytes]]
RebalanceCallback = Callable[[list[TopicPartition]], None]
# Called with newly assigned partitions; may return where to start reading some of them (the trainer
# resumes at its checkpoint's offsets, which can lie before the group's committed ones).
AssignCallback = Callable[[list[TopicPartition]], Mapping[TopicPartition, int] | None]


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (as in the Java client's default partitioner), as a signed 32-bit int."""
    m, r = 0x5BD1E995, 24
    length = len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    full = length & ~3
    for i in range(0, full, 4):
        k = data[i] | data[i + 1] << 8 | data[i + 2] << 16 | data[i + 3] << 24
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = length & 3
    if tail == 3:
        h ^= data[full + 2] << 16
    if tail >= 2:
        h ^= data[full + 1] << 8
    if tail >= 1:
        h ^= data[full]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes, partitions: int) -> int:
    """The partition Kafka's Java-compatible partitioner picks for `key`."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


class Producer(abc.ABC):
    """Writes records; see the module docstring for the delivery contract."""

    @abc.abstractmethod
    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        """Queue one record (value None: a tombstone). Confirmation comes with `flush`. The partition is
        the key's (`partition_for`) unless `partition` names one: a task's changelog keeps entries
        whose keys hash elsewhere on the task's own partition."""

    @abc.abstractmethod
    def flush(self, timeout: float = 30.0) -> list[RecordMetadata]:
        """Wait until every queued record is confirmed; return where each went (delivery order).

        Raises `DeliveryError` if any failed or `BusUnavailable` if confirmation timed out.
        """

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        timeout: float = 30.0,
    ) -> RecordMetadata:
        """Write one record and wait for its confirmation."""
        self.produce(topic, value, key, headers)
        return self.flush(timeout)[-1]

    # Transactions (only for producers made with a transactional id).
    def begin_transaction(self) -> None:
        raise BusError("this producer is not transactional; create it with a transactional_id")

    def commit_transaction(
        self, offsets: Mapping[TopicPartition, int], consumer: Consumer, timeout: float = 30.0
    ) -> None:
        """Atomically make the transaction's records visible and commit `consumer`'s offsets."""
        raise BusError("this producer is not transactional; create it with a transactional_id")

    def abort_transaction(self, timeout: float = 30.0) -> None:
        raise BusError("this producer is not transactional; create it with a transactional_id")

    @abc.abstractmethod
    def close(self) -> None: ...


class Consumer(abc.ABC):
    """Reads records as a member of a consumer group; commits are explicit."""

    group_id: str

    @abc.abstractmethod
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: AssignCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> None:
        """Join the group for `topics`. `on_assign` runs when partitions arrive and may return the
        offsets to start them at (default: the group's committed offsets). `on_revoke` runs before
        partitions move away: commit what is durably processed there; anything uncommitted is
        re-read by the next owner."""

    @abc.abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        """Up to `max_records` records, waiting at most `timeout` seconds for the first."""

    @abc.abstractmethod
    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit the next offset to read for each partition (synchronously)."""

    @abc.abstractmethod
    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        """The group's committed next offsets (None: nothing committed)."""

    @abc.abstractmethod
    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next `poll` on an assigned partition start at `offset`."""

    @abc.abstractmethod
    def position(self, tp: TopicPartition) -> int | None:
        """The offset the next `poll` would read on an assigned partition (None: not yet known)."""

    @abc.abstractmethod
    def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        """The next offset that would be written on each partition (cheap: may be cached)."""

    @abc.abstractmethod
    def assignment(self) -> list[TopicPartition]: ...

    def commit_owned(self, offsets: Mapping[TopicPartition, int]) -> list[TopicPartition]:
        """Commit the offsets of the partitions this consumer still owns; return the others, which a
        rebalance gave to another member (their new owner re-reads them from the last commit). Raises
        `CommitFailed` when the group refuses even those (this member was evicted)."""
        owned = set(self.assignment())
        mine = {tp: offset for tp, offset in offsets.items() if tp in owned}
        if mine:
            self.commit(mine)
        return sorted(set(offsets) - set(mine))

    @abc.abstractmethod
    def hold(self) -> AbstractContextManager[None]:
        """Keep group membership alive while the caller works on a batch for a long time."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the group without committing anything."""

    @staticmethod
    def next_offsets(records: Sequence[Record]) -> dict[TopicPartition, int]:
        """The offsets to commit after processing `records`: last offset + 1 per partition."""
        last: dict[tuple[str, int], int] = {}
        for record in records:
            key = (record.topic, record.partition)
            if record.offset >= last.get(key, -1):
                last[key] = record.offset
        return {TopicPartition(t, p): offset + 1 for (t, p), offset in last.items()}


class Bus(abc.ABC):
    """A factory of producers and consumers over one backend, plus topic admin."""

    @abc.abstractmethod
    def create_topic(self, name: str, partitions: int = 1, compact: bool = False) -> None:
        """Create the topic if it does not exist (an existing one is left as it is)."""

    @abc.abstractmethod
    def partitions(self, topic: str) -> int:
        """Number of partitions of `topic`; raises `UnknownTopic`."""

    @abc.abstractmethod
    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        """The next offset that would be written, per partition."""

    @abc.abstractmethod
    def producer(self, transactional_id: str | None = None) -> Producer: ...

    @abc.abstractmethod
    def consumer(self, group_id: str, auto_offset_reset: str = "earliest") -> Consumer: ...

    def read_all(
        self, topic: str, timeout: float = 30.0, partitions: Collection[int] | None = None
    ) -> Iterator[Record]:
        """Every record currently in `topic`, or in its `partitions` only (a throw-away consumer;
        nothing committed).

        Raises `BusUnavailable` if it cannot reach the end within `timeout`: a partial read must
        never pass for a complete one (restoring state from a changelog relies on it)."""
        ends = {tp: end for tp, end in self.end_offsets(topic).items()
                if end > 0 and (partitions is None or tp.partition in partitions)}
        if not ends:
            return
        consumer = self.consumer(f"read-all-{uuid.uuid4().hex}")
        try:
            consumer.subscribe([topic])
            deadline = time.monotonic() + timeout
            while ends:
                if time.monotonic() >= deadline:
                    raise BusUnavailable(
                        f"could not read {topic} to its end within {timeout}s ({len(ends)} partitions left)"
                    )
                for record in consumer.poll(1000, 0.2):
                    if partitions is None or record.partition in partitions:
                        yield record
                # Positions, not record offsets: transaction markers occupy offsets too.
                for tp in [tp for tp in ends if (consumer.position(tp) or 0) >= ends[tp]]:
                    del ends[tp]
        finally:
            consumer.close()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release backend resources."""
