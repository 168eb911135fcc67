"""The transformers + PEFT engine on a real tiny Llama: answers, log-probabilities, adapters."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from online_rl.algos import completion_logprobs
from online_rl.serving import AdapterLoadError
from online_rl.serving.hf_engine import TransformersEngine
from tests.serving.conftest import complete

pytestmark = pytest.mark.anyio

PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [100, 200, 300, 400, 500, 600, 700]]


@pytest.fixture
async def engine(tiny_model: Path) -> AsyncIterator[TransformersEngine]:
    made = TransformersEngine(tiny_model, max_batch=8, max_model_len=64, max_loras=2)
    seen: list[Any] = []  # the engine's view of each request, to check what it did with them
    put = made._inbox.put

    def spy(item: Any) -> None:
        if item is not None and hasattr(item, "request"):
            seen.append(item)
        put(item)

    made._inbox.put = spy  # type: ignore[method-assign]
    made._inbox_seen = seen  # type: ignore[attr-defined]
    merges: list[int] = []
    merge = made._merge

    def counting(running: Any, new: Any) -> Any:
        if running is not None:
            merges.append(len(running.jobs))
        return merge(running, new)

    made._merge = counting  # type: ignore[method-assign]
    made._merges = merges  # type: ignore[attr-defined]
    yield made
    await made.close()


def reference(tiny_model: Path, adapter: Path | None) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False,  # type: ignore[operator]
                         min_new_tokens=steps, pad_token_id=0)
    return [int(t) for t in out[0, len(prompt):]]


async def test_batched_greedy_matches_transformers_generate_per_adapter(
    engine: TransformersEngine, tiny_model: Path, adapters: list[Path]
) -> None:
    await engine.load_adapter("a0", adapters[0])
    await engine.load_adapter("a1", adapters[1])
    # One batch mixes the base model and both adapters.
    jobs = [complete(engine, p, adapter, max_tokens=6)
            for p in PROMPTS for adapter in (None, "a0", "a1")]
    results = await asyncio.gather(*jobs)
    got = {(tuple(p), a): r[0] for (p, a), r in zip(
        [(p, a) for p in PROMPTS for a in (None, "a0", "a1")], results, strict=True)}
    for adapter, folder in ((None, None), ("a0", adapters[0]), ("a1", adapters[1])):
        model = reference(tiny_model, folder)
        for prompt in PROMPTS:
            expected = greedy(model, prompt, 6)
            served = got[(tuple(prompt), adapter)]
            assert served == expected[: len(served)], (adapter, prompt)
    assert got[(tuple(PROMPTS[0]), "a0")] != got[(tuple(PROMPTS[0]), None)]


async def test_logged_logprobs_match_a_teacher_forced_forward(
    engine: TransformersEngine, tiny_model: Path, adapters: list[Path]
) -> None:
    await engine.load_adapter("a0", adapters[0])
    model = reference(tiny_model, adapters[0])
    for temperature in (0.0, 0.9):
        ids, logprobs, _ = await complete(engine, PROMPTS[2], "a0", max_tokens=10, temperature=temperature,
                                          seed=3)
        with torch.no_grad():
            recomputed = completion_logprobs(model, PROMPTS[2], ids)
        assert torch.allclose(torch.tensor(logprobs), recomputed, atol=1e-4), (logprobs, recomputed)


async def test_seeded_sampling_repeats_and_finish_reasons(engine: TransformersEngine) -> None:
    first = await complete(engine, PROMPTS[0], max_tokens=12, temperature=1.0, seed=11)
    again = await complete(engine, PROMPTS[0], max_tokens=12, temperature=1.0, seed=11)
    other = await complete(engine, PROMPTS[0], max_tokens=12, temperature=1.0, seed=12)
    assert first[0] == again[0] and first[0] != other[0]
    assert first[2] in ("length", "stop") and len(first[0]) <= 12
    assert first[2] == "stop" or len(first[0]) == 12


async def test_a_failed_load_leaves_serving_unchanged(
    engine: TransformersEngine, adapters: list[Path], tmp_path: Path
) -> None:
    await engine.load_adapter("a0", adapters[0])
    before = await complete(engine, PROMPTS[1], "a0")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text("{not json")
    (broken / "adapter_model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterLoadError, match="cannot read the adapter"):
        await engine.load_adapter("bad", broken)
    dora = tmp_path / "dora"
    dora.mkdir()
    for item in adapters[1].iterdir():
        dora.joinpath(item.name).write_bytes(item.read_bytes())
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    with pytest.raises(AdapterLoadError, match=r"use_dora.*train a plain LoRA"):
        await engine.load_adapter("dora", dora)
    assert engine.adapters() == ["a0"]
    assert await complete(engine, PROMPTS[1], "a0") == before
    with pytest.raises(AdapterLoadError, match="already loaded"):
        await engine.load_adapter("a0", adapters[1])


async def test_unloading_every_adapter_returns_to_the_base_model(
    engine: TransformersEngine, adapters: list[Path]
) -> None:
    base = await complete(engine, PROMPTS[0])
    await engine.load_adapter("a0", adapters[0])
    await engine.load_adapter("a1", adapters[1])
    with pytest.raises(AdapterLoadError, match="most this engine holds"):
        await engine.load_adapter("a2", adapters[0])
    await engine.unload_adapter("a0")
    assert engine.adapters() == ["a1"]
    await engine.unload_adapter("a1")
    assert engine.adapters() == []
    assert await complete(engine, PROMPTS[0]) == base


async def test_a_cancelled_stream_stops_costing_compute(engine: TransformersEngine) -> None:
    from online_rl.events import SamplingParams
    from online_rl.serving import GenerationRequest

    stream = engine.generate(GenerationRequest("gone", PROMPTS[0], SamplingParams(temperature=0.0,
                                                                                  max_tokens=60)))
    await stream.__anext__()
    job = next(j for j in engine._inbox_seen if j.request.request_id == "gone")
    await stream.aclose()
    ids, _, reason = await complete(engine, PROMPTS[1], max_tokens=5)
    assert reason is not None and len(ids) <= 5
    assert job.done and job.generated < 20  # dropped from the batch, not decoded to 60 tokens


async def test_requests_joining_a_running_batch_get_the_same_tokens_as_alone(
    engine: TransformersEngine, adapters: list[Path]
) -> None:
    from online_rl.events import SamplingParams
    from online_rl.serving import GenerationRequest

    await engine.load_adapter("a0", adapters[0])
    alone = [await complete(engine, PROMPTS[0], max_tokens=20),
             await complete(engine, PROMPTS[2], "a0", max_tokens=6),
             await complete(engine, PROMPTS[1], max_tokens=9)]
    first = engine.generate(GenerationRequest("long", PROMPTS[0], SamplingParams(temperature=0.0,
                                                                                 max_tokens=20)))
    tokens, logprobs = [], []
    late: list[asyncio.Task[tuple[list[int], list[float], str | None]]] = []
    async for delta in first:  # others join (a longer prompt, an adapter) and leave mid-stream
        tokens += delta.token_ids
        logprobs += delta.logprobs
        if len(tokens) == 3:
            late.append(asyncio.create_task(complete(engine, PROMPTS[2], "a0", max_tokens=6, request_id="x")))
        if len(tokens) == 5:
            late.append(asyncio.create_task(complete(engine, PROMPTS[1], max_tokens=9, request_id="y")))
    joined = await asyncio.gather(*late)
    assert engine._merges, "the late requests never joined a running batch"  # type: ignore[attr-defined]
    assert tokens == alone[0][0]
    assert torch.allclose(torch.tensor(logprobs), torch.tensor(alone[0][1]), atol=1e-4)
    for got, expected in zip(joined, alone[1:], strict=True):
        assert got[0] == expected[0]
        assert torch.allclose(torch.tensor(got[1]), torch.tensor(expected[1]), atol=1e-4)


async def test_a_bfloat16_engine_serves_the_base_and_adapters(tiny_model: Path, adapters: list[Path]) -> None:
    """`inference.precision` resolving to bf16 (a CPU with fast bf16 units, a GPU): the base is held in
    bfloat16, adapters are installed in its dtype, and answers match a bfloat16 PEFT model's greedy ones."""
    made = TransformersEngine(tiny_model, max_batch=4, max_model_len=64, max_loras=2, dtype="bfloat16")
    try:
        assert next(made._model.parameters()).dtype == torch.bfloat16
        await made.load_adapter("a0", adapters[0])
        base_ids, base_logprobs, _ = await complete(made, PROMPTS[0], None, max_tokens=6)
        ids, logprobs, _ = await complete(made, PROMPTS[0], "a0", max_tokens=6)
        assert ids != base_ids  # the adapter (scaled up in the fixture) changes the answer
        assert all(torch.isfinite(torch.tensor(base_logprobs + logprobs)))
        peft = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.bfloat16), str(adapters[0]))
        assert ids == greedy(peft.eval(), PROMPTS[0], 6)
    finally:
        await made.close()
