"""What holding an answer until Kafka confirms its interaction record costs: the inference service with
`inference.log_confirm_s: 2` (the default) against `log_confirm_s: 0` (answer at once, the record
written after), same prompts, alternated over rounds.

    deploy/local/env.sh .venv/bin/python bench/interaction_log.py [--bootstrap HOST:PORT] [--rounds 5]
        [--requests 40] [--max-tokens 16] [--model DIR --model-name NAME] [--smoke]

Two `online-rl serve inference` processes (transformers engine, the embedded model unless `--model`
names one), each logging to its own topics on the Kafka broker (started for the run unless
`--bootstrap` names one). Each round sends `--requests` greedy chat requests, one at a time, to each
side (in alternated order) and takes each side's median latency. Figures: `confirm_p50_ms`,
`at_once_p50_ms`, `confirm_added_ms` (the difference) and `confirm_vs_at_once` (the ratio; median of
the rounds, `_range` their [min, max]); `logged_confirm` / `logged_at_once`: interactions the bus
confirmed, against `requests_per_side` (equal). `--smoke`: 1 round of 5 requests of 4 tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, kafka_broker, put_spread

FIELDS = ("confirm_p50_ms", "at_once_p50_ms", "confirm_added_ms", "confirm_vs_at_once",
          "confirm_vs_at_once_range", "logged_confirm", "logged_at_once", "requests_per_side", "rounds")
PROMPTS = ("What is the capital of France?", "Name a fruit.", "How many legs has a spider?",
           "Say hello.", "What colour is the sky?")


def _logged(url: str) -> float:
    import httpx

    match = re.search(r"^orl_interactions_logged (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.M)
    return float(match.group(1)) if match else -1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--model-name")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.requests, args.max_tokens = 1, 5, 4

    import httpx

    from bench.chaos_serving import Service
    from online_rl.config import load_settings
    from online_rl.ingest import new_key
    from online_rl.models import EMBEDDED_MODEL_ID, prepare_embedded_model

    if args.model is None:
        args.model = prepare_embedded_model(load_settings().model_dir).path
        args.model_name = EMBEDDED_MODEL_ID
    name = args.model_name or args.model.name
    key, digest = new_key()
    latencies: dict[str, list[float]] = {"confirm": [], "at_once": []}
    per_round: dict[str, list[float]] = {"confirm": [], "at_once": []}
    with (tempfile.TemporaryDirectory(prefix="orl-bench-log-") as tmp,
          kafka_broker(args.bootstrap) as bootstrap):
        root = Path(tmp)
        services = {}
        for side, wait in (("confirm", "2"), ("at_once", "0")):
            services[side] = Service("inference", {
                "ORL_CACHE_DIR": str(root / side), "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
                "ORL_BUS__TOPIC_PREFIX": f"log{side}{int(time.time())}", "ORL_MODEL__PATH": str(args.model),
                "ORL_MODEL__NAME": name, "ORL_INFERENCE__ENGINE": "transformers",
                "ORL_INFERENCE__API_KEYS": json.dumps([f"{digest} inference"]),
                "ORL_INFERENCE__LOG_CONFIRM_S": wait}, root / f"{side}.log")
        try:
            for service in services.values():
                service.start()
            with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"}) as client:

                def ask(side: str, i: int) -> float:
                    body = {"model": name, "max_tokens": args.max_tokens, "temperature": 0.0,
                            "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}
                    started = time.perf_counter()
                    response = client.post(services[side].url + "/v1/chat/completions", json=body)
                    response.raise_for_status()
                    return (time.perf_counter() - started) * 1000.0

                for side in services:  # warm-up (not measured)
                    ask(side, 0)
                for order in alternated(args.rounds, list(services)):
                    for side in order:
                        times = [ask(side, i) for i in range(args.requests)]
                        latencies[side] += times
                        per_round[side].append(statistics.median(times))
                    print(f"round: confirm p50 {per_round['confirm'][-1]:.1f} ms, at once "
                          f"{per_round['at_once'][-1]:.1f} ms", flush=True)
            time.sleep(2)  # the at-once side's last records
            # less the warm-up request
            logged = {side: _logged(service.url) - 1 for side, service in services.items()}
        finally:
            for service in services.values():
                service.stop()
    result: dict[str, Any] = {"rounds": args.rounds, "requests_per_side": args.rounds * args.requests,
                              "logged_confirm": logged["confirm"], "logged_at_once": logged["at_once"],
                              "confirm_p50_ms": round(statistics.median(per_round["confirm"]), 2),
                              "at_once_p50_ms": round(statistics.median(per_round["at_once"]), 2)}
    result["confirm_added_ms"] = round(statistics.median(
        c - a for c, a in zip(per_round["confirm"], per_round["at_once"], strict=True)), 2)
    put_spread(result, "confirm_vs_at_once",
               [c / a for c, a in zip(per_round["confirm"], per_round["at_once"], strict=True)])
    print(f"confirm vs at once: {result['confirm_vs_at_once']} ({result['confirm_added_ms']} ms added)",
          flush=True)
    emit(result)


if __name__ == "__main__":
    main()
