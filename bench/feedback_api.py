"""Feedback API benchmark: events/s and latency of every request through the service, against a raw
Kafka producer, over alternated rounds.

    .venv/bin/python bench/feedback_api.py [--rounds 3] [--seconds 5] [--concurrency 1,8,16,24,32,64]
        [--bootstrap HOST:PORT | --kafka-port 19296] [--smoke]

The service runs in its own process (`online-rl serve feedback`, uvicorn, one worker) on a real Kafka
broker (started on `--kafka-port` for the run unless `--bootstrap` names one). Each round has two
sides, run in alternated order (service, raw | raw, service | ...):
- service: a separate load process (aiohttp) posts thumbs events for `--seconds` at each concurrency
  level (ascending in even rounds, descending in odd ones), then batches of 100 at concurrency 4 on
  the batch endpoint. Every request counts: latency is measured on every answer, 202 or not (and on
  requests that failed without one), and a level's `error_rate` is its non-202 share;
  `events_per_s` counts the events accepted (202) per second of the level.
- raw: a confluent-kafka producer writing `--raw-events` of the same encoded events, acks=all,
  idempotent, every delivery confirmed (after one warm-up record).
Figures are medians over the rounds, each with its [min, max] in `<name>_range`. The best concurrency
is the level with the highest median events/s among those with no error in any round and a median
p99 under 50 ms (or, if none stays under 50 ms, among those with no error: `p99_target_met` false);
when every level had errors there is no best and its fields are null. `service_vs_raw` is, per
round, the best level's events/s over the raw producer's.

The last line is JSON with `FIELDS`; `levels` has every concurrency level (events_per_s with its
range, p50_ms, p99_ms, requests, errors, error_rate, qualifies). `--smoke`: 1 round, levels 1 and 8,
0.5 s each, 2,000 raw events; the broker still starts (seconds), every field is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, kafka_broker, percentile, spread, start_cli_service
from online_rl.events import Feedback, encode
from online_rl.ingest import new_key

FIELDS: tuple[str, ...] = (
    "rounds", "seconds", "best_concurrency", "p99_target_ms", "p99_target_met",
    "events_per_s", "events_per_s_range", "p50_ms", "p50_ms_range", "p99_ms", "p99_ms_range",
    "batch_events_per_s", "batch_events_per_s_range", "batch_error_rate",
    "raw_producer_events_per_s", "raw_producer_events_per_s_range", "service_vs_raw", "service_vs_raw_range",
    "levels",
)
P99_TARGET_MS = 50.0
BATCH, BATCH_CONCURRENCY = 100, 4
SMOKE = {"rounds": 1, "seconds": 0.5, "concurrency": "1,8", "raw_events": 2000}


def _event(i: int) -> dict[str, Any]:
    return {"event_id": uuid.uuid4().hex, "request_id": f"req-{i}", "user_id": f"user-{i % 5000}",
            "kind": "thumbs", "value": 1 if i % 3 else -1}


async def _drive(url: str, key: str, concurrency: int, seconds: float, batch: int) -> dict[str, Any]:
    """Post for `seconds` from `concurrency` clients: every request's latency, and which were not 202."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    headers = {"Authorization": f"Bearer {key}"}
    path = "/v1/feedback" if batch == 1 else "/v1/feedback/batch"
    counter = iter(range(10**9))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            body: Any = _event(next(counter)) if batch == 1 else {
                "events": [_event(next(counter)) for _ in range(batch)]}
            start = time.perf_counter()
            try:
                async with session.post(url + path, json=body, headers=headers) as response:
                    await response.read()
                    accepted = response.status == 202
            except (TimeoutError, aiohttp.ClientError):
                accepted = False
            latencies.append(time.perf_counter() - start)
            if not accepted:
                errors += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    requests = len(latencies)
    return {"concurrency": concurrency, "batch": batch, "requests": requests, "errors": errors,
            "error_rate": errors / requests if requests else 1.0,
            "events_per_s": (requests - errors) * batch / elapsed,
            "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000}


def _load_process(url: str, key: str, concurrency: int, seconds: float, batch: int, out: Any) -> None:
    out.put(asyncio.run(_drive(url, key, concurrency, seconds, batch)))


def load(url: str, key: str, concurrency: int, seconds: float, batch: int = 1) -> dict[str, Any]:
    """Run the load generator in a separate process and return its figures."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_load_process, args=(url, key, concurrency, seconds, batch, queue))
    proc.start()
    try:
        result: dict[str, Any] = queue.get(timeout=seconds + 120)
    finally:
        proc.join(10)
    return result


def _report(label: str, s: dict[str, Any]) -> None:
    print(f"  {label:8s} c={s['concurrency']:3d}: {s['events_per_s']:8,.0f} ev/s  p50 {s['p50_ms']:6.1f} ms  "
          f"p99 {s['p99_ms']:6.1f} ms  requests {s['requests']:6d}  error_rate {s['error_rate']:.4f}",
          flush=True)


def raw_producer(bootstrap: str, topic: str, n: int) -> float:
    """Events/s of a raw confluent-kafka producer writing the same events, acks=all, confirmed."""
    import confluent_kafka as ck

    values = [encode(Feedback(created_at=time.time(), **_event(i))) for i in range(n)]
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                            "linger.ms": 5, "compression.type": "lz4"})
    producer.produce(topic, values[0], b"warm-up")  # connect and get the producer id outside the timing
    producer.flush(60)
    start = time.perf_counter()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, f"req-{i}".encode())
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(60):
        raise SystemExit("the raw producer could not deliver every event within 60 s")
    return n / (time.perf_counter() - start)


def service_side(url: str, key: str, levels: list[str], seconds: float) -> dict[str, Any]:
    """One round of the service: each concurrency level in the given order, then the batch endpoint."""
    singles = {}
    for level in levels:
        singles[int(level)] = load(url, key, int(level), seconds)
        _report("single", singles[int(level)])
    batched = load(url, key, BATCH_CONCURRENCY, seconds, batch=BATCH)
    _report(f"batch{BATCH}", batched)
    return {"singles": singles, "batch": batched}


def _median_range(result: dict[str, Any], name: str, values: list[float], digits: int) -> None:
    s = spread(values, digits)
    result[name], result[f"{name}_range"] = s["median"], [s["min"], s["max"]]


def _error_rate(runs: list[dict[str, Any]]) -> float:
    """The share of all requests of `runs` that did not get a 202."""
    return round(sum(s["errors"] for s in runs) / max(sum(s["requests"] for s in runs), 1), 5)


def summarize_levels(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency level over the rounds: medians with ranges, every request and error counted."""
    levels = []
    for concurrency in sorted(rounds[0]["singles"]):
        runs = [r["singles"][concurrency] for r in rounds]
        level: dict[str, Any] = {"concurrency": concurrency}
        _median_range(level, "events_per_s", [s["events_per_s"] for s in runs], 1)
        level["p50_ms"] = spread([s["p50_ms"] for s in runs], 2)["median"]
        level["p99_ms"] = spread([s["p99_ms"] for s in runs], 2)["median"]
        level["requests"] = sum(s["requests"] for s in runs)
        level["errors"] = sum(s["errors"] for s in runs)
        level["error_rate"] = _error_rate(runs)
        level["qualifies"] = level["errors"] == 0 and level["requests"] > 0
        levels.append(level)
    return levels


def best_level(levels: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, bool]:
    """The best level (None when every level had errors) and whether it meets the p99 target."""
    clean = [level for level in levels if level["qualifies"]]
    within = [level for level in clean if level["p99_ms"] < P99_TARGET_MS]
    pool = within or clean
    return (max(pool, key=lambda level: level["events_per_s"]) if pool else None), bool(within)


def summarize(rounds: list[dict[str, Any]], raw: list[float]) -> dict[str, Any]:
    levels = summarize_levels(rounds)
    best, met = best_level(levels)
    result: dict[str, Any] = {"best_concurrency": best["concurrency"] if best else None,
                              "p99_target_ms": P99_TARGET_MS, "p99_target_met": met, "levels": levels}
    if best is None:
        for name in ("events_per_s", "p50_ms", "p99_ms", "service_vs_raw"):
            result[name], result[f"{name}_range"] = None, None
    else:
        runs = [r["singles"][best["concurrency"]] for r in rounds]
        _median_range(result, "events_per_s", [s["events_per_s"] for s in runs], 1)
        _median_range(result, "p50_ms", [s["p50_ms"] for s in runs], 2)
        _median_range(result, "p99_ms", [s["p99_ms"] for s in runs], 2)
        ratios = [s["events_per_s"] / r for s, r in zip(runs, raw, strict=True)]
        _median_range(result, "service_vs_raw", ratios, 4)
    batches = [r["batch"] for r in rounds]
    _median_range(result, "batch_events_per_s", [b["events_per_s"] for b in batches], 1)
    result["batch_error_rate"] = _error_rate(batches)
    _median_range(result, "raw_producer_events_per_s", raw, 1)
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Alternated service/raw rounds.")
    parser.add_argument("--seconds", type=float, default=5.0, help="Load per concurrency level and round.")
    parser.add_argument("--concurrency", default="1,8,16,24,32,64", help="Comma-separated levels.")
    parser.add_argument("--raw-events", type=int, default=50_000, help="Events per raw producer run.")
    parser.add_argument("--bootstrap", default=None, help="An existing broker; else one is started.")
    parser.add_argument("--kafka-port", type=int, default=19296,
                        help="Port of the broker started for the run (its own: no other benchmark's load).")
    parser.add_argument("--port", type=int, default=18082, help="Port of the feedback service.")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes that still print every field.")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.seconds <= 0 or args.raw_events < 1:
        parser.error("--seconds must be positive and --raw-events at least 1")
    return args


def main() -> None:
    args = parse_args()
    key, digest = new_key()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    levels = [c.strip() for c in args.concurrency.split(",") if c.strip()]
    rounds: list[dict[str, Any]] = []
    raw: list[float] = []
    with kafka_broker(args.bootstrap, args.kafka_port) as bootstrap, tempfile.TemporaryDirectory() as cache:
        env = {"ORL_CACHE_DIR": cache, "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
               "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_FEEDBACK_API__API_KEYS": f'["{digest}"]',
               "ORL_FEEDBACK_API__RATE_LIMIT_PER_S": "1e9", "ORL_FEEDBACK_API__RATE_BURST": "1e9",
               "ORL_FEEDBACK_API__USER_CAP": "1000000000"}
        url = f"http://127.0.0.1:{args.port}"
        server = start_cli_service(["serve", "feedback", "--port", str(args.port)], env, url,
                                   "feedback service", timeout_s=60)
        try:
            load(url, key, 8, 1.0)  # warm-up
            for r, (order, level_order) in enumerate(zip(alternated(args.rounds, ["service", "raw"]),
                                                         alternated(args.rounds, levels), strict=True)):
                print(f"round {r + 1}/{args.rounds}: {', '.join(order)}", flush=True)
                for side in order:
                    if side == "service":
                        rounds.append(service_side(url, key, level_order, args.seconds))
                    else:
                        raw.append(raw_producer(bootstrap, f"{prefix}.feedback", args.raw_events))
                        print(f"  raw producer (same events, acks=all): {raw[-1]:,.0f} ev/s", flush=True)
        finally:
            server.terminate()
            server.wait(30)
    result = {"rounds": args.rounds, "seconds": args.seconds, **summarize(rounds, raw)}
    for level in result["levels"]:
        print(f"c={level['concurrency']:3d}: median {level['events_per_s']:8,.0f} ev/s "
              f"{level['events_per_s_range']}  p99 {level['p99_ms']:6.1f} ms  "
              f"error_rate {level['error_rate']}"
              f"{'' if level['qualifies'] else '  (errors: not eligible as best)'}", flush=True)
    emit(result)


if __name__ == "__main__":
    main()
