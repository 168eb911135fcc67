"""The joiner over a real bus: exactly-once samples across a restart in the middle of a window."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections import Counter

import msgspec
import pytest

from online_rl.bus import Bus, BusUnavailable, TopicPartition, Topics, ensure_topics, partition_for
from online_rl.bus.kafka import KafkaBus
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample, decode, encode
from online_rl.stream.join import JoinConfig
from online_rl.stream.joiner import Joiner
from tests.factories import BusFactory, interaction, preference, thumbs


def _samples(bus: Bus, topics: Topics) -> list[TrainingSample]:
    return [decode(r.value, TrainingSample) for r in bus.read_all(topics.samples)]


def _step_until_idle(joiner: Joiner, timeout: float = 60.0) -> None:
    """Step until the joiner has read all its input and a step finds nothing new."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if joiner.step(timeout=0.3).consumed == 0 and joiner.caught_up():
            joiner.step(timeout=0.1)  # the step after catching up closes windows by the clock
            return
    raise AssertionError("the joiner did not catch up with its input")


def test_joiner_restart_mid_window_joins_everything_exactly_once(make_bus: BusFactory) -> None:
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    INTERACTIONS, FEEDBACK = topics.interactions, topics.feedback
    now = [1000.0]
    config = JoinConfig(window_s=30.0, retention_s=120.0)
    producer = bus.producer()
    # Lifetime 1 sees interactions r0..r9 and some feedback; windows are still open.
    for i in range(10):
        producer.produce(INTERACTIONS, encode(interaction(f"r{i}", created_at=1000.0 + i)), f"r{i}".encode())
    for i in range(0, 10, 2):
        producer.produce(FEEDBACK, encode(thumbs(f"r{i}", up=True, created_at=1005.0 + i)), f"r{i}".encode())
    producer.produce(FEEDBACK, encode(preference("r1", "r3")), b"r1")
    producer.produce(FEEDBACK, b"\x01not an event", b"r5")
    # poison that once escaped the decoder as TypeError / AttributeError and crash-looped the joiner
    producer.produce(FEEDBACK, b"\x01" + msgspec.msgpack.encode({"type": []}), b"r5")
    producer.produce(INTERACTIONS, b"\x01" + msgspec.msgpack.encode({1: "interaction"}), b"r6")
    producer.flush()

    first = Joiner(bus, config, transactional_id="joiner-test", clock=lambda: now[0],
                   topics=topics)
    _step_until_idle(first)
    assert len(_samples(bus, topics)) == 1  # only the pair, as soon as both interactions were known
    first.close()

    # Meanwhile: more feedback, a duplicate retry, and late feedback after the window.
    for i in range(1, 10, 2):
        producer.produce(FEEDBACK, encode(thumbs(f"r{i}", up=False, created_at=1010.0 + i)), f"r{i}".encode())
    producer.produce(FEEDBACK, encode(thumbs("r0", up=True, created_at=1005.0)), b"r0")  # same event id
    producer.produce(FEEDBACK, encode(thumbs("r2", up=False, created_at=1100.0)), b"r2")  # late
    producer.flush()

    now[0] = 1200.0  # the windows close while the second lifetime runs
    second = Joiner(bus, config, transactional_id="joiner-test", clock=lambda: now[0],
                   topics=topics)
    _step_until_idle(second)
    second.close()

    samples = _samples(bus, topics)
    counts = Counter(s.sample_id for s in samples)
    assert all(c == 1 for c in counts.values()), counts
    singles = {s.completion.request_id: s.reward for s in samples if s.kind == "single" and s.completion}
    assert singles == {f"r{i}": (1.0 if i % 2 == 0 else 0.0) for i in range(10)}
    assert sum(1 for s in samples if s.kind == "pair") == 1
    assert second.stats["duplicate_feedback"] == 1
    assert second.stats["late_feedback"] == 1
    reasons = sorted(dict(r.headers)["reason"].decode() for r in bus.read_all(topics.dlq))
    assert len(reasons) == 3 and all(r.startswith("MalformedRecord: ") for r in reasons), reasons


def test_a_backlog_is_joined_without_declaring_unread_feedback_late(make_bus: BusFactory) -> None:
    """Interactions are read before their feedback (small batches): windows must wait for it."""
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    producer = bus.producer()
    for i in range(150):
        producer.produce(topics.interactions, encode(interaction(f"b{i}", created_at=1000.0 + i)),
                         f"b{i}".encode())
    for i in range(150):
        producer.produce(topics.feedback, encode(thumbs(f"b{i}", up=True, created_at=1002.0 + i)),
                         f"b{i}".encode())
    producer.flush()
    config = JoinConfig(window_s=30.0, retention_s=60.0, default_reward=0.5)
    joiner = Joiner(bus, config, transactional_id=f"backlog-{topics.prefix}", clock=lambda: 5000.0,
                    topics=topics)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if joiner.step(max_records=40, timeout=0.3).consumed == 0 and joiner.caught_up():
            joiner.step(timeout=0.1)
            break
    joiner.close()
    samples = _samples(bus, topics)
    assert len(samples) == 150
    assert all(s.reward == 1.0 and not s.defaulted for s in samples)
    assert joiner.stats["late_feedback"] == 0


