"""Gateway benchmark: requests through the canary gateway against the same requests sent straight
to the inference replica, side by side in one run.

    .venv/bin/python bench/gateway.py [--seconds 15] [--rounds 3] [--concurrency 8] [--max-tokens 16]
                                      [--smoke]

On the embedded model (SmolLM2-135M-Instruct), one inference replica (`online-rl serve inference`)
and one gateway in front of it (`online-rl serve gateway`, its rollout controller running, no
rollout), each its own process on the embedded bus: a closed loop of `--concurrency` clients sends
greedy chats for `--seconds`, direct and through the gateway in each of `--rounds` rounds, the order
alternating from round to round (direct first, then gateway first, ...) so the machine's drift hits
both. Any failed request stops the run. Then the same with one-token answers, where the gateway's
own cost is the largest share of a request. The last line is one JSON object: `throughput_ratio`
(gateway requests/s over direct: the median of the rounds' ratios) and `throughput_ratio_range`
[min, max], `added_p50_ms` (gateway p50 minus direct p50 of one client alternating one-token requests
between the two, so both see the same machine), the p99s, and the closed loop's figures for one-token
answers (`*_short`). `--smoke`: 1 round of 1 s, 20 probes (checks that the benchmark runs).
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

import httpx

from bench.common import alternated, embedded_env, emit, percentile, spread, start_cli_service
from online_rl.config import load_settings
from online_rl.ingest import new_key
from online_rl.models import EMBEDDED_MODEL_ID, prepare_embedded_model

QUESTIONS = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?",
             "Say hello in Spanish.", "What do bees make?", "Which planet is red?"]


FIELDS = ("throughput_ratio", "throughput_ratio_range", "added_p50_ms", "alone_direct_p50_ms",
          "alone_gateway_p50_ms", "alone_direct_p99_ms", "alone_gateway_p99_ms", "loaded_direct_p50_ms",
          "loaded_gateway_p50_ms", "throughput_ratio_short", "rounds", "machine")
Run = tuple[int, float, list[float]]  # requests, elapsed seconds, latencies (s)


async def closed_loop(url: str, key: str, seconds: float, concurrency: int, max_tokens: int) -> Run:
    """(requests, elapsed s, latencies s) of `concurrency` clients asking for `seconds`."""
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600, limits=limits) as client:
        async def worker(w: int, deadline: float) -> None:
            i = 0
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json={
                    "model": EMBEDDED_MODEL_ID, "max_tokens": max_tokens, "temperature": 0,
                    "user": f"user-{w}",
                    "messages": [{"role": "user", "content": QUESTIONS[(w + i) % len(QUESTIONS)]}]})
                if response.status_code != 200:
                    raise SystemExit(f"a request failed: {response.status_code} {response.text}")
                latencies.append(time.perf_counter() - started)
                i += 1

        await asyncio.gather(*(worker(w, time.monotonic() + 2) for w in range(concurrency)))  # warm up
        latencies.clear()
        start = time.perf_counter()
        await asyncio.gather(*(worker(w, time.monotonic() + seconds) for w in range(concurrency)))
        return len(latencies), time.perf_counter() - start, latencies


async def interleaved(direct: str, gateway: str, key_direct: str, key_gateway: str,
                      requests: int) -> tuple[list[float], list[float]]:
    """Latencies (s) of one client alternating direct and gateway requests for one-token answers:
    both see the same machine at the same moments, so the difference is the gateway's."""
    out: tuple[list[float], list[float]] = ([], [])
    async with httpx.AsyncClient(timeout=600) as client:
        for i in range(requests + 10):
            for side, url, key in ((0, direct, key_direct), (1, gateway, key_gateway)):
                started = time.perf_counter()
                response = await client.post(url + "/v1/chat/completions", headers={
                    "Authorization": f"Bearer {key}"}, json={
                    "model": EMBEDDED_MODEL_ID, "max_tokens": 1, "temperature": 0, "user": "probe",
                    "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}]})
                if response.status_code != 200:
                    raise SystemExit(f"a request failed: {response.status_code} {response.text}")
                if i >= 10:  # the first few warm the connections
                    out[side].append(time.perf_counter() - started)
    return out


def compare(direct: str, gateway: str, key_direct: str, key_gateway: str, args: argparse.Namespace,
            max_tokens: int) -> dict[str, Any]:
    runs: dict[str, list[Run]] = {"direct": [], "gateway": []}
    sides = {"direct": (direct, key_direct), "gateway": (gateway, key_gateway)}
    for r, order in enumerate(alternated(args.rounds, list(sides))):
        for mode in order:
            url, key = sides[mode]
            got = asyncio.run(closed_loop(url, key, args.seconds, args.concurrency, max_tokens))
            runs[mode].append(got)
            p50, p99 = percentile(got[2], 50) * 1e3, percentile(got[2], 99) * 1e3
            print(f"  round {r + 1} {mode:7s}: {got[0] / got[1]:6.1f} req/s, p50 {p50:7.1f} ms, "
                  f"p99 {p99:7.1f} ms", flush=True)
    out: dict[str, Any] = {}
    for mode, got in runs.items():
        out[f"{mode}_rps"] = sum(n for n, _, _ in got) / sum(t for _, t, _ in got)
        every = [x for _, _, lat in got for x in lat]
        out[f"{mode}_p50_ms"] = statistics.median(every) * 1e3
        out[f"{mode}_p99_ms"] = percentile(every, 99) * 1e3
    # The ratio per round pair, then their median: each pair ran back to back under the same load.
    ratios = [(g[0] / g[1]) / (d[0] / d[1]) for d, g in zip(runs["direct"], runs["gateway"], strict=True)]
    ratio = spread(ratios)
    out["throughput_ratio"], out["throughput_ratio_range"] = ratio["median"], [ratio["min"], ratio["max"]]
    out["added_p50_ms"] = out["gateway_p50_ms"] - out["direct_p50_ms"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=15.0, help="Length of each round.")
    parser.add_argument("--rounds", type=int, default=3, help="Rounds per mode (alternating).")
    parser.add_argument("--concurrency", type=int, default=8, help="Clients in the closed loop.")
    parser.add_argument("--max-tokens", type=int, default=16, help="Tokens per answer (main workload).")
    parser.add_argument("--probes", type=int, default=200, help="Interleaved latency probes each way.")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.probes = 1.0, 1, 20

    model_dir = prepare_embedded_model(load_settings().model_dir).path
    upstream, upstream_hash = new_key()
    client, client_hash = new_key()
    _, admin_hash = new_key()
    with tempfile.TemporaryDirectory(prefix="orl-bench-gateway-") as tmp:
        work = Path(tmp)
        common = embedded_env(work, model_dir)
        replica = "http://127.0.0.1:18481"
        gateway = "http://127.0.0.1:18480"
        processes = [start_cli_service(["serve", "inference", "--port", "18481"], common | {
            "ORL_INFERENCE__API_KEYS": json.dumps([f"{upstream_hash} inference,admin"])}, replica, "replica")]
        try:
            processes.append(start_cli_service(["serve", "gateway", "--port", "18480"], common | {
                "ORL_GATEWAY__REPLICAS": json.dumps([replica]), "ORL_GATEWAY__UPSTREAM_API_KEY": upstream,
                "ORL_GATEWAY__API_KEYS": json.dumps([f"{client_hash} inference", f"{admin_hash} admin"])},
                gateway, "gateway"))
            print(f"answers of {args.max_tokens} tokens, {args.concurrency} clients:", flush=True)
            main_run = compare(replica, gateway, upstream, client, args, args.max_tokens)
            print(f"answers of 1 token, {args.concurrency} clients:", flush=True)
            short = compare(replica, gateway, upstream, client, args, 1)
            print(f"latency: one client, {args.probes} one-token requests each way, interleaved", flush=True)
            probes = interleaved(replica, gateway, upstream, client, args.probes)
            alone_direct, alone_gateway = asyncio.run(probes)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=60)
    alone = {"direct_p50_ms": statistics.median(alone_direct) * 1e3,
             "gateway_p50_ms": statistics.median(alone_gateway) * 1e3,
             "direct_p99_ms": percentile(alone_direct, 99) * 1e3,
             "gateway_p99_ms": percentile(alone_gateway, 99) * 1e3}
    added = alone["gateway_p50_ms"] - alone["direct_p50_ms"]
    print(f"gateway/direct throughput {main_run['throughput_ratio']:.3f} (1-token answers "
          f"{short['throughput_ratio']:.3f}); added p50 {added:.2f} ms alone "
          f"({alone['direct_p50_ms']:.1f} -> {alone['gateway_p50_ms']:.1f} ms), "
          f"{main_run['added_p50_ms']:.1f} ms under load")
    result: dict[str, Any] = {"throughput_ratio": round(main_run["throughput_ratio"], 3),
                              "added_p50_ms": round(added, 2)}
    result |= {f"alone_{k}": round(v, 2) for k, v in alone.items()}
    result["throughput_ratio_range"] = main_run["throughput_ratio_range"]
    result |= {f"loaded_{k}" if "_ms" in k else k: round(v, 2)
               for k, v in main_run.items() if k not in result}
    result |= {f"{k}_short": v if isinstance(v, list) else round(v, 3 if k == "throughput_ratio" else 2)
               for k, v in short.items()}
    result |= {"concurrency": args.concurrency, "max_tokens": args.max_tokens, "seconds": args.seconds,
               "rounds": args.rounds, "model": EMBEDDED_MODEL_ID}
    emit(result)


if __name__ == "__main__":
    main()
