"""The joiner process: runs the join over the bus with exactly-once effect, one task per partition.

Interactions and feedback are keyed by request id, so request r lives on the same partition p of
both (they are co-partitioned; checked at start and per record). Partition p of `interactions`,
`feedback` and `join-pairs` is one task with its own `JoinState`, its own event-time watermark and
its own partition of the compacted changelog `join-state`. Any number of joiners share the tasks as
one consumer group (the range assignor hands out partition p of every topic together, as Kafka
Streams' tasks are). Each step reads a batch, feeds every task, and then in one bus transaction
writes the emitted samples to `samples`, the changed state to the changelog, preferences bound for
another task to `join-pairs`, rejected records to the DLQ, and the consumed offsets.

A task is rebuilt from its changelog partition whenever it is assigned (even to the joiner that held
it before: another may have moved it on meanwhile) and dropped when revoked; an aborted step rebuilds
every task and rewinds to the committed offsets. So after a crash, a rebalance or a scale-out nothing
is joined twice and nothing is dropped. Each joiner's transactional id (`<its group>-<instance>`, by default
`orl-joiner-<instance>`) fences a stale twin of itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from online_rl.bus import (
    Bus,
    BusUnavailable,
    CommitFailed,
    DeadLetters,
    ProducerBroken,
    Record,
    TopicPartition,
    Topics,
    decode_or_dead_letter,
    partition_for,
)
from online_rl.errors import ConfigError
from online_rl.events import Feedback, Interaction, TrainingSample, encode
from online_rl.faults import failpoint
from online_rl.stream.join import JoinConfig, JoinState, decode_forward

E = TypeVar("E", Interaction, Feedback)

__all__ = ["Joiner", "Snapshot", "StepResult"]

logger = logging.getLogger(__name__)
RESTORE_TIMEOUT_S = 120.0  # a crashed owner's open transaction holds its changelog for up to 30 s


@dataclass(frozen=True)
class StepResult:
    consumed: int
    emitted: int


@dataclass(frozen=True)
class Snapshot:
    """The joiner's figures after its last committed step, for another thread (the metrics server)."""

    stats: dict[str, int] = field(default_factory=dict)
    tasks: int = 0
    open_requests: int = 0
    lag: dict[TopicPartition, int] = field(default_factory=dict)
    watermark: float | None = None
    retries: int = 0
    producers_replaced: int = 0


@dataclass
class _Task:
    """One partition's join: its state, its watermark and the newest event time read per input."""

    partition: int
    state: JoinState
    watermark: float = -math.inf
    event_time: dict[str, float] = field(default_factory=dict)

    def saw(self, topic: str, event_time: float) -> None:
        if event_time > self.event_time.get(topic, -math.inf):
            self.event_time[topic] = event_time


def check_co_partitioned(bus: Bus, topics: Topics) -> int:
    """The partition count every topic of the join shares; a `ConfigError` naming each count and the
    fix when they differ (a request's interaction and its feedback would meet in different tasks)."""
    names = (topics.interactions, topics.feedback, topics.join_state, topics.join_pairs)
    counts = {name: bus.partitions(name) for name in names}
    if len(set(counts.values())) != 1:
        listed = ", ".join(f"{name}: {count}" for name, count in counts.items())
        raise ConfigError(
            f"the joiner's topics are not co-partitioned ({listed}): a request's interaction and its "
            "feedback must land on the same partition number. Give them the same partition count "
            "(`kafka-topics --alter --partitions` on the smaller ones, or recreate them) before starting "
            "the joiner"
        )
    return counts[topics.interactions]