def test_a_transaction_that_cannot_begin_loses_nothing_it_read(make_bus: BusFactory) -> None:
    """The step polls, then its transaction cannot begin (the broker is away, or the producer broke):
    what it read is rewound to the committed offsets before the next step, so every sample still comes
    out once (before, the consumer's position had moved past the batch and it was never joined)."""
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    producer = bus.producer()
    for i in range(10):
        producer.produce(topics.interactions, encode(interaction(f"q{i}", created_at=1000.0 + i)),
                         f"q{i}".encode())
        producer.produce(topics.feedback, encode(thumbs(f"q{i}", up=i % 2 == 0, created_at=1001.0 + i)),
                         f"q{i}".encode())
    producer.flush()
    joiner = Joiner(bus, JoinConfig(window_s=30.0, retention_s=120.0),
                    transactional_id=f"begin-{topics.prefix}", clock=lambda: 5000.0, topics=topics)
    poll, begin = joiner._consumer.poll, joiner._producer.begin_transaction
    read: list[int] = []

    def polled(max_records: int = 500, timeout: float = 1.0) -> list:
        records = poll(max_records, timeout)
        read.append(len(records))
        return records

    def begin_unless_read() -> None:  # the first step that read something cannot begin its transaction
        if read[-1] and not refused:
            refused.append(read[-1])
            raise BusUnavailable("the broker is away")
        begin()

    refused: list[int] = []
    joiner._consumer.poll = polled  # type: ignore[method-assign]
    joiner._producer.begin_transaction = begin_unless_read  # type: ignore[method-assign]
    deadline = time.monotonic() + 60
    while not refused and time.monotonic() < deadline:
        with contextlib.suppress(BusUnavailable):
            joiner.step(timeout=0.3)
    assert refused, "no step read anything"
    _step_until_idle(joiner)
    joiner.close()
    samples = _samples(bus, topics)
    singles = {s.completion.request_id: s.reward for s in samples if s.kind == "single" and s.completion}
    assert singles == {f"q{i}": (1.0 if i % 2 == 0 else 0.0) for i in range(10)}
    assert len(samples) == 10


def test_a_paused_joiner_cannot_commit_windows_its_tasks_new_owner_closes(make_bus: BusFactory) -> None:
    """Joiner A holds open windows and stops hearing from the group (paused past its session: a zombie
    whose client has not noticed yet); B takes every task, restores the windows and closes them. A's
    next step reads nothing and closes the same windows by its clock: its commit carries its inputs'
    positions, which the group refuses, so every sample comes out once (before: a step that read
    nothing committed without that check, and each sample came out twice). Its recovery restores the
    changelog, whose tail is tombstones by then (the embedded bus's reader once stopped short of them)."""
    from online_rl.bus import CommitFailed

    session = 6.0 if isinstance(make_bus(), KafkaBus) else 1.0  # (a broker's least is 6 s)
    bus = make_bus(session_timeout=session)
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    producer = bus.producer()
    for i in range(6):
        producer.produce(topics.interactions, encode(interaction(f"z{i}", created_at=1000.0 + i)),
                         f"z{i}".encode())
    producer.flush()
    now = [1010.0]
    config = JoinConfig(window_s=30.0, retention_s=120.0, default_reward=0.5)
    reader = Joiner(bus, config, transactional_id=f"a-{topics.prefix}", clock=lambda: now[0], topics=topics)
    _step_until_idle(reader)  # reads the interactions and keeps their windows in the changelog
    reader.close()
    # A restores the windows and reads nothing: it holds no position on any input partition, so only
    # the group's committed offsets can make its commit a check of ownership.
    first = Joiner(bus, config, transactional_id=f"a-{topics.prefix}", clock=lambda: now[0], topics=topics)
    _step_until_idle(first)
    assert _samples(bus, topics) == [] and first.open_requests == 6
    first._consumer.poll = lambda max_records=500, timeout=1.0: []  # type: ignore[method-assign]
    time.sleep(session * 1.5)  # past its session: the group drops it
    second = Joiner(make_bus(session_timeout=session), config, transactional_id=f"b-{topics.prefix}",
                    clock=lambda: now[0], topics=topics)
    _step_until_idle(second)
    assert second.open_requests == 6  # restored from the changelog
    now[0] = 2000.0
    second.step(timeout=0.3)
    assert len(_samples(bus, topics)) == 6
    with pytest.raises(CommitFailed):  # (Kafka: unknown member; embedded: partitions not its own)
        first.step(timeout=0.1)
    second.close()
    samples = _samples(bus, topics)
    assert sorted(s.completion.request_id for s in samples if s.completion) == [f"z{i}" for i in range(6)]


