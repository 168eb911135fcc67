"""Scale-out benchmark: 1, 2 and 3 joiner processes on a 6-partition backlog, and 1 and 2 gateway proxies.

    .venv/bin/python bench/scale.py [--events 100000] [--rounds 3] [--seconds 15] [--bootstrap HOST:PORT]
                                    [--smoke]

Each run writes a backlog of `--events` interactions and as many thumbs (keyed by request id, so
co-partitioned) to fresh topics of 6 partitions, starts k `online-rl join` processes in one consumer
group, and times the joiners' committed progress (the group's committed input offsets) from 10 % to
90 % of the backlog: the start-up of the processes and the tail are left out. The sides (k = 1, 2, 3)
alternate their order over rounds; figures are medians with their range. `scaling_k_vs_1` is the
median over rounds of (rate with k joiners) / (rate with one, same round). On a machine with fewer
cores than joiners (the broker and the backlog's reader share them too) the ratio is bounded by the
cores: `per_core_events_per_s` is events per CPU-second of the joiner processes (what one core
joins), and `events_per_cpu_s_k` the same with k joiners (flat in k: the work divides without
overhead, and the wall-clock rate grows with the cores given).

Gateway proxies (`gateway.role: proxy`): k proxy processes relay a closed loop of `--concurrency`
clients (spread over the proxies) for `--seconds` to a stand-in replica that answers at once
(bench/upstream_stub.py), so the proxies' relay, not generation, bounds the rate; the rollout state
they route by is on the broker. `proxies_2_vs_1` is the median over rounds of (requests/s with two
proxies) / (with one); `proxy_requests_per_cpu_s_k` counts requests per CPU-second of the proxy
processes (the per-core relay figure). The clients and the stand-in share the machine's cores.

The last line is JSON. `--smoke`: 20,000 events, 3 s of requests, 1 round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.common import ROOT, alternated, emit, kafka_broker, put_spread
from online_rl.bus import TopicPartition, Topics, ensure_topics
from online_rl.bus.kafka import KafkaBus
from online_rl.events import encode
from online_rl.ports import free_port
from tests.factories import interaction, thumbs

FIELDS = ("joiner_events_per_s_1", "joiner_events_per_s_2", "joiner_events_per_s_3", "scaling_2_vs_1",
          "scaling_2_vs_1_range", "scaling_3_vs_1", "scaling_3_vs_1_range", "per_core_events_per_s",
          "partitions", "events", "rounds", "cores", "proxy_requests_per_s_1", "proxy_requests_per_s_2",
          "proxies_2_vs_1", "proxies_2_vs_1_range", "proxy_requests_per_cpu_s_1",
          "proxy_requests_per_cpu_s_2", "machine")
PARTITIONS = 6


def backlog(bus: KafkaBus, topics: Topics, n: int) -> None:
    ensure_topics(bus, topics, PARTITIONS)
    producer = bus.producer()
    start = 1_000_000.0
    for i in range(n):
        rid = f"r{i}-{uuid.uuid4().hex[:6]}"
        at = start + i * 0.001
        producer.produce(topics.interactions, encode(interaction(rid, created_at=at)), rid.encode())
        producer.produce(topics.feedback, encode(thumbs(rid, up=i % 2 == 0, created_at=at + 0.5)),
                         rid.encode())
    producer.flush(300)


def committed(bus: KafkaBus, group: str, topics: Topics) -> int:
    consumer = bus.consumer(group)
    try:
        tps = [TopicPartition(t, p) for t in (topics.interactions, topics.feedback)
               for p in range(PARTITIONS)]
        return sum(offset or 0 for offset in consumer.committed(tps).values())
    finally:
        consumer.close()


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU time of the processes so far (Linux /proc; None elsewhere)."""
    total = 0.0
    try:
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


def holds_tasks(port: int) -> bool:
    """Whether the joiner serving metrics on `port` holds at least one task."""
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.HTTPError:
        return False
    return any(line.startswith("orl_joiner_tasks ") and float(line.split()[1]) > 0
               for line in text.splitlines())


