"""Serving test helpers: run one completion through an engine."""

from __future__ import annotations

from online_rl.events import SamplingParams
from online_rl.serving import Engine, GenerationRequest


async def complete(engine: Engine, prompt: list[int], adapter: str | None = None, max_tokens: int = 8,
                   temperature: float = 0.0, seed: int | None = None,
                   request_id: str = "r") -> tuple[list[int], list[float], str | None]:
    ids: list[int] = []
    logprobs: list[float] = []
    reason = None
    request = GenerationRequest(request_id, prompt, SamplingParams(temperature=temperature,
                                                                   max_tokens=max_tokens, seed=seed), adapter)
    async for delta in engine.generate(request):
        ids += delta.token_ids
        logprobs += delta.logprobs
        reason = delta.finish_reason
    return ids, logprobs, reason