@pytest.mark.kafka
def test_a_step_past_the_poll_interval_is_refused_then_retried_not_fatal(kafka_bootstrap: str) -> None:
    """A step that outlasts max.poll.interval.ms gets the joiner evicted from its group; the broker refuses
    that step's transaction, and `run` re-joins and carries on: every sample comes out exactly once."""
    short = {"session.timeout.ms": 6000, "max.poll.interval.ms": 6000, "heartbeat.interval.ms": 500}
    bus = KafkaBus(kafka_bootstrap, consumer_extra=short)
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    producer = bus.producer()
    for i in range(10):
        producer.produce(topics.interactions, encode(interaction(f"p{i}", created_at=1000.0 + i)),
                         f"p{i}".encode())
        producer.produce(topics.feedback, encode(thumbs(f"p{i}", up=True, created_at=1001.0 + i)),
                         f"p{i}".encode())
    producer.flush()

    class SlowFirstStep(Joiner):
        slow = True

        def _lagging_inputs(self, full: bool) -> set[TopicPartition] | None:  # between read and commit
            if self.slow and self.open_requests:  # this step read records
                self.slow = False
                time.sleep(8.0)
            return super()._lagging_inputs(full)

    joiner = SlowFirstStep(bus, JoinConfig(window_s=5.0, retention_s=60.0), group_id=f"g-{topics.prefix}",
                           transactional_id=f"slow-{topics.prefix}", clock=lambda: 5000.0, topics=topics)
    started = time.monotonic()
    joiner.run(lambda: time.monotonic() - started > 30 or len(_samples(bus, topics)) >= 10)
    joiner.close()
    assert joiner.retries >= 1  # the slow step was refused ...
    counts = Counter(s.sample_id for s in _samples(bus, topics))
    assert len(counts) == 10 and set(counts.values()) == {1}  # ... and nothing was lost or doubled
    bus.close()


def test_a_future_dated_event_cannot_close_other_users_windows(make_bus: BusFactory) -> None:
    """One feedback event dated 1e12 (a client's clock, or an attacker's) once moved the watermark there:
    every open window closed at once and all feedback that came in time was dropped as orphan."""
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=1, topics=topics)
    now = [1000.0]
    producer = bus.producer()
    for i in range(5):
        key = f"r{i}".encode()
        producer.produce(topics.interactions, encode(interaction(f"r{i}", created_at=1000.0)), key)
    producer.produce(topics.feedback, encode(thumbs("r0", up=True, created_at=1e12)), b"r0")
    producer.produce(topics.feedback, encode(thumbs("nobody", up=True, created_at=1e12)), b"nobody")
    producer.flush()
    joiner = Joiner(bus, JoinConfig(window_s=30.0, retention_s=120.0, max_clock_skew_s=5.0),
                    transactional_id="joiner-future", clock=lambda: now[0], topics=topics)
    _step_until_idle(joiner)
    for i in range(1, 5):  # the other users' feedback, in time, after the future-dated events were read
        event = thumbs(f"r{i}", up=False, created_at=1003.0)
        producer.produce(topics.feedback, encode(event), f"r{i}".encode())
    producer.flush()
    _step_until_idle(joiner)
    now[0] = 1100.0  # past every window
    _step_until_idle(joiner)
    joiner.close()
    rewards = {s.completion.request_id: s.reward for s in _samples(bus, topics) if s.completion}
    # r0's thumb counts as dated now + 5 s, inside its window; the others came in time and count
    assert rewards == {"r0": 1.0, "r1": 0.0, "r2": 0.0, "r3": 0.0, "r4": 0.0}, joiner.stats
    assert joiner.stats["future_dated"] == 2 and joiner.stats["late_feedback"] == 0