class Joiner:
    """Joins `<prefix>.interactions` with `<prefix>.feedback` into `<prefix>.samples`, transactionally,
    for the partitions this member of the group `group_id` is assigned."""

    def __init__(
        self,
        bus: Bus,
        config: JoinConfig,
        *,
        topics: Topics,
        group_id: str = "orl-joiner",
        transactional_id: str = "orl-joiner-0",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.topics = topics
        self.config = config
        self._clock = clock
        self._partitions = check_co_partitioned(bus, topics)
        self._tasks: dict[int, _Task] = {}
        self._fresh: set[int] = set()  # partitions (re)assigned since the tasks were last synced
        # the group's committed offset of each input partition of a held task, as this joiner last
        # knew it (dropped whenever the task is dropped or restored: another joiner may have moved it);
        # -1: none (nothing was ever committed there, so there is nothing to guard)
        self._known: dict[TopicPartition, int] = {}
        self._committed_stats: Counter[str] = Counter()
        # The producer first: creating it fences a previous instance of this id, so nothing of that one
        # can commit after the tasks are restored.
        self._transactional_id = transactional_id
        self._producer = bus.producer(transactional_id=transactional_id)
        self._dead = DeadLetters(self._producer, "joiner", topics.dlq)
        self._consumer = bus.consumer(group_id)
        self._inputs = (topics.interactions, topics.feedback, topics.join_pairs)
        self._consumer.subscribe(list(self._inputs), on_assign=self._on_assign, on_revoke=self._on_revoke)
        self.retries = 0  # steps the group or broker refused and `run` retried
        self.producers_replaced = 0  # producers given up after a fatal error or a commit of unknown outcome
        self.last_lag: dict[TopicPartition, int] = {}  # unread records per assigned input, when last looked
        self.snapshot = Snapshot()
        self._needs_recover = False
        self._replace_producer = False

    # -- tasks ------------------------------------------------------------------------------
    def _on_assign(self, tps: list[TopicPartition]) -> None:
        self._fresh.update(tp.partition for tp in tps)

    def _on_revoke(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            if self._tasks.pop(tp.partition, None) is not None:
                logger.info("joiner: task %d revoked", tp.partition, extra={"event": "task_revoked",
                                                                            "partition": tp.partition})

    def _sync_tasks(self) -> None:
        """Make the tasks follow the assignment: drop those no longer assigned, restore new ones (and
        every one assigned again) from the changelog."""
        assigned = self._consumer.assignment()
        parts: dict[int, set[str]] = {}
        for tp in assigned:
            parts.setdefault(tp.partition, set()).add(tp.topic)
        for p in [p for p in self._tasks if p not in parts]:
            del self._tasks[p]
        todo = sorted(p for p in parts if p not in self._tasks or p in self._fresh)
        self._fresh.clear()
        self._known = {tp: o for tp, o in self._known.items() if tp.partition in self._tasks
                       and tp.partition not in todo}
        partial = [p for p in todo if parts[p] != set(self._inputs)]
        if partial:
            logger.warning("joiner: partitions %s are assigned without all of %s; a partition-wise "
                           "assignor (range, the default) keeps a task's inputs together", partial,
                           ", ".join(self._inputs), extra={"event": "partial_task", "partitions": partial})
        if todo:
            self._restore(todo)

    def _restore(self, partitions: list[int]) -> None:
        latest: dict[int, dict[str, bytes | None]] = {p: {} for p in partitions}
        changelog = self.bus.read_all(self.topics.join_state, RESTORE_TIMEOUT_S, partitions=set(partitions))
        for record in changelog:
            if record.key is not None:
                latest[record.partition][record.key.decode()] = record.value
        for p in partitions:
            state = JoinState(self.config, is_local=self._local_to(p))
            state.restore(latest[p])
            self._tasks[p] = _Task(p, state)
            logger.info("joiner: task %d restored (%d entries)", p, len(state.entries),
                        extra={"event": "task_restored", "partition": p, "entries": len(state.entries)})

    def _local_to(self, partition: int) -> Callable[[str], bool]:
        count = self._partitions
        return lambda request_id: partition_for(request_id.encode(), count) == partition

    @property
    def tasks(self) -> list[int]:
        """The partitions whose join this joiner holds now."""
        return sorted(self._tasks)

    @property
    def stats(self) -> Counter[str]:
        """What the join counted (joined, late_feedback, ...), over committed steps and the current one."""
        out = Counter(self._committed_stats)
        for task in self._tasks.values():
            out.update(task.state.stats)
        return out

    @property
    def open_requests(self) -> int:
        return sum(len(task.state.entries) for task in self._tasks.values())

    def watermarks(self) -> dict[int, float]:
        """Each task's event-time watermark (-inf until it has read something)."""
        return {p: task.watermark for p, task in self._tasks.items()}

    # -- the step ---------------------------------------------------------------------------
    def step(self, max_records: int = 1000, timeout: float = 0.5) -> StepResult:
        """Read one batch, join it, and commit outputs and offsets atomically."""
        if self._replace_producer:  # before the state is rebuilt: the new one aborts what the old left open
            self._new_producer()
        if self._needs_recover:  # an earlier step's recovery did not finish (the broker was away)
            self._recover()
        records = self._consumer.poll(max_records, timeout)
        full = len(records) >= max_records
        try:
            self._sync_tasks()
        except BaseException:  # the batch is read but not joined: rewind to the committed offsets first
            self._needs_recover = True
            raise
        records = [r for r in records if r.partition in self._tasks]  # (one revoked in the same poll)
        try:
            self._producer.begin_transaction()
        except BaseException as exc:  # read, not joined, and nothing to abort: rewind before the next step
            if isinstance(exc, ProducerBroken):
                self._replace_producer = True
            self._needs_recover = True
            raise
        try:
            samples = self._join(records, full)
            count, wrote = self._partitions, len(samples)
            for task in self._tasks.values():
                for other_id, payload in task.state.drain_forwards():
                    key = other_id.encode()
                    self._producer.produce(self.topics.join_pairs, payload, key,
                                           partition=partition_for(key, count))
                    wrote += 1
            for sample in samples:
                sample_key = sample.completion.request_id if sample.completion else sample.sample_id
                self._producer.produce(self.topics.samples, encode(sample), sample_key.encode())
            for task in self._tasks.values():  # a stand-in's key hashes elsewhere: the task's own partition
                for request_id, data in task.state.drain_changes().items():  # None: forgotten
                    self._producer.produce(self.topics.join_state, data, request_id.encode(),
                                           partition=task.partition)
                    wrote += 1
            if records:  # (the points count steps that read something)
                failpoint("joiner.mid_transaction")
            try:
                offsets = self._offsets(records, guard=wrote > 0)
                self._producer.commit_transaction(offsets, self._consumer)
                self._known.update(offsets)
                if records:
                    failpoint("joiner.after_commit")
            except (ProducerBroken, BusUnavailable):
                # A fatal error, or a commit whose outcome is unknown (the broker went away mid-commit):
                # this producer's state cannot be trusted. As the client's documentation (and Jepsen's
                # Kafka analysis) advise, a new instance with the same transactional id replaces it;
                # its initialisation aborts the transaction if it is still open.
                self._replace_producer = True
                raise
        except BaseException as exc:
            if isinstance(exc, ProducerBroken):  # from any call of the step, not only the commit
                self._replace_producer = True
            if not self._replace_producer:
                try:
                    self._producer.abort_transaction()
                except ProducerBroken:  # the abort itself broke or never returned: only a new one goes on
                    self._replace_producer = True
                except Exception:  # the commit may already have aborted it
                    logger.debug("abort after a failed step", exc_info=True)
            self._needs_recover = True  # until `_recover` succeeds: no step may run on a half-rebuilt state
            if self._replace_producer:
                self._new_producer()
            self._recover()
            raise
        for task in self._tasks.values():  # committed: the step's counts are kept
            self._committed_stats.update(task.state.stats)
            task.state.stats.clear()
        self._publish_snapshot()
        return StepResult(len(records), len(samples))

    def _offsets(self, records: list[Record], guard: bool) -> dict[TopicPartition, int]:
        """The offsets this step commits: past what it read and, when the step writes anything
        (`guard`), the offset of every other input partition of a task it holds: its position, or the
        group's committed offset where it has read nothing since it got the task. A commit is the
        group's check that this joiner still owns those partitions (Kafka's coordinator refuses a
        stale generation, the embedded bus a partition it gave to another member); a step that read
        nothing but closed windows by the clock would skip that check without them, and a joiner
        paused past its session (a zombie) would commit samples whose windows its tasks' new owner
        closes too. A step that writes nothing has nothing to guard, and sends no offsets it did not
        read (each send is a round trip to the group's coordinator)."""
        offsets = self._consumer.next_offsets(records)
        if not guard:
            return offsets
        missing = []
        for tp in self._consumer.assignment():
            if tp in offsets or tp.partition not in self._tasks:
                continue
            position = self._consumer.position(tp)
            if position is None:
                position = self._known.get(tp)
            if position is None:
                missing.append(tp)
            elif position >= 0:
                offsets[tp] = position
        if missing:  # read nothing since the task was (re)built: where the group has it
            for tp, offset in self._consumer.committed(missing).items():
                self._known[tp] = -1 if offset is None else offset
                if offset is not None:
                    offsets[tp] = offset
        return offsets

    def _publish_snapshot(self) -> None:
        assigned = set(self._consumer.assignment())
        self.snapshot = Snapshot(
            stats=dict(self._committed_stats), tasks=len(self._tasks), open_requests=self.open_requests,
            lag={tp: n for tp, n in self.last_lag.items() if tp in assigned},
            watermark=min((t.watermark for t in self._tasks.values() if math.isfinite(t.watermark)),
                          default=None),
            retries=self.retries, producers_replaced=self.producers_replaced)

    def _join(self, records: list[Record], full: bool) -> list[TrainingSample]:
        topics = self.topics
        samples: list[TrainingSample] = []
        interactions = decode_or_dead_letter(
            (r for r in records if r.topic == topics.interactions), Interaction, self._dead
        )
        feedback = decode_or_dead_letter(
            (r for r in records if r.topic == topics.feedback), Feedback, self._dead
        )
        # Interactions first: feedback and forwarded preferences in the same batch then find them.
        ahead = self._clock() + self.config.max_clock_skew_s
        for record, interaction in self._placed(interactions):
            task = self._tasks[record.partition]
            interaction = self._bounded(task, interaction, ahead)
            task.saw(record.topic, interaction.created_at)
            samples.extend(task.state.add_interaction(interaction))
        for record, event in self._placed(feedback):
            task = self._tasks[record.partition]
            event = self._bounded(task, event, ahead)
            task.saw(record.topic, event.created_at)
            samples.extend(task.state.add_feedback(event))
        for record in records:
            if record.topic == topics.join_pairs:
                samples.extend(self._forwarded(record))
        lagging = self._lagging_inputs(full)
        for task in self._tasks.values():
            samples.extend(task.state.advance(self._advance_watermark(task, lagging)))
        return samples

    def _placed(self, decoded: Iterable[tuple[Record, E]]) -> Iterable[tuple[Record, E]]:
        """The events on the partition their request id hashes to; the others are dead-lettered (a
        producer that did not key by request id, or another partitioner: the join would never meet
        such an event's other half)."""
        count = self._partitions
        for record, event in decoded:
            home = partition_for(event.request_id.encode(), count)
            if home == record.partition:
                yield record, event
                continue
            self._tasks[record.partition].state.stats["wrong_partition"] += 1
            self._dead.send(record, f"request_id {event.request_id!r} belongs on partition {home} of "
                            f"{count}, not {record.partition}: key records by request_id with Kafka's "
                            "default (murmur2) partitioner")

    def _forwarded(self, record: Record) -> list[TrainingSample]:
        try:
            if record.value is None:
                raise ValueError("empty value")
            interaction, preference = decode_forward(record.value)
        except Exception as exc:  # anything on the topic: dead letter, move on
            self._dead.send(record, f"not a forwarded preference ({type(exc).__name__}: {str(exc)[:200]})")
            return []
        home = partition_for((preference.other_request_id or "").encode(), self._partitions)
        if home != record.partition:
            self._dead.send(record, f"forwarded to partition {record.partition}, but its other request "
                            f"belongs on {home}")
            return []
        return self._tasks[record.partition].state.add_forwarded(interaction, preference)

    def _bounded(self, task: _Task, event: E, ahead: float) -> E:
        """`event` dated at most `ahead` (the clock plus the allowed skew): a client's future-dated event
        must not move the watermark past the clock, which would close every open window at once."""
        if event.created_at <= ahead:
            return event
        task.state.stats["future_dated"] += 1
        logger.warning("%s dated %.0f s ahead of the clock; taken as dated %.0f s ahead",
                       type(event).__name__, event.created_at - ahead + self.config.max_clock_skew_s,
                       self.config.max_clock_skew_s, extra={"event": "future_dated"})
        return event.model_copy(update={"created_at": ahead})

    # -- watermarks -------------------------------------------------------------------------
    def _lagging_inputs(self, full: bool) -> set[TopicPartition] | None:
        """Assigned inputs with unread records; None after a full batch, when all count as lagging
        (cheap, and conservative: no end offsets are looked up while a backlog is being read)."""
        if full:
            return None
        assigned = self._consumer.assignment()
        ends = self._consumer.end_offsets(assigned)
        unknown = [tp for tp in assigned if self._consumer.position(tp) is None]
        committed = self._consumer.committed(unknown) if unknown else {}
        lag: dict[TopicPartition, int] = {}
        for tp in assigned:
            position = self._consumer.position(tp)
            if position is None:
                position = committed.get(tp) or 0
            lag[tp] = max(0, ends[tp] - position)
        self.last_lag = lag
        return {tp for tp, behind in lag.items() if behind > 0}

    def _advance_watermark(self, task: _Task, lagging: set[TopicPartition] | None) -> float:
        """Event time up to which the task's inputs have been read.

        An input with unread records holds the watermark at the newest event time read from it (so
        feedback that is still unread cannot be declared late); inputs read to their end do not hold it
        back. Once both are read the wall clock may move it on, so windows close when traffic stops.
        (Forwarded preferences do not hold it: a pair waits for its interactions, not for a window.)"""
        own = [TopicPartition(t, task.partition) for t in (self.topics.interactions, self.topics.feedback)]
        assigned = set(self._consumer.assignment())
        behind = own if lagging is None else [tp for tp in own if tp in lagging]
        if behind:
            candidate = min(task.event_time.get(tp.topic, -math.inf) for tp in behind)
        elif all(tp in assigned for tp in own):
            candidate = max([self._clock(), *task.event_time.values()])
        else:
            candidate = max(task.event_time.values(), default=-math.inf)
        # Never past the clock: an event dated ahead (a client's clock, up to max_clock_skew_s) would
        # otherwise close every window open now, and the feedback still on its way would come too late.
        candidate = min(candidate, self._watermark_limit())
        task.watermark = max(task.watermark, candidate)
        return task.watermark

    def _watermark_limit(self) -> float:
        return self._clock()

    def caught_up(self) -> bool:
        """True when this joiner owns every input partition and has read all of them."""
        lagging = self._lagging_inputs(full=False)
        owns_all = len(self._consumer.assignment()) == self._partitions * len(self._inputs)
        return owns_all and not lagging

    # -- failures ---------------------------------------------------------------------------
    def _new_producer(self) -> None:
        """Replace the transactional producer with a new instance of the same id (it fences the old
        one and aborts its open transaction); the dead letters go through the new one."""
        try:
            self._producer.close()
        except Exception:  # a broken producer may fail to flush: it is being given up anyway
            logger.debug("closing the replaced producer", exc_info=True)
        self._producer = self.bus.producer(transactional_id=self._transactional_id)
        self._dead = DeadLetters(self._producer, "joiner", self.topics.dlq)
        self._replace_producer = False
        self.producers_replaced += 1
        logger.warning("joiner: transactional producer replaced (%d so far)", self.producers_replaced,
                       extra={"event": "producer_replaced", "count": self.producers_replaced})

    def _recover(self) -> None:
        """After an aborted step: rebuild every task and rewind the inputs to the committed offsets."""
        self._tasks.clear()
        self._fresh.clear()
        self._sync_tasks()
        assigned = self._consumer.assignment()
        for tp, offset in self._consumer.committed(assigned).items():
            self._consumer.seek(tp, offset or 0)
            self._known[tp] = -1 if offset is None else offset
        self._needs_recover = False

    def run(self, stop: Callable[[], bool], retry_s: float = 1.0) -> None:
        """Step until `stop()` is true. A step whose transaction the group or the broker refused (a
        rebalance moved its partitions, the broker was away) was aborted and rewound by `step` — or, if
        the broker was away for that too, is rewound before the next step; the joiner carries on from the
        committed offsets. A producer that hit a fatal error, or whose commit's outcome is unknown, is
        replaced by a new instance first. A fenced producer (a newer joiner with the same transactional
        id) ends the run."""
        while not stop():
            try:
                self.step()
            except (CommitFailed, BusUnavailable, ProducerBroken) as exc:
                if isinstance(exc, ProducerBroken):  # wherever it broke: only a new instance can go on
                    self._replace_producer = True
                self.retries += 1
                logger.warning("joiner step refused (%s); rewound to the committed offsets, carrying on",
                               exc, extra={"event": "step_refused", "reason": str(exc)})
                time.sleep(retry_s)

    def close(self) -> None:
        self._consumer.close()
        self._producer.close()
