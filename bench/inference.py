"""Inference benchmark: vLLM against transformers, the service against its raw engine, latency
during hot swaps; every comparison alternated over rounds.

    deploy/local/env.sh .venv/bin/python bench/inference.py [--rounds 3] [--prompts 16] [--max-tokens 48]
        [--seconds 30] [--min-samples 100] [--concurrency 4] [--skip-vllm] [--smoke]

On the embedded model (SmolLM2-135M-Instruct). Each part runs `--rounds` rounds, its two sides in
alternated order (A B, B A, A B, ...); a figure is the median of the per-round figures, with their
[min, max] in `<name>_range` (a ratio's median and range are those of the per-round ratios).
1. raw engines: the transformers engine and vLLM (AsyncLLM), both started once in this process; in
   each round the same greedy chat prompts, all submitted at once (after one warm-up request), through
   each -> completion tokens/s `engine_tok_s_transformers`, `engine_tok_s_vllm`, `vllm_vs_transformers`.
2. the service (`online-rl serve inference`, its own process, the engine `auto` picks here, the
   embedded bus logging every interaction) over HTTP and the raw `auto` engine in this process, on
   the same prompts -> `service_tok_s`, `engine_tok_s`, `service_vs_engine`.
3. latency of `--concurrency` closed-loop clients (8 new tokens each) on the adapter alias `policy`:
   each round has a steady phase and a swap phase (steady, swap | swap, steady | ...). In a swap phase
   the alias is swapped between two adapter versions every `--swap-every` s (load + verify + alias
   move, then drain and unload the old version). A phase lasts `--seconds` and until it has
   `--min-samples` requests and, for swap phases, at least one swap (capped at ten times `--seconds`).
   Per phase: p50 and p95 latency (`steady_p50_ms`, `steady_p95_ms`, `swap_p50_ms`, `swap_p95_ms`);
   per round: `swap_p95_ratio` (p95 during swaps over steady p95) and `swap_s` (median time of a
   load-and-alias call). p95, not p99: a phase holds about 100 requests, which put 5 beyond p95 and
   only 1 beyond p99. `steady_samples`, `swap_samples`: requests over all rounds; `min_phase_samples`:
   the fewest in one phase; `swaps`: swaps over all rounds.

The service's API key has the scopes `inference` and `admin` (admin is never implied). The last line
is one JSON object with `FIELDS`. `--smoke`: 1 round, 2 prompts x 8 tokens, 2 clients, phases of 1 s
and at least 8 requests, and part 1 skipped as with `--skip-vllm` (starting vLLM on a CPU takes a
minute): its fields are then null and `vllm_skipped` is true; every other field is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.common import alternated, embedded_env, emit, percentile, put_spread, start_cli_service
from online_rl.config import InferenceConfig, load_settings
from online_rl.events import SamplingParams
from online_rl.ingest import new_key
from online_rl.models import EMBEDDED_MODEL_ID, prepare_embedded_model
from online_rl.serving import Engine, GenerationRequest, build_engine, choose_engine
from tests.factories import lora_adapter

FIELDS: tuple[str, ...] = (
    "model", "auto_engine", "prompts", "max_tokens", "rounds", "concurrency", "vllm_skipped",
    "engine_tok_s_transformers", "engine_tok_s_transformers_range", "engine_tok_s_vllm",
    "engine_tok_s_vllm_range", "vllm_vs_transformers", "vllm_vs_transformers_range",
    "engine_tok_s", "engine_tok_s_range", "service_tok_s", "service_tok_s_range",
    "service_vs_engine", "service_vs_engine_range",
    "steady_samples", "swap_samples", "min_phase_samples", "swaps", "swap_s", "swap_s_range",
    "steady_p50_ms", "steady_p50_ms_range", "steady_p95_ms", "steady_p95_ms_range",
    "swap_p50_ms", "swap_p50_ms_range", "swap_p95_ms", "swap_p95_ms_range",
    "swap_p95_ratio", "swap_p95_ratio_range",
)
VLLM_FIELDS = ("engine_tok_s_transformers", "engine_tok_s_vllm", "vllm_vs_transformers")
SMOKE = {"rounds": 1, "prompts": 2, "max_tokens": 8, "seconds": 1.0, "min_samples": 8, "concurrency": 2,
         "swap_every": 0.5, "skip_vllm": True}
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis.",
             "List three prime numbers.", "What is 12 times 7?", "Tell me a short story about a cat.",
             "How do airplanes fly?", "Give me a recipe for pancakes."]


def messages(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}] for i in range(n)]


def prompt_ids(model_dir: Path, chats: list[list[dict[str, str]]]) -> list[list[int]]:
    """The token ids of each chat with the model's chat template (generation prompt added)."""
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir))
    return [list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
                 ["input_ids"]) for chat in chats]


