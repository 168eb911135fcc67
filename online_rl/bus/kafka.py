"""The Kafka backend, on confluent-kafka (librdkafka).

Producers are idempotent with acks=all and the Java-compatible murmur2 partitioner, so keys land
on the same partitions as on the embedded bus. Consumers never auto-commit and read only committed
transactional data. `hold()` pauses the assigned partitions and keeps polling from a background
thread, so a training step may take longer than `max.poll.interval.ms` without the consumer being
evicted from its group.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

from online_rl.bus.base import (
    AssignCallback,
    Bus,
    Consumer,
    Headers,
    Producer,
    RebalanceCallback,
    Record,
    RecordMetadata,
    TopicPartition,
)
from online_rl.bus.errors import (
    BusError,
    BusUnavailable,
    CommitFailed,
    DeliveryError,
    ProducerBroken,
    ProducerFenced,
    UnknownTopic,
)

__all__ = ["KafkaBus"]

logger = logging.getLogger(__name__)


def _tp(tp: TopicPartition, offset: int = ck.OFFSET_INVALID) -> ck.TopicPartition:
    return ck.TopicPartition(tp.topic, tp.partition, offset)


# how long past its own timeout a transactional call may block before its producer is given up
_OVERRUN_GRACE_S = 2.0
# sending a transaction's offsets takes milliseconds, or blocks for good on a lost coordinator (below):
# its own, shorter timeout; the producer is given up after it and replaced in a second or two
_OFFSETS_TIMEOUT_S = 5.0

# a newer instance with the same transactional id exists, or the cluster forbids the id: replacing the
# producer would only fence that instance in turn (or fail the same way), so these end the process
_FENCED_CODES = (ck.KafkaError._FENCED, ck.KafkaError.PRODUCER_FENCED, ck.KafkaError.INVALID_PRODUCER_EPOCH,
                 ck.KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)

class _LastError:
    """librdkafka's error callback: keeps the last client-level error, so that a timeout can say why
    (a refused password or an untrusted certificate shows up here and nowhere else)."""

    def __init__(self) -> None:
        self.text = ""

    def __call__(self, error: ck.KafkaError) -> None:
        self.text = error.str()
        if error.code() == ck.KafkaError._AUTHENTICATION:
            self.text += " (check kafka.sasl_username and kafka.sasl_password)"
        elif error.code() == ck.KafkaError._SSL:
            self.text += (" (check kafka.ssl_ca_location: it must hold the CA that signed the brokers' "
                          "certificates)")

    def why(self) -> str:
        return f"; the last error the client saw: {self.text}" if self.text else ""


class KafkaBus(Bus):
    """Producers, consumers and topic admin on a Kafka cluster."""

    def __init__(
        self,
        bootstrap_servers: str,
        extra: Mapping[str, Any] | None = None,
        consumer_extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self._last_error = _LastError()
        self._extra = {"error_cb": self._last_error, **(extra or {})}
        self._consumer_extra = {**self._extra, **(consumer_extra or {})}
        self._admin = AdminClient({"bootstrap.servers": bootstrap_servers, **self._extra})

    def _metadata(self, topic: str | None = None, timeout: float = 10.0) -> Any:
        try:
            return self._admin.list_topics(topic=topic, timeout=timeout)
        except ck.KafkaException as exc:
            self._admin.poll(0)  # serves the error callback
            raise BusUnavailable(
                f"Kafka at {self.bootstrap_servers} did not answer: {exc}{self._last_error.why()}"
            ) from exc

    def create_topic(self, name: str, partitions: int = 1, compact: bool = False) -> None:
        config = {"cleanup.policy": "compact"} if compact else {}
        futures = self._admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=-1, config=config)]
        )
        try:
            futures[name].result(30)
        except ck.KafkaException as exc:
            if exc.args[0].code() != ck.KafkaError.TOPIC_ALREADY_EXISTS:
                raise BusError(f"could not create topic {name!r}: {exc}") from exc
        except TimeoutError as exc:
            self._admin.poll(0)
            raise BusUnavailable(
                f"Kafka at {self.bootstrap_servers} did not create topic {name!r} within 30 s"
                f"{self._last_error.why()}"
            ) from exc
        # The controller confirms before every broker's metadata has the topic: wait until the
        # metadata shows it, so that a lookup right after creation does not call it unknown.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            meta = self._metadata(name).topics.get(name)
            if meta is not None and meta.error is None and meta.partitions:
                return
            time.sleep(0.05)

    def partitions(self, topic: str) -> int:
        meta = self._metadata(topic).topics.get(topic)
        unknown = ck.KafkaError.UNKNOWN_TOPIC_OR_PART
        if meta is None or (meta.error is not None and meta.error.code() == unknown):
            raise UnknownTopic(f"topic {topic!r} does not exist on {self.bootstrap_servers}; create it first")
        if meta.error is not None:  # e.g. no leader yet, as while a cluster comes back
            raise BusUnavailable(f"topic {topic!r} is not available on {self.bootstrap_servers}: "
                                 f"{meta.error.str()}")
        return len(meta.partitions)

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        count = self.partitions(topic)
        # read_uncommitted: the high watermark, not the last stable offset. Right after a
        # transaction commits, its markers may not be written yet and the LSO still lags.
        probe = ck.Consumer({
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": "orl-probe",
            "isolation.level": "read_uncommitted",
            **self._extra,
        })
        try:
            out = {}
            for p in range(count):
                _, high = probe.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=10)
                out[TopicPartition(topic, p)] = int(high)
            return out
        except ck.KafkaException as exc:  # the brokers away, or a leader not caught up after a return
            why = exc.args[0].str() if exc.args else str(exc)
            raise BusUnavailable(f"could not read where {topic} ends: {why}") from exc
        finally:
            probe.close()

    def producer(self, transactional_id: str | None = None) -> Producer:
        return _KafkaProducer(self.bootstrap_servers, self._extra, transactional_id)

    def consumer(self, group_id: str, auto_offset_reset: str = "earliest") -> Consumer:
        return _KafkaConsumer(self.bootstrap_servers, self._consumer_extra, group_id, auto_offset_reset)


def _producer_error(exc: ck.KafkaException, what: str) -> BusError:
    """The bus's error for a producer's KafkaException: fenced (a newer instance took the transactional
    id), broken (any other fatal error: only a new instance can go on), or unavailable (retriable)."""
    error = exc.args[0] if exc.args and isinstance(exc.args[0], ck.KafkaError) else None
    text = error.str() if error is not None else str(exc)
    if error is not None and error.fatal():
        if error.code() in _FENCED_CODES:
            return ProducerFenced(f"{what}: transactional producer is fenced: {text}")
        return ProducerBroken(f"{what}: the producer hit a fatal error: {text}")
    if error is not None and error.code() in (ck.KafkaError._STATE, ck.KafkaError.INVALID_TXN_STATE):
        return ProducerBroken(f"{what}: the producer's transaction state is unusable: {text}")
    return BusUnavailable(f"{what}: {text}")


class _KafkaProducer(Producer):
    def __init__(self, servers: str, extra: Mapping[str, Any], transactional_id: str | None) -> None:
        config: dict[str, Any] = {
            "bootstrap.servers": servers,
            "enable.idempotence": True,
            "acks": "all",
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "compression.type": "lz4",
            "message.timeout.ms": 30000,
            **extra,
        }
        if transactional_id is not None:
            config["transactional.id"] = transactional_id
            # As long as a record may wait (not Kafka's 60 s): a crashed owner's open transaction holds
            # its partitions' readers (read_committed) until the broker aborts it after this time.
            config.setdefault("transaction.timeout.ms", config["message.timeout.ms"])
        self._p = ck.Producer(config)
        self._queued = 0
        self._delivered: list[RecordMetadata] = []
        self._errors: list[str] = []
        self._transactional = transactional_id is not None
        self._hung = False  # a transactional call overran its timeout: this instance is given up
        if self._transactional:
            try:
                self._p.init_transactions(60)
            except ck.KafkaException as exc:
                why = extra["error_cb"].why() if isinstance(extra.get("error_cb"), _LastError) else ""
                raise BusUnavailable(f"could not start transactional producer: {exc}{why}") from exc

    def _usable(self) -> None:
        if self._hung:  # a call of this instance is still blocked: every other call would wait on it
            raise ProducerBroken("this producer was given up (a transactional call of it never returned); "
                                 "replace it")

    def _on_delivery(self, err: ck.KafkaError | None, msg: Any) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()}: {err.str()}")
        else:
            self._delivered.append(RecordMetadata(msg.topic(), msg.partition(), msg.offset()))

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        self._usable()
        extra: dict[str, Any] = {}
        if headers:
            extra["headers"] = list(headers)
        if partition is not None:
            extra["partition"] = partition
        while True:
            try:
                self._p.produce(topic, value, key, on_delivery=self._on_delivery, **extra)
                break
            except BufferError:
                self._p.poll(0.1)  # local queue full: serve delivery reports, then retry
            except ck.KafkaException as exc:  # a producer in a fatal state refuses every record
                raise _producer_error(exc, "could not queue a record") from exc
        self._queued += 1
        if self._queued % 1000 == 0:
            self._p.poll(0)

    def _take(self) -> tuple[int, list[RecordMetadata], list[str]]:
        out = (self._queued, self._delivered, self._errors)
        self._queued, self._delivered, self._errors = 0, [], []
        return out

    def flush(self, timeout: float = 30.0) -> list[RecordMetadata]:
        self._usable()
        remaining = self._p.flush(timeout)
        if remaining:
            # Their reports arrive later and are counted by the next flush.
            raise BusUnavailable(f"{remaining} records not confirmed by Kafka within {timeout}s")
        queued, delivered, errors = self._take()
        if errors:
            raise DeliveryError(f"{len(errors)} records were not written: {errors[:3]}")
        if len(delivered) != queued and not self._transactional:
            raise DeliveryError(f"{queued - len(delivered)} records have no delivery report")
        return delivered

    def begin_transaction(self) -> None:
        self._usable()
        if not self._transactional:
            super().begin_transaction()
        try:
            self._p.begin_transaction()
        except ck.KafkaException as exc:
            raise _producer_error(exc, "could not begin a transaction") from exc

    def commit_transaction(
        self, offsets: Mapping[TopicPartition, int], consumer: Consumer, timeout: float = 30.0
    ) -> None:
        if not isinstance(consumer, _KafkaConsumer):
            raise BusError("a Kafka transaction needs a Kafka consumer")
        self._usable()
        try:
            if offsets:
                parts = [_tp(tp, off) for tp, off in offsets.items()]
                group = consumer._c.consumer_group_metadata()
                limit = min(timeout, _OFFSETS_TIMEOUT_S)
                self._in_time(lambda: self._p.send_offsets_to_transaction(parts, group, limit), limit,
                              "sending the consumed offsets to the transaction")
            self._in_time(lambda: self._p.commit_transaction(timeout), timeout, "committing the transaction")
            self._take()
        except ck.KafkaException as exc:
            error = exc.args[0]
            self._take()
            if error.fatal():
                if error.code() in _FENCED_CODES:
                    raise ProducerFenced(f"transactional producer is fenced: {error.str()}") from exc
                raise ProducerBroken(f"transactional producer hit a fatal error: {error.str()}") from exc
            if error.txn_requires_abort():
                try:
                    self._in_time(lambda: self._p.abort_transaction(timeout), timeout,
                                  "aborting the transaction")
                except ck.KafkaException as abort:  # e.g. the broker lost the transaction in an outage
                    raise _producer_error(abort, "the transaction could not be aborted") from exc
                raise CommitFailed(f"transaction aborted: {error.str()}") from exc
            raise BusUnavailable(f"transaction commit did not complete: {error.str()}") from exc

    def _in_time(self, call: Callable[[], Any], timeout: float, what: str) -> None:
        """`call` (a transactional call given `timeout`) on a helper thread; one still blocked
        `_OVERRUN_GRACE_S` after its timeout gives this producer up (`ProducerBroken`: the caller replaces
        it with a new instance of the same id, which fences this one). librdkafka's
        send_offsets_to_transaction can block past its timeout, for good, when the group coordinator it
        cached was dropped from the cluster's metadata, as after a whole-cluster outage (librdkafka
        issues 5456 and 5511, open in 2.16); the blocked call keeps its thread and this instance."""
        done, failure = threading.Event(), []

        def run() -> None:
            try:
                call()
            except BaseException as exc:  # re-raised on the caller's thread
                failure.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name="orl-kafka-txn", daemon=True).start()
        if not done.wait(timeout + _OVERRUN_GRACE_S):
            self._hung = True
            raise ProducerBroken(f"{what} did not return within {timeout + _OVERRUN_GRACE_S:.0f}s, past "
                                 f"its {timeout:.0f}s timeout (its coordinator was lost); this producer "
                                 "is given up")
        if failure:
            raise failure[0]

    def abort_transaction(self, timeout: float = 30.0) -> None:
        self._usable()
        try:
            self._in_time(lambda: self._p.abort_transaction(timeout), timeout, "aborting the transaction")
        except ck.KafkaException as exc:
            raise _producer_error(exc, "the transaction could not be aborted") from exc
        finally:
            self._take()

    def close(self) -> None:
        if not self._hung:  # a hung instance is left to its blocked call (it is fenced already)
            self._p.flush(5)


class _KafkaConsumer(Consumer):
    """A group member. Where to start without a committed offset is `reset` (earliest or latest). A
    start offset beyond the log's end (the topic was recreated, or a broker lost the tail this group
    had read) is not reset that way, since `earliest` would replay the whole log — the samples again:
    on assignment, `_clamp` moves it to the log's end and says how many records were lost. (One before
    the log's start, removed unread by retention, resumes at the start, as `earliest` does.)"""

    def __init__(self, servers: str, extra: Mapping[str, Any], group_id: str, reset: str) -> None:
        if reset not in ("earliest", "latest"):
            raise BusError(f"auto_offset_reset={reset!r}: use 'earliest' or 'latest'")
        self.group_id = group_id
        self.offset_resets: list[dict[str, Any]] = []  # what `_clamp` did, newest last
        self._c = ck.Consumer({
            "bootstrap.servers": servers,
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": reset,
            "isolation.level": "read_committed",
            "max.poll.interval.ms": 300000,
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
            **extra,
        })
        self._assigned: list[TopicPartition] = []
        self._generation = 0  # bumped on every assignment change
        self._lock = threading.RLock()

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: AssignCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> None:
        def assigned(consumer: Any, parts: list[ck.TopicPartition]) -> None:
            tps = [TopicPartition(p.topic, p.partition) for p in parts]
            self._assigned = sorted(set(self._assigned) | set(tps))
            self._generation += 1
            starts = dict(on_assign(tps) or {}) if on_assign else {}
            try:
                moved = self._clamp(consumer, tps, starts)
            except ck.KafkaException as exc:  # the broker did not answer: start as Kafka would
                moved = False
                logger.warning("could not check the start offsets of %s against the log: %s", tps, exc)
            if starts or moved:
                # Offsets set on the partitions before assigning them are where fetching starts.
                for part, tp in zip(parts, tps, strict=True):
                    if tp in starts:
                        part.offset = starts[tp]
                consumer.assign(parts)

        def revoked(_: Any, parts: list[ck.TopicPartition]) -> None:
            tps = [TopicPartition(p.topic, p.partition) for p in parts]
            if on_revoke:
                on_revoke(tps)
            self._assigned = [tp for tp in self._assigned if tp not in tps]
            self._generation += 1

        self._c.subscribe(list(topics), on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        with self._lock:
            messages: list[Any] = self._c.consume(num_messages=max_records, timeout=timeout)
        out, unknown = [], None
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == ck.KafkaError._PARTITION_EOF:
                    continue
                if err.code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART:
                    unknown = UnknownTopic(f"consumer error: {err.str()}")
                    continue
                logger.warning("consumer error on %s: %s", msg.topic(), err.str())
                continue
            ts = msg.timestamp()[1] / 1000.0
            headers = tuple((str(k), bytes(v or b"")) for k, v in (msg.headers() or []))
            out.append(
                Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), ts, headers)
            )
        if unknown is not None:
            if not out:
                raise unknown
            # the records read beside it are the caller's (the client counts them consumed already)
            logger.warning("%s; returning the %d records read with it", unknown, len(out))
        return out

    def _clamp(self, consumer: Any, tps: list[TopicPartition], starts: dict[TopicPartition, int]) -> bool:
        """Where each partition of an assignment starts (the application's offset in `starts`, else the
        group's committed one): one beyond the log's end is moved to the end, in `starts` (True if any),
        logged and kept in `offset_resets`."""
        unknown = [tp for tp in tps if tp not in starts]
        committed = consumer.committed([_tp(tp) for tp in unknown], timeout=10) if unknown else []
        start = dict(starts) | {TopicPartition(p.topic, p.partition): p.offset for p in committed}
        moved = False
        for tp in tps:
            offset = start.get(tp, -1)
            if offset is None or offset < 0:
                continue  # no committed offset: `reset` decides
            _, high = consumer.get_watermark_offsets(_tp(tp), timeout=10)
            if offset <= high:
                continue
            starts[tp], moved = high, True
            event = {"topic": tp.topic, "partition": tp.partition, "offset": offset, "high": high,
                     "lost": offset - high}
            self.offset_resets.append(event)
            logger.warning("%s[%d]: the group's offset %d is beyond the log's end %d (the topic was "
                           "recreated, or a broker lost records): resuming at the end, not replaying the "
                           "log; %d records are lost", tp.topic, tp.partition, offset, high, offset - high,
                           extra={"event": "offset_beyond_log_end", **event})
        return moved

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if not offsets:
            return
        # Kafka's coordinator accepts a commit for any partition from a current member; refuse
        # partitions this member no longer owns, as the embedded bus does, so that a revoked
        # partition's new owner is never overwritten.
        foreign = [tp for tp in offsets if tp not in self._assigned]
        if foreign:
            raise CommitFailed(
                f"partitions {foreign} are no longer assigned to this consumer; their records will be "
                "re-read by the new owner"
            )
        try:
            with self._lock:
                self._c.commit(offsets=[_tp(tp, off) for tp, off in offsets.items()], asynchronous=False)
        except ck.KafkaException as exc:
            raise CommitFailed(f"commit refused: {exc.args[0].str()}; the records will be re-read") from exc

    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        try:
            with self._lock:
                got = self._c.committed([_tp(tp) for tp in partitions], timeout=10)
        except ck.KafkaException as exc:  # the group's coordinator did not answer
            why = exc.args[0].str() if exc.args else str(exc)
            raise BusUnavailable(f"could not read the group's committed offsets: {why}") from exc
        return {
            TopicPartition(p.topic, p.partition): (p.offset if p.offset >= 0 else None) for p in got
        }

    def seek(self, tp: TopicPartition, offset: int) -> None:
        with self._lock:
            self._c.seek(_tp(tp, offset))

    def position(self, tp: TopicPartition) -> int | None:
        with self._lock:
            got = self._c.position([_tp(tp)])[0]
        return got.offset if got.offset >= 0 else None

    def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        with self._lock:
            positions = self._c.position([_tp(tp) for tp in partitions]) if partitions else []
            for tp, position in zip(partitions, positions, strict=True):
                # Cached from the last fetch response, but only once this consumer has fetched;
                # before that the cache says nothing, so ask the broker.
                high = -1
                if position.offset >= 0:
                    _, high = self._c.get_watermark_offsets(_tp(tp), cached=True)
                if high < 0:
                    _, high = self._c.get_watermark_offsets(_tp(tp), timeout=10)
                out[tp] = int(high)
        return out

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Pause the assigned partitions and keep polling from a background thread.

        Rebalance callbacks that happen meanwhile run on that thread (under the consumer's lock).
        If the assignment changed during the hold, positions are not restored: newly assigned
        partitions start at their committed offsets."""
        stop = threading.Event()
        failure: list[BaseException] = []
        with self._lock:
            parts = self._c.assignment()
            positions = self._c.position(parts) if parts else []
            if parts:
                self._c.pause(parts)
            generation = self._generation

        def keep_alive() -> None:
            try:
                while not stop.is_set():
                    with self._lock:
                        msg: Any = self._c.poll(0.2)
                        if msg is not None and msg.error() is None:
                            # Paused partitions should yield nothing; if one slips through, rewind.
                            self._c.seek(ck.TopicPartition(msg.topic(), msg.partition(), msg.offset()))
            except BaseException as exc:  # surfaced when the hold ends
                failure.append(exc)

        thread = threading.Thread(target=keep_alive, name="orl-kafka-hold", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with self._lock:
                # Resume every partition the hold paused, assigned now or not: the client keeps a
                # partition's pause across a rebalance, so one lost while held (a session that timed
                # out during an outage) and assigned again later would never be fetched again.
                if parts:
                    self._c.resume(parts)
                current = {(p.topic, p.partition) for p in self._c.assignment()}
                back = [p for p in positions if (p.topic, p.partition) in current]
                if back and self._generation == generation:
                    for p in back:
                        if p.offset >= 0:
                            self._c.seek(p)
        if failure:
            raise BusUnavailable(f"the consumer failed while holding a batch: {failure[0]}") from failure[0]

    def close(self) -> None:
        with self._lock:
            self._c.close()