def run_joiners(bus: KafkaBus, bootstrap: str, k: int, n: int, work: Path) -> tuple[float, float | None]:
    """Events/s of k joiner processes over a fresh backlog of n interactions + n thumbs, and events per
    CPU-second of the joiners (what one core joins, whatever the machine's other load)."""
    prefix = f"scale{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix=prefix)
    backlog(bus, topics, n)
    group = f"scale-{prefix}"
    env = {**os.environ, "ORL_CACHE_DIR": str(work), "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
           "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_BUS__PARTITIONS": str(PARTITIONS),
           "ORL_JOIN__GROUP_ID": group,
           "ORL_JOIN__WINDOW_S": "5", "ORL_JOIN__RETENTION_S": "60", "ORL_LOG_LEVEL": "WARNING"}
    ports = [free_port() for _ in range(k)]
    procs = [subprocess.Popen([sys.executable, "-m", "online_rl.cli", "join", "--metrics-port", str(port)],
                              cwd=ROOT, env={**env, "ORL_JOIN__INSTANCE": f"{prefix}-{i}"},
                              stdout=subprocess.DEVNULL, stderr=(work / f"{prefix}-{i}.log").open("wb"))
             for i, port in enumerate(ports)]
    total = 2 * n
    marks: dict[str, tuple[float, int]] = {}
    cpu: dict[str, float | None] = {}
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = committed(bus, group, topics)
            now = time.perf_counter()
            # From 10 % of the backlog, once every joiner holds tasks (the first one started would
            # otherwise read alone until the others have joined the group).
            if "start" not in marks and done >= 0.1 * total and all(holds_tasks(port) for port in ports):
                marks["start"] = (now, done)
                cpu["start"] = cpu_seconds([p.pid for p in procs])
            if done >= 0.9 * total and "start" in marks:
                marks["end"] = (now, done)
                cpu["end"] = cpu_seconds([p.pid for p in procs])
                break
            if done >= 0.9 * total:
                raise SystemExit(f"the backlog ({n} events) was read before all {k} joiners held tasks: "
                                 "use a larger --events")
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    tail = (work / f"{prefix}-{i}.log").read_text(errors="replace")[-3000:]
                    raise SystemExit(f"joiner {i} of {k} exited during the benchmark:\n{tail}")
            time.sleep(0.1)
        else:
            raise SystemExit(f"{k} joiners did not get through the backlog in 600 s")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    (t0, d0), (t1, d1) = marks["start"], marks["end"]
    c0, c1 = cpu.get("start"), cpu.get("end")
    per_cpu = (d1 - d0) / max(c1 - c0, 1e-6) if c0 is not None and c1 is not None else None
    return (d1 - d0) / max(t1 - t0, 1e-6), per_cpu


