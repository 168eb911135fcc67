"""The Stream API: a fluent pipeline from a topic to training batches.

    topics = settings.topics
    Stream.from_topic(topics.samples, bus, dlq_topic=topics.dlq).map(fn).filter(fn) \
        .mix(cold_start, weight=0.2).batch(32)

Every batch carries the offsets it covers (every record consumed for it, including ones filtered
out or dead-lettered), so the trainer commits exactly what it trained on, and only once its
checkpoint is durable. The cold-start source (a JSONL file, a `datasets.Dataset`, or any iterable)
is interleaved at a fixed proportion of the output to keep the model anchored; it has no offsets.

The stream knows nothing about training.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from online_rl.bus import (
    Bus,
    BusUnavailable,
    Consumer,
    DeadLetters,
    Record,
    TopicPartition,
    UnknownTopic,
    decode_or_dead_letter,
)
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample, _Event

__all__ = ["Batch", "Stream"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
U = TypeVar("U")
E = TypeVar("E", bound=_Event)


@dataclass(frozen=True)
class _Item(Generic[T]):
    value: T | None
    record: Record | None = None
    kept: bool = True
    tick: bool = False  # the source was idle: lets time-based batching close a batch


@dataclass
class Batch(Generic[T]):
    """Items to train on and the offsets that cover them."""

    items: list[T]
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    cold_start: int = 0
    consumer: Consumer | None = field(default=None, repr=False)
    records: list[Record | None] = field(default_factory=list, repr=False)  # per item; None: cold start

    def commit(self) -> None:
        """Commit the offsets this batch covers (call only once its effect is durable)."""
        if self.consumer is not None and self.offsets:
            self.consumer.commit(self.offsets)


class Stream(Generic[T]):
    """A lazy pipeline of items; build it fluently, consume it with `batch()` or iteration."""

    def __init__(self, source: Callable[[], Iterator[_Item[T]]], consumer: Consumer | None = None) -> None:
        self._source = source
        self.consumer = consumer

    # -- sources ----------------------------------------------------------------------------
    @classmethod
    def from_topic(
        cls,
        topic: str,
        bus: Bus,
        *,
        dlq_topic: str,
        group_id: str = "orl-trainer",
        event_type: type[E] = TrainingSample,  # type: ignore[assignment]
        poll_timeout: float = 0.5,
        max_records: int = 500,
        start_offsets: Mapping[TopicPartition, int] | None = None,
        start_missing_at: int | None = None,
    ) -> Stream[E]:
        """Events of `event_type` from `topic`; undecodable records go to the dead-letter topic.

        `start_offsets` (a checkpoint's) override the group's committed offsets for those partitions,
        at every assignment; the mapping is read when a partition is assigned, so a caller may keep it
        up to date. With `start_missing_at`, partitions it does not list start there too.
        """
        # A missing topic is a configuration to fix, said now (a Kafka consumer would wait for it); a
        # bus that is away is waited for below.
        with contextlib.suppress(BusUnavailable):
            bus.partitions(topic)
        consumer = bus.consumer(group_id)
        starts: Mapping[TopicPartition, int] = start_offsets if start_offsets is not None else {}

        def start(assigned: list[TopicPartition]) -> dict[TopicPartition, int]:
            out = {tp: starts[tp] for tp in assigned if tp in starts}
            if start_missing_at is not None:
                out |= {tp: start_missing_at for tp in assigned if tp not in out}
            return out

        consumer.subscribe([topic], on_assign=start)
        producer = bus.producer()
        dead = DeadLetters(producer, f"stream:{group_id}", dlq_topic)

        def read() -> Iterator[_Item[E]]:
            polled, warned = False, -math.inf
            while True:
                try:
                    records = consumer.poll(max_records, poll_timeout)
                except (BusUnavailable, UnknownTopic) as exc:
                    if not polled and isinstance(exc, UnknownTopic):
                        raise  # at start: the topic is missing, a configuration to fix
                    # The cluster is away or still coming back (a restarted cluster may not know the
                    # topic for a moment): wait for it rather than end the stream and its consumer.
                    if time.monotonic() - warned > 30:
                        warned = time.monotonic()
                        logger.warning("%s: the bus is away (%s); waiting for it", topic, exc,
                                       extra={"event": "bus_away", "topic": topic, "reason": str(exc)})
                    time.sleep(1.0)
                    yield _Item(None, tick=True)
                    continue
                polled = polled or bool(records or consumer.assignment())
                if not records:
                    yield _Item(None, tick=True)
                    continue
                good = decode_or_dead_letter(records, event_type, dead)
                # Dead letters are durable before their offsets can be committed. A short outage is
                # waited out; letters the client gave up on (message.timeout.ms) end the stream, which
                # restarts from the committed offsets.
                while dead.count:
                    try:
                        producer.flush()
                        break
                    except BusUnavailable as exc:  # the bus is away: these records wait for it
                        logger.warning("%s: dead letters not confirmed (%s); retrying", topic, exc,
                                       extra={"event": "bus_away", "topic": topic, "reason": str(exc)})
                        time.sleep(1.0)
                decoded = {(r.tp, r.offset): event for r, event in good}
                for record in records:
                    event = decoded.get((record.tp, record.offset))
                    yield _Item(event, record, kept=event is not None)

        return Stream(read, consumer)

    @classmethod
    def from_iterable(cls, items: Iterable[T]) -> Stream[T]:
        """A finite stream over local items (no offsets); for tests and offline runs."""
        return Stream(lambda: (_Item(item) for item in items))

    # -- transformations --------------------------------------------------------------------
    def map(self, fn: Callable[[T], U]) -> Stream[U]:
        def run() -> Iterator[_Item[U]]:
            for item in self._source():
                if item.kept and not item.tick:
                    yield _Item(fn(item.value), item.record)  # type: ignore[arg-type]
                else:
                    yield _Item(None, item.record, kept=False, tick=item.tick)

        return Stream(run, self.consumer)

    def filter(self, fn: Callable[[T], bool]) -> Stream[T]:
        def run() -> Iterator[_Item[T]]:
            for item in self._source():
                if item.kept and not item.tick and not fn(item.value):  # type: ignore[arg-type]
                    yield _Item(None, item.record, kept=False)
                else:
                    yield item

        return Stream(run, self.consumer)

    def mix(
        self,
        cold_start: str | Path | Iterable[Any],
        weight: float,
        parse: Callable[[Any], T] | None = None,
        seed: int = 0,
    ) -> Stream[T]:
        """Interleave items from `cold_start` so they make up `weight` of the output.

        `cold_start` is a JSONL path or an iterable (e.g. a `datasets.Dataset`); it is shuffled
        with `seed` and cycled. `parse` turns each raw item into the stream's item type.
        """
        if not 0.0 <= weight < 1.0:
            raise ConfigError(f"mix weight={weight} must lie in [0, 1): the fraction of cold-start items")
        pool = _load_cold_start(cold_start)
        if not pool and weight > 0:
            raise ConfigError(f"cold-start source {cold_start!s:.80} is empty")
        random.Random(seed).shuffle(pool)
        convert: Callable[[Any], T] = parse or (lambda x: x)
        ratio = weight / (1.0 - weight)

        def run() -> Iterator[_Item[T]]:
            credit, index = 0.0, 0
            for item in self._source():
                yield item
                if not item.kept or item.tick:
                    continue
                credit += ratio
                while credit >= 1.0:
                    credit -= 1.0
                    yield _Item(convert(pool[index % len(pool)]), None, kept=True)
                    index += 1

        return Stream(run, self.consumer)

    # -- sinks ------------------------------------------------------------------------------
    def batch(self, size: int, timeout: float | None = None,
              idle_batches: bool = False) -> Iterator[Batch[T]]:
        """Batches of `size` items; with `timeout`, a partial batch after that many idle seconds.

        With `idle_batches`, an empty batch also comes every `timeout` seconds while the source has
        nothing, so that a long-running caller regains control (to stop, or to act on time).
        """
        if size < 1:
            raise ConfigError(f"batch size={size} must be >= 1")
        items: list[T] = []
        records: list[Record | None] = []
        offsets: dict[TopicPartition, int] = {}
        cold = 0
        started = time.monotonic()
        for item in self._source():
            if item.record is not None:
                tp = item.record.tp
                offsets[tp] = max(offsets.get(tp, 0), item.record.offset + 1)
            if item.kept and not item.tick:
                if not items:
                    started = time.monotonic()
                items.append(item.value)  # type: ignore[arg-type]
                records.append(item.record)
                cold += item.record is None
            expired = timeout is not None and time.monotonic() - started >= timeout
            if len(items) >= size or (expired and (items or offsets or idle_batches) and item.tick):
                yield Batch(items, offsets, cold, self.consumer, records)
                items, records, offsets, cold = [], [], {}, 0
                started = time.monotonic()
        if items or offsets:
            yield Batch(items, offsets, cold, self.consumer, records)

    def close(self) -> None:
        """Leave the consumer group (nothing is committed)."""
        if self.consumer is not None:
            self.consumer.close()

    def __iter__(self) -> Iterator[T]:
        for item in self._source():
            if item.kept and not item.tick:
                yield item.value  # type: ignore[misc]


def _load_cold_start(source: str | Path | Iterable[Any]) -> list[Any]:
    if isinstance(source, str | Path):
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"cold-start file {path} does not exist")
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number} is not valid JSON: {exc.msg}") from exc
        return rows
    return list(source)
