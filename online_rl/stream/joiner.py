"""The joiner process: runs `JoinState` over the bus with exactly-once effect.

Each step reads a batch of interactions and feedback, feeds the join, and then in one bus
transaction writes the emitted samples to `orl.samples`, the changed join state to the compacted
changelog `orl.join-state`, any rejected records to `orl.dlq`, and the consumed input offsets.
After a crash the joiner rebuilds its state from the changelog and resumes at the committed
offsets, so nothing is joined twice and nothing is dropped. One joiner instance owns all input
partitions (its transactional id fences a stale twin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from online_rl.bus import (
    Bus,
    BusUnavailable,
    CommitFailed,
    DeadLetters,
    ProducerBroken,
    TopicPartition,
    Topics,
    decode_or_dead_letter,
)
from online_rl.events import Feedback, Interaction, encode
from online_rl.faults import failpoint
from online_rl.stream.join import JoinConfig, JoinState

E = TypeVar("E", Interaction, Feedback)

__all__ = ["Joiner", "StepResult"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    consumed: int
    emitted: int


class Joiner:
    """Joins `<prefix>.interactions` with `<prefix>.feedback` into `<prefix>.samples`, transactionally."""

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
        self.state = JoinState(config)
        self._clock = clock
        self._watermark = 0.0
        self._event_time: dict[TopicPartition, float] = {}  # newest event time per input partition
        # The producer first: creating it fences a previous instance, so nothing can commit to the
        # changelog between the restore below and this joiner's first transaction.
        self._transactional_id = transactional_id
        self._producer = bus.producer(transactional_id=transactional_id)
        self._restore()
        self._dead = DeadLetters(self._producer, "joiner", topics.dlq)
        self._consumer = bus.consumer(group_id)
        self._consumer.subscribe([topics.interactions, topics.feedback])
        self._input_partitions = sum(bus.partitions(t) for t in (topics.interactions, topics.feedback))
        self.retries = 0  # steps the group or broker refused and `run` retried
        self.producers_replaced = 0  # producers given up after a fatal error or a commit of unknown outcome
        self._needs_recover = False
        self._replace_producer = False

    def _restore(self) -> None:
        latest: dict[str, bytes | None] = {}
        for record in self.bus.read_all(self.topics.join_state):
            if record.key is not None:
                latest[record.key.decode()] = record.value
        self.state.restore(latest)
        logger.info("joiner restored %d entries from %s", len(self.state.entries), self.topics.join_state)

    def step(self, max_records: int = 1000, timeout: float = 0.5) -> StepResult:
        """Read one batch, join it, and commit outputs and offsets atomically."""
        if self._replace_producer:  # before the state is rebuilt: the new one aborts what the old left open
            self._new_producer()
        if self._needs_recover:  # an earlier step's recovery did not finish (the broker was away)
            self._recover()
        records = self._consumer.poll(max_records, timeout)
        self._producer.begin_transaction()
        try:
            samples = []
            interactions = decode_or_dead_letter(
                (r for r in records if r.topic == self.topics.interactions), Interaction, self._dead
            )
            feedback = decode_or_dead_letter(
                (r for r in records if r.topic == self.topics.feedback), Feedback, self._dead
            )
            # Interactions first: feedback in the same batch then finds its interaction.
            ahead = self._clock() + self.state.config.max_clock_skew_s
            for record, interaction in interactions:
                interaction = self._bounded(interaction, ahead)
                self._saw(record.tp, interaction.created_at)
                samples.extend(self.state.add_interaction(interaction))
            for record, event in feedback:
                event = self._bounded(event, ahead)
                self._saw(record.tp, event.created_at)
                samples.extend(self.state.add_feedback(event))
            samples.extend(self.state.advance(self._advance_watermark(full=len(records) >= max_records)))
            for sample in samples:
                key = sample.completion.request_id if sample.completion else sample.sample_id
                self._producer.produce(self.topics.samples, encode(sample), key.encode())
            for request_id, data in self.state.drain_changes().items():  # None: forgotten
                self._producer.produce(self.topics.join_state, data, request_id.encode())
            if records:  # (the points count steps that read something)
                failpoint("joiner.mid_transaction")
            try:
                self._producer.commit_transaction(self._consumer.next_offsets(records), self._consumer)
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
                except Exception:  # the commit may already have aborted it
                    logger.debug("abort after a failed step", exc_info=True)
            self._needs_recover = True  # until `_recover` succeeds: no step may run on a half-rebuilt state
            if self._replace_producer:
                self._new_producer()
            self._recover()
            raise
        return StepResult(len(records), len(samples))

    def _bounded(self, event: E, ahead: float) -> E:
        """`event` dated at most `ahead` (the clock plus the allowed skew): a client's future-dated event
        must not move the watermark past the clock, which would close every open window at once."""
        if event.created_at <= ahead:
            return event
        self.state.stats["future_dated"] += 1
        logger.warning("%s dated %.0f s ahead of the clock; taken as dated %.0f s ahead",
                       type(event).__name__, event.created_at - ahead + self.state.config.max_clock_skew_s,
                       self.state.config.max_clock_skew_s, extra={"event": "future_dated"})
        return event.model_copy(update={"created_at": ahead})

    def _saw(self, tp: TopicPartition, event_time: float) -> None:
        if event_time > self._event_time.get(tp, float("-inf")):
            self._event_time[tp] = event_time

    def _lagging(self) -> tuple[list[TopicPartition], bool]:
        """Input partitions with unread records, and whether this joiner owns every input partition."""
        assigned = self._consumer.assignment()
        total = self._input_partitions
        ends = self._consumer.end_offsets(assigned)
        unknown = [tp for tp in assigned if self._consumer.position(tp) is None]
        committed = self._consumer.committed(unknown) if unknown else {}
        lagging = []
        for tp in assigned:
            position = self._consumer.position(tp)
            if position is None:
                position = committed.get(tp) or 0
            if position < ends[tp]:
                lagging.append(tp)
        return lagging, bool(assigned) and len(assigned) == total

    def _advance_watermark(self, full: bool) -> float:
        """Event time up to which every input has been read.

        A partition with unread records holds the watermark at the newest event time read from it
        (so feedback that is still unread cannot be declared late); partitions read to their end do
        not hold it back. Once everything is read the wall clock may move it on, so windows close
        when traffic stops. After a full batch every partition counts as lagging (cheap, and
        conservative: no end offsets are looked up while a backlog is being read)."""
        if full:
            lagging, owns_all = self._consumer.assignment(), False
        else:
            lagging, owns_all = self._lagging()
        if lagging:
            candidate = min(self._event_time.get(tp, float("-inf")) for tp in lagging)
        elif owns_all:
            candidate = max([self._clock(), *self._event_time.values()])
        else:
            candidate = max(self._event_time.values(), default=float("-inf"))
        # Never past the clock: an event dated ahead (a client's clock, up to max_clock_skew_s) would
        # otherwise close every window open now, and the feedback still on its way would come too late.
        candidate = min(candidate, self._watermark_limit())
        self._watermark = max(self._watermark, candidate)
        return self._watermark

    def _watermark_limit(self) -> float:
        return self._clock()

    def caught_up(self) -> bool:
        """True when this joiner owns every input partition and has read all of them."""
        lagging, owns_all = self._lagging()
        return owns_all and not lagging

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
        """After an aborted step: rebuild the state and rewind the inputs to the committed offsets."""
        self.state = JoinState(self.state.config)
        self._restore()
        assigned = self._consumer.assignment()
        for tp, offset in self._consumer.committed(assigned).items():
            self._consumer.seek(tp, offset or 0)
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