def test_two_joiners_share_the_partitions_and_a_task_moves_between_them(make_bus: BusFactory) -> None:
    """Two joiners of one group split 4 partitions; preferences cross partitions (and so joiners); one
    joiner leaves mid-stream and its tasks move, with their open windows, to the other: every sample
    comes out once, with the reward of all its feedback."""
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=4, topics=topics)
    now = [1000.0]  # no window closes by the clock until the end
    config = JoinConfig(window_s=30.0, retention_s=300.0)
    producer = bus.producer()
    ids = [f"q{i}" for i in range(40)]
    homes = {rid: partition_for(rid.encode(), 4) for rid in ids}
    prefs = [(ids[i], ids[i + 20]) for i in range(10)]
    assert sum(homes[a] != homes[b] for a, b in prefs) >= 5  # most preferences cross partitions

    def send(events: list[tuple[str, str, bytes]]) -> None:
        for topic, key, value in events:
            producer.produce(topic, value, key.encode())
        producer.flush()

    def up(i: int) -> bool:
        return i % 3 == 0

    send([(topics.interactions, rid, encode(interaction(rid, created_at=1000.0 + i / 10)))
          for i, rid in enumerate(ids)]
         + [(topics.feedback, ids[i], encode(thumbs(ids[i], up=up(i), created_at=1005.0))) for i in range(20)]
         + [(topics.feedback, a, encode(preference(a, b, created_at=1006.0))) for a, b in prefs[:5]])

    def joiner(name: str) -> Joiner:
        return Joiner(bus, config, group_id=f"g-{topics.prefix}", transactional_id=f"{name}-{topics.prefix}",
                      clock=lambda: now[0], topics=topics)

    first = joiner("one")
    for _ in range(3):
        first.step(max_records=20, timeout=0.3)
    second = joiner("two")
    deadline = time.monotonic() + 60
    while not (first.tasks and second.tasks and len(first.tasks) + len(second.tasks) == 4):
        assert time.monotonic() < deadline, (first.tasks, second.tasks)
        first.step(max_records=20, timeout=0.2)
        second.step(max_records=20, timeout=0.2)
    # The rest of the feedback arrives while the tasks are split between the two.
    send([(topics.feedback, ids[i], encode(thumbs(ids[i], up=up(i), created_at=1007.0)))
           for i in range(20, 40)]
         + [(topics.feedback, a, encode(preference(a, b, winner="other", created_at=1008.0)))
            for a, b in prefs[5:]])
    for _ in range(4):
        first.step(max_records=20, timeout=0.2)
        second.step(max_records=20, timeout=0.2)
    first.close()  # its tasks move to the second, windows still open
    now[0] = 2000.0
    _step_until_idle(second)
    assert second.tasks == [0, 1, 2, 3]
    second.close()

    samples = _samples(bus, topics)
    counts = Counter(s.sample_id for s in samples)
    assert set(counts.values()) == {1}, [k for k, c in counts.items() if c > 1]
    singles = {s.completion.request_id: s.reward for s in samples if s.kind == "single" and s.completion}
    assert singles == {rid: 1.0 if up(i) else 0.0 for i, rid in enumerate(ids)}
    pairs = {(s.chosen.request_id, s.rejected.request_id) for s in samples if s.kind == "pair" and s.chosen
             and s.rejected}
    assert pairs == {(a, b) for a, b in prefs[:5]} | {(b, a) for a, b in prefs[5:]}
    assert not list(bus.read_all(topics.dlq))


def test_topics_that_are_not_co_partitioned_are_refused_at_start(make_bus: BusFactory) -> None:
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    bus.create_topic(topics.feedback, 3)
    ensure_topics(bus, partitions=2, topics=topics)
    with pytest.raises(ConfigError, match=r"not co-partitioned .*feedback: 3.*same partition count"):
        Joiner(bus, JoinConfig(), topics=topics, transactional_id=f"x-{topics.prefix}")


def test_a_record_on_the_wrong_partition_is_dead_lettered_not_joined(make_bus: BusFactory) -> None:
    """A producer that did not key by request id: its interaction would never meet its feedback."""
    bus = make_bus()
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:8]}")
    ensure_topics(bus, partitions=2, topics=topics)
    home = partition_for(b"w1", 2)
    producer = bus.producer()
    producer.produce(topics.interactions, encode(interaction("w1", created_at=1000.0)), b"w1")
    producer.produce(topics.feedback, encode(thumbs("w1", up=True, created_at=1001.0)), b"w1",
                     partition=1 - home)
    producer.flush()
    joiner = Joiner(bus, JoinConfig(window_s=5.0, default_reward=0.5), transactional_id=f"w-{topics.prefix}",
                    clock=lambda: 5000.0, topics=topics)
    _step_until_idle(joiner)
    joiner.close()
    (sample,) = _samples(bus, topics)
    assert sample.reward == 0.5 and sample.defaulted  # the misplaced thumbs-up was not used
    (letter,) = list(bus.read_all(topics.dlq))
    assert f"belongs on partition {home} of 2" in dict(letter.headers)["reason"].decode()
    assert joiner.stats["wrong_partition"] == 1