# 1 and 2: throughput ------------------------------------------------------------------------------

async def engine_tok_s(engine: Engine, prompts: list[list[int]], max_tokens: int) -> float:
    """Completion tokens/s of `prompts`, all submitted at once, greedy (after a warm-up request)."""

    async def one(i: int, ids: list[int]) -> int:
        count = 0
        request = GenerationRequest(f"b{i}-{time.monotonic_ns()}", ids,
                                    SamplingParams(temperature=0.0, max_tokens=max_tokens))
        async for delta in engine.generate(request):
            count += len(delta.token_ids)
        return count

    await one(-1, prompts[0])
    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, ids) for i, ids in enumerate(prompts)))
    return sum(counts) / (time.perf_counter() - start)


async def engines_alternated(model_dir: Path, config: InferenceConfig, prompts: list[list[int]],
                             max_tokens: int, rounds: int) -> dict[str, list[float]]:
    """Tokens/s per round of transformers and vLLM, both started once, in alternated order."""
    sides = ["transformers", "vllm"]
    engines: dict[str, Engine] = {}
    tok_s: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for name in sides:
            began = time.perf_counter()
            engine = build_engine(model_dir, config, name)
            await engine.start()
            engines[name] = engine
            print(f"  {name} started in {time.perf_counter() - began:.0f} s", flush=True)
        for order in alternated(rounds, sides):
            for name in order:
                tok_s[name].append(await engine_tok_s(engines[name], prompts, max_tokens))
            print("  " + ", ".join(f"{name} {tok_s[name][-1]:.1f} tok/s" for name in order), flush=True)
    finally:
        for engine in engines.values():
            await engine.close()
    return tok_s


async def service_tok_s(url: str, key: str, chats: list[Any], max_tokens: int) -> float:
    """Completion tokens/s of `chats` through the service, all at once (after a warm-up request)."""
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        async def one(chat: Any) -> int:
            response = await client.post("/v1/chat/completions", json={
                "model": EMBEDDED_MODEL_ID, "messages": chat, "max_tokens": max_tokens, "temperature": 0})
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        await one(chats[0])
        start = time.perf_counter()
        counts = await asyncio.gather(*(one(chat) for chat in chats))
        return sum(counts) / (time.perf_counter() - start)


async def service_and_engine(model_dir: Path, config: InferenceConfig, prompts: list[list[int]],
                             chats: list[Any], url: str, key: str, max_tokens: int,
                             rounds: int) -> dict[str, list[float]]:
    """Tokens/s per round of the raw `auto` engine and of the service, in alternated order."""
    engine = build_engine(model_dir, config, choose_engine("auto"))
    await engine.start()
    tok_s: dict[str, list[float]] = {"engine": [], "service": []}
    try:
        for order in alternated(rounds, list(tok_s)):
            for side in order:
                tok_s[side].append(await engine_tok_s(engine, prompts, max_tokens) if side == "engine"
                                   else await service_tok_s(url, key, chats, max_tokens))
            print("  " + ", ".join(f"{side} {tok_s[side][-1]:.1f} tok/s" for side in order), flush=True)
    finally:
        await engine.close()
    return tok_s


# 3: latency during hot swaps ----------------------------------------------------------------------

@dataclass
class Phase:
    """What one latency phase measured."""

    latencies: list[float] = field(default_factory=list)
    swap_times: list[float] = field(default_factory=list)


class Swapper:
    """Swaps the alias `policy` between two adapter versions, the other one unloaded in between."""

    def __init__(self, folders: dict[str, Path], headers: dict[str, str]) -> None:
        self.folders, self.headers = folders, headers
        self.current, self.other = "policy-v1", "policy-v2"

    async def swap(self, client: httpx.AsyncClient) -> float:
        """Load the other version with the alias, unload the previous one; the load call's time."""
        started = time.perf_counter()
        loaded = await client.post("/admin/adapters", headers=self.headers, json={
            "source": str(self.folders[self.other]), "name": self.other, "alias": "policy"})
        took = time.perf_counter() - started
        if loaded.status_code != 201:
            raise SystemExit(f"swap failed: {loaded.status_code} {loaded.text}")
        gone = await client.delete(f"/admin/adapters/{self.current}", headers=self.headers)
        if gone.status_code != 204:
            raise SystemExit(f"unload failed: {gone.status_code} {gone.text}")
        self.current, self.other = self.other, self.current
        return took


