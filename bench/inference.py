"""Inference benchmark: the service against its raw engine, vLLM against transformers, hot swaps.

    .venv/bin/python bench/inference.py [--prompts 16] [--max-tokens 48] [--seconds 30] [--skip-vllm]

On the embedded model (SmolLM2-135M-Instruct), in one run:
1. raw engines: the same greedy chat prompts, all at once, through the transformers engine, vLLM
   (AsyncLLM), and the transformers engine again (bracketing vLLM, as the machine drifts):
   completion tokens/s -> `vllm_vs_transformers` (vLLM over the transformers mean);
2. the service (`online-rl serve inference`, its own process, the engine `auto` picks here, the
   embedded bus logging every interaction): the same prompts through HTTP, alternating with the raw
   engine in this process (`--rounds`) -> `service_vs_engine` (best service over best raw tokens/s);
3. latency under a closed loop of clients on an adapter alias, first steady, then while the alias
   is swapped between two adapter versions (load + verify + alias move, then drain and unload the
   old one) -> `swap_s` (median time of a load-and-alias call) and `swap_p99_ratio` (p99 latency
   during swaps over steady p99).
The last line is one JSON object with these figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from bench.common import emit, start_cli_service
from online_rl.config import InferenceConfig, load_settings
from online_rl.events import SamplingParams
from online_rl.ingest import new_key
from online_rl.models import EMBEDDED_MODEL_ID, prepare_embedded_model
from online_rl.serving import Engine, GenerationRequest, build_engine, choose_engine
from tests.factories import lora_adapter

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain photosynthesis.",
             "List three prime numbers.", "What is 12 times 7?", "Tell me a short story about a cat.",
             "How do airplanes fly?", "Give me a recipe for pancakes."]


def messages(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}] for i in range(n)]


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


async def engines_side_by_side(model_dir: Path, config: InferenceConfig, prompts: list[list[int]],
                               max_tokens: int) -> dict[str, list[float]]:
    """transformers, then vLLM, then transformers again (the machine drifts: bracket vLLM)."""
    out: dict[str, list[float]] = {"transformers": [], "vllm": []}
    for name in ("transformers", "vllm", "transformers"):
        engine = build_engine(model_dir, config, name)
        await engine.start()
        out[name].append(await engine_tok_s(engine, prompts, max_tokens))
        await engine.close()
        print(f"  {name}: {out[name][-1]:.1f} tok/s", flush=True)
    return out


async def service_and_engine(model_dir: Path, config: InferenceConfig, prompts: list[list[int]],
                             chats: list[Any], url: str, key: str, max_tokens: int,
                             rounds: int) -> tuple[float, float]:
    """Best tokens/s of the raw engine and of the service over `rounds` alternating runs."""
    engine = build_engine(model_dir, config, choose_engine("auto"))
    await engine.start()
    raw, served = [], []
    for _ in range(rounds):
        raw.append(await engine_tok_s(engine, prompts, max_tokens))
        served.append(await service_throughput(url, key, chats, max_tokens))
        print(f"  raw engine {raw[-1]:.1f} tok/s, service {served[-1]:.1f} tok/s", flush=True)
    await engine.close()
    return max(raw), max(served)


def start_service(model_dir: Path, work: Path, digest: str, port: int) -> subprocess.Popen[bytes]:
    env = {"ORL_CACHE_DIR": str(work / "cache"), "ORL_MODEL__PATH": str(model_dir),
           "ORL_INFERENCE__API_KEYS": f'["{digest}"]', "ORL_BUS__EMBEDDED_PATH": str(work / "bus.db"),
           "ORL_KAFKA__BOOTSTRAP_SERVERS": ""}
    return start_cli_service(["serve", "inference", "--port", str(port)], env, f"http://127.0.0.1:{port}",
                             "inference service")


async def service_throughput(url: str, key: str, chats: list[Any], max_tokens: int) -> float:
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


async def closed_loop(url: str, key: str, seconds: float, concurrency: int,
                      swapper: Any = None) -> list[float]:
    """Latencies (s) of requests on the alias `policy` from `concurrency` clients for `seconds`."""
    headers = {"Authorization": f"Bearer {key}"}
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=600) as client:
        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < deadline:
                started = time.perf_counter()
                response = await client.post("/v1/chat/completions", json={
                    "model": "policy", "max_tokens": 8, "temperature": 0,
                    "messages": [{"role": "user", "content": f"{QUESTIONS[(w + i) % len(QUESTIONS)]}"}]})
                if response.status_code != 200:
                    raise SystemExit(f"a request failed: {response.status_code} {response.text}")
                latencies.append(time.perf_counter() - started)
                i += 1

        tasks = [worker(w) for w in range(concurrency)]
        if swapper is not None:
            tasks.append(swapper(client, deadline))
        await asyncio.gather(*tasks)
    return latencies


def make_swapper(folders: dict[str, Path], admin_headers: dict[str, str], swap_times: list[float]) -> Any:
    async def swapper(client: httpx.AsyncClient, deadline: float) -> None:
        current, other = "policy-v1", "policy-v2"
        while time.monotonic() < deadline - 2:
            await asyncio.sleep(1.0)
            started = time.perf_counter()
            loaded = await client.post("/admin/adapters", headers=admin_headers, json={
                "source": str(folders[other]), "name": other, "alias": "policy"})
            swap_times.append(time.perf_counter() - started)
            if loaded.status_code != 201:
                raise SystemExit(f"swap failed: {loaded.text}")
            gone = await client.delete(f"/admin/adapters/{current}", headers=admin_headers)
            if gone.status_code != 204:
                raise SystemExit(f"unload failed: {gone.text}")
            current, other = other, current
    return swapper


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 2 else max(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--seconds", type=float, default=30.0, help="Each latency phase.")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--port", type=int, default=18381)
    parser.add_argument("--rounds", type=int, default=3, help="Alternating service/engine runs.")
    parser.add_argument("--skip-vllm", action="store_true")
    args = parser.parse_args()

    settings = load_settings()
    model_dir = prepare_embedded_model(settings.model_dir).path
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    chats = messages(args.prompts)
    prompts = [list(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True)["input_ids"])
               for c in chats]
    config = InferenceConfig(max_batch=max(16, args.prompts))
    result: dict[str, Any] = {"model": EMBEDDED_MODEL_ID, "prompts": args.prompts,
                              "max_tokens": args.max_tokens, "auto_engine": choose_engine("auto")}

    if not args.skip_vllm:
        print("raw engines: transformers, vLLM, transformers ...", flush=True)
        side = asyncio.run(engines_side_by_side(model_dir, config, prompts, args.max_tokens))
        hf = statistics.mean(side["transformers"])
        result |= {"engine_tok_s_transformers": round(hf, 1), "engine_tok_s_vllm": round(side["vllm"][0], 1),
                   "vllm_vs_transformers": round(side["vllm"][0] / hf, 3)}

    key, digest = new_key()
    with tempfile.TemporaryDirectory(prefix="orl-bench-inference-") as tmp:
        work = Path(tmp)
        folders = {f"policy-v{i + 1}": lora_adapter(model_dir, work / f"adapter-{i}", EMBEDDED_MODEL_ID,
                                                    seed=i + 1, scale=0.5) for i in range(2)}
        url = f"http://127.0.0.1:{args.port}"
        print("service ...", flush=True)
        service = start_service(model_dir, work, digest, args.port)
        try:
            raw, served = asyncio.run(service_and_engine(model_dir, config, prompts, chats, url, key,
                                                         args.max_tokens, args.rounds))
            result |= {"service_tok_s": round(served, 1), "engine_tok_s": round(raw, 1),
                       "service_vs_engine": round(served / raw, 3)}
            print(f"  best of {args.rounds}: service {served:.1f} tok/s = {result['service_vs_engine']}x "
                  "the raw engine", flush=True)
            admin = {"Authorization": f"Bearer {key}"}
            first = httpx.post(url + "/admin/adapters", headers=admin, timeout=120,
                               json={"source": str(folders["policy-v1"]), "name": "policy-v1",
                                     "alias": "policy"})
            first.raise_for_status()
            steady = asyncio.run(closed_loop(url, key, args.seconds, args.concurrency))
            swaps: list[float] = []
            during = asyncio.run(closed_loop(url, key, args.seconds, args.concurrency,
                                             make_swapper(folders, admin, swaps)))
        finally:
            service.terminate()
            service.wait(60)
    result |= {
        "steady_requests": len(steady), "swap_requests": len(during), "swaps": len(swaps),
        "steady_p50_ms": round(statistics.median(steady) * 1000, 1),
        "steady_p99_ms": round(p99(steady) * 1000, 1),
        "swap_p50_ms": round(statistics.median(during) * 1000, 1),
        "swap_p99_ms": round(p99(during) * 1000, 1),
        "swap_s": round(statistics.median(swaps), 3) if swaps else None,
        "swap_p99_ratio": round(p99(during) / p99(steady), 3),
    }
    print(f"swap: {result['swap_s']} s per load+alias; p99 {result['swap_p99_ms']} ms during swaps vs "
          f"{result['steady_p99_ms']} ms steady ({result['swap_p99_ratio']}x)", flush=True)
    emit(result)


if __name__ == "__main__":
    main()
