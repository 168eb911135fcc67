"""Feedback API benchmark: accepted events/s and latency through the service vs a raw producer.

    .venv/bin/python bench/feedback_api.py [--seconds 5] [--bootstrap HOST:PORT]

The service runs in its own process (`online-rl serve feedback`, uvicorn, one worker) on a real
Kafka broker; a separate load process (aiohttp) posts thumbs events at several concurrency levels,
then batches of 100 on the batch endpoint. The baseline is a raw confluent-kafka producer writing
the same encoded events with acks=all in the same run. The last line is JSON: events_per_s, p50_ms,
p99_ms (single endpoint at the best concurrency: the highest throughput with p99 under 50 ms),
batch_events_per_s, and every level.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.common import ROOT, emit, kafka_broker
from online_rl.events import Feedback, encode
from online_rl.ingest import new_key


def _event(i: int) -> dict[str, Any]:
    return {"event_id": uuid.uuid4().hex, "request_id": f"req-{i}", "user_id": f"user-{i % 5000}",
            "kind": "thumbs", "value": 1 if i % 3 else -1}


async def _drive(url: str, key: str, concurrency: int, seconds: float, batch: int) -> dict[str, Any]:
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
            async with session.post(url + path, json=body, headers=headers) as response:
                await response.read()
                if response.status == 202:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 2 else [0.0] * 99
    return {"concurrency": concurrency, "batch": batch, "events_per_s": len(latencies) * batch / elapsed,
            "p50_ms": q[49] * 1000, "p99_ms": q[98] * 1000, "errors": errors}


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
    print(f"{label:8s} c={s['concurrency']:3d}: {s['events_per_s']:8,.0f} ev/s  "
          f"p50 {s['p50_ms']:6.1f} ms  p99 {s['p99_ms']:6.1f} ms  errors {s['errors']}")


def raw_producer(bootstrap: str, topic: str, n: int) -> float:
    """Events/s of a raw confluent-kafka producer writing the same events, acks=all, confirmed."""
    import confluent_kafka as ck

    values = [encode(Feedback(created_at=time.time(), **_event(i))) for i in range(n)]
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                            "linger.ms": 5, "compression.type": "lz4"})
    start = time.perf_counter()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, f"req-{i}".encode())
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", default="1,8,16,24,32,64")
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    key, digest = new_key()
    port = 18082
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "ORL_CACHE_DIR": cache, "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
               "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_FEEDBACK_API__API_KEYS": f'["{digest}"]',
               "ORL_FEEDBACK_API__RATE_LIMIT_PER_S": "1e9", "ORL_FEEDBACK_API__RATE_BURST": "1e9",
               "ORL_FEEDBACK_API__USER_CAP": "1000000000"}
        server = subprocess.Popen([sys.executable, "-m", "online_rl.cli", "serve", "feedback",
                                   "--port", str(port)], env=env, cwd=ROOT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            load(url, key, 8, 1.0)  # warm-up
            singles = []
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                singles.append(load(url, key, concurrency, args.seconds))
                _report("single", singles[-1])
            batched = load(url, key, 4, args.seconds, batch=100)
            _report("batch100", batched)
        finally:
            server.terminate()
            server.wait(30)
        raw = raw_producer(bootstrap, f"{prefix}.feedback", 50_000)
        print(f"raw producer (same events, acks=all): {raw:,.0f} ev/s")
    # The best concurrency: the highest throughput whose p99 stays under the 50 ms target (or, if
    # none does, the highest throughput).
    within = [s for s in singles if s["p99_ms"] < 50.0] or singles
    best = max(within, key=lambda s: s["events_per_s"])
    emit({
        "events_per_s": round(best["events_per_s"]),
        "p50_ms": round(best["p50_ms"], 2),
        "p99_ms": round(best["p99_ms"], 2),
        "best_concurrency": best["concurrency"],
        "batch_events_per_s": round(batched["events_per_s"]),
        "raw_producer_events_per_s": round(raw),
        "service_vs_raw": round(best["events_per_s"] / raw, 3),
        "levels": [{k: (round(v, 2) if isinstance(v, float) else v) for k, v in s.items()} for s in singles],
    })


if __name__ == "__main__":
    main()