async def _closed_loop(urls: list[str], key: str, seconds: float, concurrency: int) -> int:
    """Requests answered 200 by `concurrency` clients spread over `urls` in `seconds`; any other
    answer stops the run."""
    body = {"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    done = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(headers=headers, timeout=60, limits=limits) as client:
        async def worker(w: int, deadline: float) -> None:
            nonlocal done
            url, i = urls[w % len(urls)], 0
            while time.monotonic() < deadline:
                answer = await client.post(url + "/v1/chat/completions", json=body | {"user": f"u{w}-{i}"})
                if answer.status_code != 200:
                    raise SystemExit(f"a proxy answered {answer.status_code}: {answer.text[:300]}")
                done, i = done + 1, i + 1

        deadline = time.monotonic() + seconds
        await asyncio.gather(*(worker(w, deadline) for w in range(concurrency)))
    return done


def run_proxies(bootstrap: str, k: int, seconds: float, concurrency: int,
                work: Path) -> tuple[float, float | None]:
    """Requests/s through k proxy processes, and requests per CPU-second of the proxies."""
    from online_rl.ingest import hash_key, new_key

    prefix = f"proxy{uuid.uuid4().hex[:8]}"
    client_key, _ = new_key()
    upstream_key, _ = new_key()
    stub_port = free_port()
    stub = subprocess.Popen([sys.executable, str(ROOT / "bench" / "upstream_stub.py"), str(stub_port)],
                            cwd=ROOT)
    ports = [free_port() for _ in range(k)]
    env = {**os.environ, "ORL_CACHE_DIR": str(work / prefix), "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
           "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_GATEWAY__ROLE": "proxy", "ORL_LOG_LEVEL": "WARNING",
           "ORL_GATEWAY__REPLICAS": json.dumps([f"http://127.0.0.1:{stub_port}"]),
           "ORL_GATEWAY__UPSTREAM_API_KEY": upstream_key, "ORL_GATEWAY__RATE_LIMIT_PER_S": "1000000",
           "ORL_GATEWAY__RATE_BURST": "1000000",
           "ORL_GATEWAY__API_KEYS": json.dumps([f"{hash_key(client_key)} inference"])}
    procs = [subprocess.Popen([sys.executable, "-m", "services.gateway"], cwd=ROOT,
                              env={**env, "ORL_GATEWAY__PORT": str(port)}, stdout=subprocess.DEVNULL,
                              stderr=(work / f"{prefix}-{i}.log").open("wb"))
             for i, port in enumerate(ports)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        deadline = time.monotonic() + 120
        while not all(_ready(url) for url in urls):
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    tail = (work / f"{prefix}-{i}.log").read_text(errors="replace")[-3000:]
                    raise SystemExit(f"proxy {i} of {k} exited during start-up:\n{tail}")
            if time.monotonic() > deadline:
                raise SystemExit("the proxies did not become ready in 120 s")
            time.sleep(0.3)
        asyncio.run(_closed_loop(urls, client_key, min(2.0, seconds), concurrency))  # warm-up
        cpu0, t0 = cpu_seconds([p.pid for p in procs]), time.perf_counter()
        done = asyncio.run(_closed_loop(urls, client_key, seconds, concurrency))
        cpu1, t1 = cpu_seconds([p.pid for p in procs]), time.perf_counter()
    finally:
        for p in [*procs, stub]:
            p.send_signal(signal.SIGTERM)
        for p in [*procs, stub]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    per_cpu = done / max(cpu1 - cpu0, 1e-6) if cpu0 is not None and cpu1 is not None else None
    return done / (t1 - t0), per_cpu


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000,
                        help="Interactions in each backlog (as many thumbs).")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="Seconds of requests per proxy run.")
    parser.add_argument("--concurrency", type=int, default=32, help="Clients of the proxies.")
    parser.add_argument("--bootstrap", default=None, help="A running broker (default: start one).")
    parser.add_argument("--smoke", action="store_true",
                        help="20,000 events, 1 round (checks the benchmark runs).")
    args = parser.parse_args()
    events, rounds = (20_000, 1) if args.smoke else (args.events, args.rounds)
    seconds = 3.0 if args.smoke else args.seconds
    sides = ["1", "2", "3"]
    rates: dict[str, list[float]] = {s: [] for s in sides}
    per_cpu: dict[str, list[float]] = {s: [] for s in sides}
    proxy_rates: dict[str, list[float]] = {"1": [], "2": []}
    proxy_cpu: dict[str, list[float]] = {"1": [], "2": []}
    with kafka_broker(args.bootstrap) as bootstrap, tempfile.TemporaryDirectory() as tmp:
        bus = KafkaBus(bootstrap)
        for r, order in enumerate(alternated(rounds, sides)):
            for side in order:
                rate, cpu_rate = run_joiners(bus, bootstrap, int(side), events, Path(tmp))
                rates[side].append(rate)
                if cpu_rate is not None:
                    per_cpu[side].append(cpu_rate)
                print(f"round {r + 1}: {side} joiner(s): {rate:,.0f} events/s, "
                      f"{cpu_rate or float('nan'):,.0f} events per joiner CPU-second", flush=True)
            for side in (["1", "2"] if r % 2 == 0 else ["2", "1"]):
                rate, cpu_rate = run_proxies(bootstrap, int(side), seconds, args.concurrency, Path(tmp))
                proxy_rates[side].append(rate)
                if cpu_rate is not None:
                    proxy_cpu[side].append(cpu_rate)
                print(f"round {r + 1}: {side} proxy(ies): {rate:,.0f} requests/s, "
                      f"{cpu_rate or float('nan'):,.0f} requests per proxy CPU-second", flush=True)
        bus.close()
    result: dict[str, object] = {"partitions": PARTITIONS, "events": 2 * events, "rounds": rounds,
                                 "cores": os.cpu_count()}
    for side in sides:
        put_spread(result, f"joiner_events_per_s_{side}", rates[side], 0)
    for k in ("2", "3"):
        put_spread(result, f"scaling_{k}_vs_1", [a / b for a, b in zip(rates[k], rates["1"], strict=True)])
    for side in sides:
        if per_cpu[side]:
            put_spread(result, f"events_per_cpu_s_{side}", per_cpu[side], 0)
    # What one core joins: events per CPU-second of the joiner processes (the one-joiner rate where the
    # platform cannot say).
    result["per_core_events_per_s"] = result.get("events_per_cpu_s_1", result["joiner_events_per_s_1"])
    for side in ("1", "2"):
        put_spread(result, f"proxy_requests_per_s_{side}", proxy_rates[side], 0)
        if proxy_cpu[side]:
            put_spread(result, f"proxy_requests_per_cpu_s_{side}", proxy_cpu[side], 0)
    put_spread(result, "proxies_2_vs_1",
               [a / b for a, b in zip(proxy_rates["2"], proxy_rates["1"], strict=True)])
    print(f"proxies: 2 vs 1 {result['proxies_2_vs_1']}", flush=True)
    print(f"scaling: 2 vs 1 {result['scaling_2_vs_1']}, 3 vs 1 {result['scaling_3_vs_1']} "
          f"on {os.cpu_count()} cores", flush=True)
    emit(result)


if __name__ == "__main__":
    main()
