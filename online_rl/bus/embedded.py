"""The embedded bus: a durable append-only log in one SQLite file (WAL mode), no broker needed.

Same semantics as the Kafka backend: topics with partitions and offsets, murmur2 key
partitioning, consumer groups with committed offsets shared by several processes, rebalancing
when members join or leave (a member that stops heart-beating for `session_timeout` is dropped),
commits refused for partitions a member no longer owns, and transactions that write records and
offsets in one SQLite transaction. Compacted topics keep only the newest record per key, and a
record with no value (a tombstone) deletes its key.

Handover: a partition has at most one owner (the `owners` table). A member that should give a
partition up runs its `on_revoke` callback (where it may still commit) and then releases it; the
new owner claims it only once it is released or its owner has stopped heart-beating, and starts
at the committed offset.

Every producer and consumer holds its own connection; SQLite's file locking makes it safe for
several processes at once.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    partition_for,
)
from online_rl.bus.errors import BusError, CommitFailed, DeliveryError, ProducerFenced, UnknownTopic

__all__ = ["EmbeddedBus"]

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics(name TEXT PRIMARY KEY, partitions INTEGER NOT NULL,
    compact INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS log(topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB, value BLOB, ts REAL NOT NULL, headers BLOB,
    PRIMARY KEY(topic, partition, offset)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS log_key ON log(topic, partition, key);
CREATE TABLE IF NOT EXISTS ends(topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY(topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS group_offsets(group_id TEXT NOT NULL, topic TEXT NOT NULL,
    partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY(group_id, topic, partition)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS members(group_id TEXT NOT NULL, member_id TEXT NOT NULL, topics TEXT NOT NULL,
    heartbeat REAL NOT NULL, PRIMARY KEY(group_id, member_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_epochs(transactional_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS owners(group_id TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    member_id TEXT NOT NULL, PRIMARY KEY(group_id, topic, partition)) WITHOUT ROWID;
"""


def _pack_headers(headers: Headers | None) -> bytes | None:
    if not headers:
        return None
    import msgspec

    return msgspec.msgpack.encode([[k, v] for k, v in headers])


def _unpack_headers(data: bytes | None) -> tuple[tuple[str, bytes], ...]:
    if not data:
        return ()
    import msgspec

    return tuple((str(k), bytes(v)) for k, v in msgspec.msgpack.decode(data))