@dataclass(frozen=True)
class LoadShape:
    """How long a latency phase runs and with how many clients."""

    concurrency: int
    seconds: float
    min_samples: int
    swap_every: float


async def latency_phase(url: str, key: str, shape: LoadShape, swapper: Swapper | None) -> Phase:
    """Closed-loop requests on the alias `policy` (and swaps, with a swapper) until the phase is done:
    `shape.seconds` passed, `shape.min_samples` answered and, with a swapper, one swap made."""
    phase, stop = Phase(), asyncio.Event()
    began = time.monotonic()

    def done() -> bool:
        elapsed = time.monotonic() - began
        enough = len(phase.latencies) >= shape.min_samples and (swapper is None or bool(phase.swap_times))
        return elapsed >= 10 * shape.seconds or (elapsed >= shape.seconds and enough)

    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=600) as client:
        async def worker(w: int) -> None:
            i = 0
            while not stop.is_set():
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json={
                    "model": "policy", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": QUESTIONS[(w + i) % len(QUESTIONS)]}]})
                if response.status_code != 200:
                    raise SystemExit(f"a request failed: {response.status_code} {response.text}")
                phase.latencies.append(time.perf_counter() - started)
                i += 1

        async def swaps(swapper: Swapper) -> None:
            while not stop.is_set():
                try:
                    await asyncio.wait_for(stop.wait(), shape.swap_every)
                except TimeoutError:
                    phase.swap_times.append(await swapper.swap(client))

        async def referee() -> None:
            while not done():
                await asyncio.sleep(0.05)
            stop.set()

        tasks = [referee(), *(worker(w) for w in range(shape.concurrency))]
        await asyncio.gather(*tasks, *([swaps(swapper)] if swapper else []))
    return phase


async def latency_rounds(url: str, key: str, shape: LoadShape, swapper: Swapper,
                         rounds: int) -> dict[str, list[Phase]]:
    """Steady and swap phases, in alternated order over the rounds."""
    phases: dict[str, list[Phase]] = {"steady": [], "swap": []}
    for order in alternated(rounds, list(phases)):
        for side in order:
            phase = await latency_phase(url, key, shape, swapper if side == "swap" else None)
            phases[side].append(phase)
            p95_ms = percentile(phase.latencies, 95) * 1000
            print(f"  {side}: {len(phase.latencies)} requests, p95 {p95_ms:.0f} ms, "
                  f"{len(phase.swap_times)} swaps", flush=True)
            if len(phase.latencies) < shape.min_samples:
                print(f"  warning: only {len(phase.latencies)} requests in this phase (wanted "
                      f"{shape.min_samples}): its p95 rests on few requests", flush=True)
    return phases


def latency_figures(phases: dict[str, list[Phase]]) -> dict[str, Any]:
    """Per-phase percentiles and per-round ratios, as medians over rounds with ranges."""
    result: dict[str, Any] = {}
    for side, runs in phases.items():
        result[f"{side}_samples"] = sum(len(p.latencies) for p in runs)
        for q in (50, 95):
            put_spread(result, f"{side}_p{q}_ms", [percentile(p.latencies, q) * 1000 for p in runs], 1)
    ratios = [percentile(swap.latencies, 95) / percentile(steady.latencies, 95)
              for steady, swap in zip(phases["steady"], phases["swap"], strict=True)]
    put_spread(result, "swap_p95_ratio", ratios)
    swap_medians = [statistics.median(p.swap_times) for p in phases["swap"] if p.swap_times]
    if swap_medians:
        put_spread(result, "swap_s", swap_medians)
    else:  # only where every swap phase hit its time cap before its first swap
        result["swap_s"], result["swap_s_range"] = None, None
    result["swaps"] = sum(len(p.swap_times) for p in phases["swap"])
    result["min_phase_samples"] = min(len(p.latencies) for runs in phases.values() for p in runs)
    return result


# the run ------------------------------------------------------------------------------------------

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Alternated rounds of each part.")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30.0, help="Shortest latency phase.")
    parser.add_argument("--min-samples", type=int, default=100, help="Fewest requests in a latency phase.")
    parser.add_argument("--concurrency", type=int, default=4, help="Closed-loop clients.")
    parser.add_argument("--swap-every", type=float, default=1.0, help="Seconds between swaps.")
    parser.add_argument("--port", type=int, default=18381)
    parser.add_argument("--skip-vllm", action="store_true", help="Skip part 1 (its fields are null).")
    parser.add_argument("--smoke", action="store_true", help="Tiny sizes that still print every field.")
    args = parser.parse_args()
    if args.smoke:
        vars(args).update(SMOKE)
    if args.rounds < 1 or args.prompts < 1 or args.seconds <= 0 or args.min_samples < 1:
        parser.error("--rounds, --prompts and --min-samples must be at least 1, --seconds positive")
    return args


def throughput_figures(args: argparse.Namespace, model_dir: Path, config: InferenceConfig,
                       prompts: list[list[int]]) -> dict[str, Any]:
    """Part 1 (or nulls where it is skipped)."""
    result: dict[str, Any] = {"vllm_skipped": args.skip_vllm}
    if args.skip_vllm:
        return result | {f"{name}{tail}": None for name in VLLM_FIELDS for tail in ("", "_range")}
    print("raw engines: transformers and vLLM ...", flush=True)
    tok_s = asyncio.run(engines_alternated(model_dir, config, prompts, args.max_tokens, args.rounds))
    put_spread(result, "engine_tok_s_transformers", tok_s["transformers"], 1)
    put_spread(result, "engine_tok_s_vllm", tok_s["vllm"], 1)
    put_spread(result, "vllm_vs_transformers",
               [v / t for v, t in zip(tok_s["vllm"], tok_s["transformers"], strict=True)])
    return result


def service_figures(args: argparse.Namespace, model_dir: Path, config: InferenceConfig,
                    prompts: list[list[int]], chats: list[Any]) -> dict[str, Any]:
    """Parts 2 and 3, on one service started for them."""
    key, digest = new_key()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="orl-bench-inference-") as tmp:
        work = Path(tmp)
        folders = {f"policy-v{i + 1}": lora_adapter(model_dir, work / f"adapter-{i}", EMBEDDED_MODEL_ID,
                                                    seed=i + 1, scale=0.5) for i in range(2)}
        url = f"http://127.0.0.1:{args.port}"
        env = embedded_env(work, model_dir) | {"ORL_INFERENCE__API_KEYS": f'["{digest} inference,admin"]'}
        print("service ...", flush=True)
        service = start_cli_service(["serve", "inference", "--port", str(args.port)], env, url,
                                    "inference service")
        try:
            tok_s = asyncio.run(service_and_engine(model_dir, config, prompts, chats, url, key,
                                                   args.max_tokens, args.rounds))
            put_spread(result, "engine_tok_s", tok_s["engine"], 1)
            put_spread(result, "service_tok_s", tok_s["service"], 1)
            put_spread(result, "service_vs_engine",
                       [s / e for s, e in zip(tok_s["service"], tok_s["engine"], strict=True)])
            admin = {"Authorization": f"Bearer {key}"}
            first = httpx.post(url + "/admin/adapters", headers=admin, timeout=120,
                               json={"source": str(folders["policy-v1"]), "name": "policy-v1",
                                     "alias": "policy"})
            if first.status_code != 201:
                raise SystemExit(f"loading the first adapter failed: {first.status_code} {first.text}")
            print("latency: steady and swap phases ...", flush=True)
            shape = LoadShape(args.concurrency, args.seconds, args.min_samples, args.swap_every)
            phases = asyncio.run(latency_rounds(url, key, shape, Swapper(folders, admin), args.rounds))
        finally:
            service.terminate()
            service.wait(60)
    return result | latency_figures(phases)


def main() -> None:
    args = parse_args()
    settings = load_settings()
    model_dir = prepare_embedded_model(settings.model_dir).path
    chats = messages(args.prompts)
    prompts = prompt_ids(model_dir, chats)
    config = InferenceConfig(max_batch=max(16, args.prompts))
    result: dict[str, Any] = {"model": EMBEDDED_MODEL_ID, "prompts": args.prompts,
                              "max_tokens": args.max_tokens, "rounds": args.rounds,
                              "concurrency": args.concurrency,
                              "auto_engine": choose_engine("auto")}
    result |= throughput_figures(args, model_dir, config, prompts)
    result |= service_figures(args, model_dir, config, prompts, chats)
    print(f"median of {args.rounds}: vLLM/transformers {result['vllm_vs_transformers']}, service/engine "
          f"{result['service_vs_engine']} {result['service_vs_engine_range']}; swap {result['swap_s']} s "
          f"per load+alias, p95 during swaps / steady {result['swap_p95_ratio']} "
          f"{result['swap_p95_ratio_range']}", flush=True)
    emit(result)


if __name__ == "__main__":
    main()
