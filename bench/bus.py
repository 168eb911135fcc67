"""Bus benchmark: produce+consume through our bus vs a raw confluent-kafka loop, and the join.

    .venv/bin/python bench/bus.py [--events 50000] [--rounds 3] [--bootstrap HOST:PORT] [--smoke]

Both sides move the same encoded `Interaction` records through the same broker with the same
producer settings (idempotent, acks=all, lz4, linger 5 ms) and commit consumer offsets per batch;
rounds alternate the order (ours then raw, raw then ours, ...) and the ratio of each round is taken
(both sides of a round ran back to back under the same load). The join is measured as events per
second through the transactional `Joiner` on the same broker (interactions + feedback in, samples +
changelog out). The last line is JSON: `ratio` (ours / raw, the median of the rounds) and
`ratio_range` [min, max], the rates (medians), the join rates and the machine. `--smoke`: 2,000
events, 1 round, 500 join events (seconds; CI runs it to check the benchmark still works).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import confluent_kafka as ck

from bench.common import alternated, emit, kafka_broker, spread
from online_rl.bus import Topics, ensure_topics
from online_rl.bus.embedded import EmbeddedBus
from online_rl.bus.kafka import KafkaBus
from online_rl.events import encode
from online_rl.stream.join import JoinConfig, JoinState
from online_rl.stream.joiner import Joiner
from tests.factories import interaction, thumbs

FIELDS = ("ratio", "ratio_range", "ours_events_per_s", "raw_events_per_s", "join_events_per_s",
          "join_embedded_events_per_s", "join_state_events_per_s", "embedded_events_per_s", "events",
          "rounds", "machine")
PRODUCER = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random",
            "linger.ms": 5, "compression.type": "lz4"}


def _payloads(n: int) -> list[tuple[bytes, bytes]]:
    one = encode(interaction("r", completion_token_ids=list(range(64)), completion_logprobs=[-0.5] * 64))
    return [(f"r{i}".encode(), one) for i in range(n)]


def ours(bus: KafkaBus | EmbeddedBus, payloads: list[tuple[bytes, bytes]]) -> float:
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    bus.create_topic(topic, 4)
    start = time.perf_counter()
    producer = bus.producer()
    for key, value in payloads:
        producer.produce(topic, value, key)
    producer.flush(120)
    consumer = bus.consumer(f"g.{topic}")
    consumer.subscribe([topic])
    got = 0
    while got < len(payloads):
        records = consumer.poll(1000, 1.0)
        got += len(records)
        consumer.commit(consumer.next_offsets(records))
    consumer.close()
    return len(payloads) / (time.perf_counter() - start)


def raw(bootstrap: str, bus: KafkaBus, payloads: list[tuple[bytes, bytes]]) -> float:
    topic = f"bench.{uuid.uuid4().hex[:8]}"
    bus.create_topic(topic, 4)
    start = time.perf_counter()
    producer = ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER})
    for key, value in payloads:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": f"g.{topic}",
                            "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = 0
    while got < len(payloads):
        messages = consumer.consume(1000, 1.0)
        got += sum(1 for m in messages if m.error() is None)
        if messages:
            consumer.commit(asynchronous=False)
    consumer.close()
    return len(payloads) / (time.perf_counter() - start)


def join_rate(bus: KafkaBus | EmbeddedBus, n: int) -> float:
    """Events/s through the transactional joiner (n interactions + n feedback events)."""
    topics = Topics(prefix=f"bench{uuid.uuid4().hex[:6]}")
    ensure_topics(bus, partitions=4, topics=topics)
    producer = bus.producer()
    for i in range(n):
        rid = f"j{uuid.uuid4().hex[:12]}"
        producer.produce(topics.interactions, encode(interaction(rid, created_at=1000.0)), rid.encode())
        producer.produce(topics.feedback, encode(thumbs(rid, up=i % 2 == 0, created_at=1001.0)), rid.encode())
    producer.flush(120)
    joiner = Joiner(bus, JoinConfig(window_s=5.0, retention_s=5.0), group_id=f"join-{uuid.uuid4().hex[:6]}",
                    transactional_id=f"bench-{uuid.uuid4().hex[:6]}", clock=lambda: 10_000.0, topics=topics)
    start, consumed = time.perf_counter(), 0
    while consumed < 2 * n:
        consumed += joiner.step(max_records=2000, timeout=1.0).consumed
    joiner.step(timeout=0.2)  # closes the remaining windows
    elapsed = time.perf_counter() - start
    joiner.close()
    return 2 * n / elapsed


def join_state_rate(n: int) -> float:
    """Events/s of the pure join logic (no bus)."""
    events = [(interaction(f"r{i}", created_at=float(i)), thumbs(f"r{i}", up=True, created_at=i + 0.5))
              for i in range(n)]
    state = JoinState(JoinConfig(window_s=5.0, retention_s=5.0))
    start = time.perf_counter()
    for i, (inter, fb) in enumerate(events):
        state.add_interaction(inter)
        state.add_feedback(fb)
        if i % 100 == 0:
            state.advance(float(i))
    state.advance(1e9)
    return 2 * n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--join-events", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bootstrap", default=None, help="an existing broker (default: start one)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.events, args.join_events, args.rounds = 2_000, 500, 1
    payloads = _payloads(args.events)
    with kafka_broker(args.bootstrap) as bootstrap:
        bus = KafkaBus(bootstrap)
        ours(bus, payloads[:2000])  # warm-up: the first group join and producer id on a fresh broker
        raw(bootstrap, bus, payloads[:2000])
        rates: dict[str, list[float]] = {"ours": [], "raw": []}
        for round_, order in enumerate(alternated(args.rounds, ["ours", "raw"])):
            for side in order:
                rates[side].append(ours(bus, payloads) if side == "ours" else raw(bootstrap, bus, payloads))
            print(f"round {round_ + 1}: ours {rates['ours'][-1]:,.0f} ev/s, raw {rates['raw'][-1]:,.0f} ev/s")
        join_kafka = join_rate(bus, args.join_events)
        print(f"joiner on Kafka: {join_kafka:,.0f} events/s")
    with tempfile.TemporaryDirectory() as tmp:
        embedded = EmbeddedBus(Path(tmp) / "bus.db")
        embedded_rate = ours(embedded, payloads[: args.events // 5])
        join_embedded = join_rate(embedded, args.join_events)
        embedded.close()
    print(f"embedded bus: {embedded_rate:,.0f} ev/s produce+consume; joiner {join_embedded:,.0f} events/s")
    state_rate = join_state_rate(args.join_events * 4)
    ratio = spread([o / r for o, r in zip(rates["ours"], rates["raw"], strict=True)])
    print(f"ours / raw = {ratio['median']:.2f} (median of {args.rounds} rounds, range {ratio['min']:.2f}-"
          f"{ratio['max']:.2f}; target >= 0.8)")
    print(f"join logic alone: {state_rate:,.0f} events/s")
    emit({
        "ratio": ratio["median"],
        "ratio_range": [ratio["min"], ratio["max"]],
        "rounds": args.rounds,
        "ours_events_per_s": round(spread(rates["ours"])["median"]),
        "raw_events_per_s": round(spread(rates["raw"])["median"]),
        "join_events_per_s": round(join_kafka),
        "join_embedded_events_per_s": round(join_embedded),
        "join_state_events_per_s": round(state_rate),
        "embedded_events_per_s": round(embedded_rate),
        "events": args.events,
    })


if __name__ == "__main__":
    main()