class _Db:
    """One SQLite connection with the bus's pragmas and an immediate-transaction helper."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.lock = threading.RLock()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            try:
                self.conn.execute("COMMIT")
            except sqlite3.Error:
                self.conn.execute("ROLLBACK")
                raise

    def read(self, sql: str, args: Sequence[object] = ()) -> list[Any]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()


class EmbeddedBus(Bus):
    """A bus in one SQLite file. `session_timeout` is how long a silent group member is kept."""

    def __init__(self, path: Path, session_timeout: float = 10.0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.session_timeout = session_timeout
        self._db = _Db(path)
        with self._db.lock:
            self._db.conn.executescript(_SCHEMA)

    def create_topic(self, name: str, partitions: int = 1, compact: bool = False) -> None:
        if partitions < 1:
            raise BusError(f"topic {name!r}: partitions must be >= 1")
        with self._db.write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO topics VALUES (?, ?, ?)", (name, partitions, int(compact))
            )

    def partitions(self, topic: str) -> int:
        return _partitions(self._db, topic)

    def end_offsets(self, topic: str) -> dict[TopicPartition, int]:
        count = self.partitions(topic)
        rows = dict(self._db.read("SELECT partition, next_offset FROM ends WHERE topic=?", (topic,)))
        return {TopicPartition(topic, p): int(rows.get(p, 0)) for p in range(count)}

    def producer(self, transactional_id: str | None = None) -> Producer:
        return _EmbeddedProducer(self.path, transactional_id)

    def consumer(self, group_id: str, auto_offset_reset: str = "earliest") -> Consumer:
        if auto_offset_reset not in ("earliest", "latest"):
            raise BusError("auto_offset_reset must be 'earliest' or 'latest'")
        return _EmbeddedConsumer(self.path, group_id, auto_offset_reset, self.session_timeout)

    def close(self) -> None:
        self._db.close()


def _partitions(db: _Db, topic: str) -> int:
    rows = db.read("SELECT partitions FROM topics WHERE name=?", (topic,))
    if not rows:
        raise UnknownTopic(f"topic {topic!r} does not exist; create it first")
    return int(rows[0][0])


class _EmbeddedProducer(Producer):
    def __init__(self, path: Path, transactional_id: str | None) -> None:
        self._db = _Db(path)
        self._queue: list[tuple[str, bytes | None, bytes | None, bytes | None, int | None]] = []
        self._round_robin = 0
        self._txn_id = transactional_id
        self._epoch = 0
        self._in_txn = False
        if transactional_id is not None:
            with self._db.write() as conn:
                conn.execute(
                    "INSERT INTO producer_epochs VALUES (?, 1) ON CONFLICT(transactional_id) "
                    "DO UPDATE SET epoch = epoch + 1",
                    (transactional_id,),
                )
                self._epoch = conn.execute(
                    "SELECT epoch FROM producer_epochs WHERE transactional_id=?", (transactional_id,)
                ).fetchone()[0]

    def produce(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        if self._txn_id is not None and not self._in_txn:
            raise BusError("transactional producer: call begin_transaction() before produce()")
        self._queue.append(
            (topic, key, None if value is None else bytes(value), _pack_headers(headers), partition)
        )

    def _append(self, conn: sqlite3.Connection) -> list[RecordMetadata]:
        counts: dict[str, tuple[int, bool]] = {}
        out: list[RecordMetadata] = []
        now = time.time()
        for topic, key, value, headers, chosen in self._queue:
            if topic not in counts:
                row = conn.execute("SELECT partitions, compact FROM topics WHERE name=?", (topic,)).fetchone()
                if row is None:
                    raise DeliveryError(f"topic {topic!r} does not exist; create it first")
                counts[topic] = (int(row[0]), bool(row[1]))
            partitions, compact = counts[topic]
            if chosen is not None:
                if not 0 <= chosen < partitions:
                    raise DeliveryError(f"topic {topic!r} has no partition {chosen} (it has {partitions})")
                partition = chosen
            elif key is not None:
                partition = partition_for(key, partitions)
            else:
                partition = self._round_robin % partitions
                self._round_robin += 1
            row = conn.execute(
                "INSERT INTO ends VALUES (?, ?, 1) ON CONFLICT(topic, partition) "
                "DO UPDATE SET next_offset = next_offset + 1 RETURNING next_offset",
                (topic, partition),
            ).fetchone()
            offset = int(row[0]) - 1
            if compact and key is not None:
                conn.execute(
                    "DELETE FROM log WHERE topic=? AND partition=? AND key=?", (topic, partition, key)
                )
                if value is None:  # a tombstone: the key is gone
                    out.append(RecordMetadata(topic, partition, offset))
                    continue
            conn.execute(
                "INSERT INTO log VALUES (?, ?, ?, ?, ?, ?, ?)",
                (topic, partition, offset, key, value, now, headers),
            )
            out.append(RecordMetadata(topic, partition, offset))
        return out

    def flush(self, timeout: float = 30.0) -> list[RecordMetadata]:
        if self._txn_id is not None:
            raise BusError("transactional producer: records are written by commit_transaction()")
        if not self._queue:
            return []
        try:
            with self._db.write() as conn:
                out = self._append(conn)
        except sqlite3.Error as exc:
            raise DeliveryError(f"embedded bus write failed: {exc}") from exc
        finally:
            self._queue.clear()
        return out

    def begin_transaction(self) -> None:
        if self._txn_id is None:
            super().begin_transaction()
        if self._in_txn:
            raise BusError("a transaction is already open")
        self._in_txn = True

    def commit_transaction(
        self, offsets: Mapping[TopicPartition, int], consumer: Consumer, timeout: float = 30.0
    ) -> None:
        if not self._in_txn:
            raise BusError("commit_transaction() without begin_transaction()")
        if not isinstance(consumer, _EmbeddedConsumer):
            raise BusError("an embedded transaction needs an embedded consumer")
        try:
            with self._db.write() as conn:
                epoch = conn.execute(
                    "SELECT epoch FROM producer_epochs WHERE transactional_id=?", (self._txn_id,)
                ).fetchone()[0]
                if epoch != self._epoch:
                    raise ProducerFenced(f"producer {self._txn_id!r} was fenced by a newer instance")
                self._append(conn)
                consumer._commit_in(conn, offsets)
        finally:
            self._queue.clear()
            self._in_txn = False

    def abort_transaction(self, timeout: float = 30.0) -> None:
        self._queue.clear()
        self._in_txn = False

    def close(self) -> None:
        self._db.close()


class _EmbeddedConsumer(Consumer):
    def __init__(self, path: Path, group_id: str, reset: str, session_timeout: float) -> None:
        self._db = _Db(path)
        self.group_id = group_id
        self.member_id = f"{time.time():.6f}-{uuid.uuid4().hex[:8]}"
        self._reset = reset
        self._session_timeout = session_timeout
        self._topics: list[str] = []
        self._on_assign: AssignCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._last_beat = 0.0
        self._holding = threading.Event()

    # -- membership -------------------------------------------------------------------------
    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: AssignCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
    ) -> None:
        for topic in topics:
            _partitions(self._db, topic)
        self._topics = list(topics)
        self._on_assign, self._on_revoke = on_assign, on_revoke
        self._heartbeat(force=True)

    def _heartbeat(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_beat < min(1.0, self._session_timeout / 3):
            return
        with self._db.write() as conn:
            conn.execute(
                "INSERT INTO members VALUES (?, ?, ?, ?) ON CONFLICT(group_id, member_id) "
                "DO UPDATE SET heartbeat=excluded.heartbeat, topics=excluded.topics",
                (self.group_id, self.member_id, ",".join(self._topics), now),
            )
            conn.execute(
                "DELETE FROM members WHERE group_id=? AND heartbeat < ?",
                (self.group_id, now - self._session_timeout),
            )
        self._last_beat = now

    def _target_assignment(self) -> list[TopicPartition]:
        """This member's share: partition p of a topic goes to the (p mod n)-th live subscriber."""
        rows = self._db.read(
            "SELECT member_id, topics FROM members WHERE group_id=? ORDER BY member_id", (self.group_id,)
        )
        out: list[TopicPartition] = []
        for topic in self._topics:
            members = [m for m, topics in rows if topic in topics.split(",")]
            if self.member_id not in members:
                continue
            index = members.index(self.member_id)
            count = _partitions(self._db, topic)
            out.extend(TopicPartition(topic, p) for p in range(count) if p % len(members) == index)
        return out

    def _rebalance(self) -> None:
        target = self._target_assignment()
        # Partitions another member took while this one was silent are simply gone.
        owned = self._owned()
        vanished = [tp for tp in self._assigned if tp not in owned]
        for tp in vanished:
            self._positions.pop(tp, None)
        self._assigned = [tp for tp in self._assigned if tp in owned]
        lost = [tp for tp in self._assigned if tp not in target]
        if lost:
            if self._on_revoke:
                self._on_revoke(lost)  # still the owner here: commits are accepted
            with self._db.write() as conn:
                conn.executemany(
                    "DELETE FROM owners WHERE group_id=? AND topic=? AND partition=? AND member_id=?",
                    [(self.group_id, tp.topic, tp.partition, self.member_id) for tp in lost],
                )
            for tp in lost:
                self._positions.pop(tp, None)
            self._assigned = [tp for tp in self._assigned if tp not in lost]
        wanted = [tp for tp in target if tp not in self._assigned]
        gained = self._claim(wanted) if wanted else []
        if not gained:
            return
        self._assigned = sorted(self._assigned + gained)
        committed = self.committed(gained)
        for tp in gained:
            start = committed[tp]
            if start is None:
                start = 0 if self._reset == "earliest" else self._end(tp)
            self._positions[tp] = start
        if self._on_assign:
            starts = self._on_assign(gained) or {}
            for tp in gained:
                if tp in starts:
                    self._positions[tp] = starts[tp]

    def _owned(self) -> set[TopicPartition]:
        rows = self._db.read(
            "SELECT topic, partition FROM owners WHERE group_id=? AND member_id=?",
            (self.group_id, self.member_id),
        )
        return {TopicPartition(t, p) for t, p in rows}

    def _claim(self, wanted: list[TopicPartition]) -> list[TopicPartition]:
        """Take the partitions whose owner released them or stopped heart-beating."""
        claimed: list[TopicPartition] = []
        with self._db.write() as conn:
            alive = {
                m for (m,) in conn.execute("SELECT member_id FROM members WHERE group_id=?", (self.group_id,))
            }
            for tp in wanted:
                row = conn.execute(
                    "SELECT member_id FROM owners WHERE group_id=? AND topic=? AND partition=?",
                    (self.group_id, tp.topic, tp.partition),
                ).fetchone()
                if row is not None and row[0] != self.member_id and row[0] in alive:
                    continue  # the previous owner has not handed it over yet
                conn.execute(
                    "INSERT INTO owners VALUES (?, ?, ?, ?) ON CONFLICT(group_id, topic, partition) "
                    "DO UPDATE SET member_id=excluded.member_id",
                    (self.group_id, tp.topic, tp.partition, self.member_id),
                )
                claimed.append(tp)
        return claimed

    def _end(self, tp: TopicPartition) -> int:
        rows = self._db.read(
            "SELECT next_offset FROM ends WHERE topic=? AND partition=?", (tp.topic, tp.partition)
        )
        return int(rows[0][0]) if rows else 0

    # -- reading ----------------------------------------------------------------------------
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        if not self._topics:
            raise BusError("poll() before subscribe()")
        deadline = time.monotonic() + timeout
        while True:
            self._heartbeat()
            self._rebalance()
            records = self._read(max_records)
            if records or time.monotonic() >= deadline:
                return records
            time.sleep(min(0.02, max(0.0, deadline - time.monotonic())))

    def _read(self, max_records: int) -> list[Record]:
        """Read fairly: every assigned partition gets a share of `max_records`."""
        out: list[Record] = []
        active = list(self._assigned)
        share = max(1, -(-max_records // max(1, len(active))))
        for tp in active:
            if len(out) >= max_records:
                break
            end = self._end(tp)  # before the rows: a record written after this is read next time
            rows = self._db.read(
                "SELECT offset, key, value, ts, headers FROM log WHERE topic=? AND partition=? "
                "AND offset>=? ORDER BY offset LIMIT ?",
                (tp.topic, tp.partition, self._positions[tp], min(share, max_records - len(out))),
            )
            for offset, key, value, ts, headers in rows:
                out.append(Record(tp.topic, tp.partition, offset, key, value, ts, _unpack_headers(headers)))
            if rows:
                self._positions[tp] = rows[-1][0] + 1
            elif self._positions[tp] < end:  # what is left below the end was compacted away (tombstones)
                self._positions[tp] = end
        return out

    # -- offsets ----------------------------------------------------------------------------
    def _commit_in(self, conn: sqlite3.Connection, offsets: Mapping[TopicPartition, int]) -> None:
        rows = conn.execute(
            "SELECT topic, partition FROM owners WHERE group_id=? AND member_id=?",
            (self.group_id, self.member_id),
        ).fetchall()
        owned = {TopicPartition(t, p) for t, p in rows}
        foreign = [tp for tp in offsets if tp not in owned]
        if foreign:
            raise CommitFailed(
                f"partitions {foreign} are no longer assigned to this consumer; their records will be "
                "re-read by the new owner"
            )
        conn.executemany(
            "INSERT INTO group_offsets VALUES (?, ?, ?, ?) ON CONFLICT(group_id, topic, partition) "
            "DO UPDATE SET next_offset=excluded.next_offset",
            [(self.group_id, tp.topic, tp.partition, off) for tp, off in offsets.items()],
        )

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        if offsets:
            with self._db.write() as conn:
                self._commit_in(conn, offsets)

    def committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int | None]:
        out: dict[TopicPartition, int | None] = {}
        for tp in partitions:
            rows = self._db.read(
                "SELECT next_offset FROM group_offsets WHERE group_id=? AND topic=? AND partition=?",
                (self.group_id, tp.topic, tp.partition),
            )
            out[tp] = int(rows[0][0]) if rows else None
        return out

    def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._positions:
            raise BusError(f"cannot seek {tp}: it is not assigned to this consumer")
        self._positions[tp] = offset

    def position(self, tp: TopicPartition) -> int | None:
        return self._positions.get(tp)

    def end_offsets(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._end(tp) for tp in partitions}

    def assignment(self) -> list[TopicPartition]:
        return list(self._assigned)

    @contextmanager
    def hold(self) -> Iterator[None]:
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(min(1.0, self._session_timeout / 3)):
                self._heartbeat(force=True)

        thread = threading.Thread(target=beat, name="orl-bus-heartbeat", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        try:
            with self._db.write() as conn:
                conn.execute(
                    "DELETE FROM members WHERE group_id=? AND member_id=?", (self.group_id, self.member_id)
                )
                conn.execute(
                    "DELETE FROM owners WHERE group_id=? AND member_id=?", (self.group_id, self.member_id)
                )
        finally:
            self._db.close()
