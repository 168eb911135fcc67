"""Deployment benchmark: the gateway wired as the Helm chart wires it (its replicas found through a
name, `dns+http://...`, re-resolved every controller pass) against the gateway wired with a fixed
URL list (as `online-rl up` does), side by side in one run over the same inference replica.

    .venv/bin/python bench/deploy.py [--seconds 10] [--rounds 3] [--concurrency 8] [--smoke]

One inference replica (`online-rl serve inference`, embedded model) and two gateways in front of it,
each its own process on the embedded bus: one with `gateway.replicas: [http://127.0.0.1:P]`, one
with `[dns+http://localhost:P]` and a 1 s controller interval (five times the default rate of
re-resolution). A closed loop of `--concurrency` clients sends one-token greedy chats (where the
gateway's own cost is the largest share) for `--seconds`, both gateways in each of `--rounds`
rounds, the order alternating from round to round. The last line is one JSON object:
`throughput_ratio` (DNS-wired over fixed, the median of the per-round ratios) and
`throughput_ratio_range` [min, max], `added_p50_ms` (DNS minus fixed p50), and `discover_ms` (one
re-resolution of the name, measured in this process, median of 200). `--smoke`: 1 round of 1 s
(checks that the benchmark runs).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, embedded_env, emit, spread, start_cli_service
from bench.gateway import Run, closed_loop
from online_rl.config import load_settings
from online_rl.ingest import new_key
from online_rl.models import EMBEDDED_MODEL_ID, prepare_embedded_model
from services.gateway.replicas import ReplicaPool

FIELDS = ("throughput_ratio", "throughput_ratio_range", "added_p50_ms", "discover_ms", "fixed_rps",
          "dns_rps", "fixed_p50_ms", "dns_p50_ms", "rounds", "machine")


def discover_ms(source: str, times: int = 200) -> float:
    """Median milliseconds of one `discover()` of `source` (what each controller pass adds)."""
    pool = ReplicaPool([source], None)

    async def run() -> list[float]:
        out = []
        for _ in range(times):
            start = time.perf_counter()
            await pool.discover()
            out.append((time.perf_counter() - start) * 1e3)
        return out

    return statistics.median(asyncio.run(run()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="Length of each round.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per gateway (alternating).")
    parser.add_argument("--concurrency", type=int, default=8, help="Clients in the closed loop.")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 1.0, 1

    model_dir = prepare_embedded_model(load_settings().model_dir).path
    upstream, upstream_hash = new_key()
    client, client_hash = new_key()
    _, admin_hash = new_key()
    replica, fixed, dns = "http://127.0.0.1:18581", "http://127.0.0.1:18580", "http://127.0.0.1:18582"
    runs: dict[str, list[Run]] = {"fixed": [], "dns": []}
    with tempfile.TemporaryDirectory(prefix="orl-bench-deploy-") as tmp:
        work = Path(tmp)
        common = embedded_env(work, model_dir)
        keys = json.dumps([f"{client_hash} inference", f"{admin_hash} admin"])
        gateway_env = {"ORL_GATEWAY__UPSTREAM_API_KEY": upstream, "ORL_GATEWAY__ROLLOUT__INTERVAL_S": "1",
                       "ORL_GATEWAY__API_KEYS": keys}
        processes = [start_cli_service(["serve", "inference", "--port", "18581"], common | {
            "ORL_INFERENCE__API_KEYS": json.dumps([f"{upstream_hash} inference,admin"])}, replica, "replica")]
        try:
            for name, url, source in (("fixed", fixed, replica), ("dns", dns, "dns+http://localhost:18581")):
                port = url.rsplit(":", 1)[1]
                state = str(work / f"rollout-{name}")
                env = common | gateway_env | {"ORL_GATEWAY__REPLICAS": json.dumps([source]),
                                              "ORL_GATEWAY__ROLLOUT__STATE_DIR": state}
                processes.append(start_cli_service(["serve", "gateway", "--port", port], env, url,
                                                   f"gateway ({name})"))
            print(f"one-token answers, {args.concurrency} clients, {args.rounds} rounds of "
                  f"{args.seconds:.0f} s:")
            urls = {"fixed": fixed, "dns": dns}
            for r, order in enumerate(alternated(args.rounds, list(urls))):
                for name in order:
                    url = urls[name]
                    got = asyncio.run(closed_loop(url, client, args.seconds, args.concurrency, 1))
                    runs[name].append(got)
                    print(f"  round {r + 1} {name:5s}: {got[0] / got[1]:6.1f} req/s, "
                          f"p50 {statistics.median(got[2]) * 1e3:6.1f} ms", flush=True)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
    ratios = [(d[0] / d[1]) / (f[0] / f[1]) for f, d in zip(runs["fixed"], runs["dns"], strict=True)]
    p50 = {k: statistics.median([x for _, _, lat in v for x in lat]) * 1e3 for k, v in runs.items()}
    rps = {k: sum(n for n, _, _ in v) / sum(t for _, t, _ in v) for k, v in runs.items()}
    resolve = discover_ms("dns+http://localhost:18581")
    print(f"DNS-wired / fixed throughput {statistics.median(ratios):.3f}; p50 {p50['fixed']:.1f} -> "
          f"{p50['dns']:.1f} ms; one re-resolution {resolve:.3f} ms")
    ratio = spread(ratios)
    result: dict[str, Any] = {"throughput_ratio": ratio["median"],
                              "throughput_ratio_range": [ratio["min"], ratio["max"]],
                              "added_p50_ms": round(p50["dns"] - p50["fixed"], 2),
                              "discover_ms": round(resolve, 3),
                              "fixed_rps": round(rps["fixed"], 2), "dns_rps": round(rps["dns"], 2),
                              "fixed_p50_ms": round(p50["fixed"], 2), "dns_p50_ms": round(p50["dns"], 2),
                              "concurrency": args.concurrency, "seconds": args.seconds, "rounds": args.rounds,
                              "model": EMBEDDED_MODEL_ID}
    emit(result)


if __name__ == "__main__":
    main()
