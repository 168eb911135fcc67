"""The vLLM engine: `AsyncLLM` with LoRA enabled, several adapters resident and batched together.

vLLM schedules continuously (requests join and leave the running batch at every step) and keeps
LoRA adapters in slots addressed by an integer id; this module maps immutable version names to
those ids. The engine core runs in a spawned process, so it is started from a running event loop
(`start`, called by the service at start-up) and the process that builds it must be importable
(`if __name__ == "__main__":` in scripts).

Log-probabilities are vLLM's default `raw_logprobs`: the model's own distribution before
temperature and top-p, the same quantity the transformers engine reports. Text is produced by the
caller from the token ids, identically for both engines.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from online_rl.errors import ConfigError
from online_rl.models.check import cpu_only, vllm_cpu_kwargs
from online_rl.serving.engine import Engine, GenerationRequest, TokenDelta, check_room
from online_rl.serving.errors import AdapterLoadError, EngineError

__all__ = ["VllmEngine"]

logger = logging.getLogger(__name__)


class VllmEngine(Engine):
    """Streaming generation on vLLM's AsyncLLM with runtime LoRA adapters."""

    name = "vllm"

    def __init__(self, model_dir: Path, *, max_model_len: int = 2048, max_loras: int = 4,
                 max_lora_rank: int = 16, max_batch: int = 16, kv_cache_bytes: int = 1 << 30,
                 extra_args: dict[str, Any] | None = None, dtype: str | None = None) -> None:
        self._model_dir = Path(model_dir)
        self._dtype = dtype
        self._max_len = max_model_len
        self._max_loras = max_loras
        self._rank = max_lora_rank
        self._max_batch = max_batch
        self._kv_bytes = kv_cache_bytes
        self._extra = dict(extra_args or {})
        self._llm: Any = None
        self._ids: dict[str, int] = {}
        self._requests: dict[str, Any] = {}
        self._next_id = itertools.count(1)

    async def start(self) -> None:
        if self._llm is not None:
            return
        from vllm.v1.engine.async_llm import AsyncLLM

        self._llm = await asyncio.to_thread(AsyncLLM.from_engine_args, self.engine_args())

    def engine_args(self) -> Any:
        """vLLM's AsyncEngineArgs: this engine's settings, the CPU defaults, then `inference.vllm_args`
        (names vLLM does not know are refused with the setting named)."""
        import dataclasses

        from vllm import AsyncEngineArgs

        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(self._extra) - known)
        if unknown:
            raise ConfigError(f"inference.vllm_args has {', '.join(unknown)}, which vLLM's engine arguments "
                              "do not have; use AsyncEngineArgs names (e.g. gpu_memory_utilization)")
        extra: dict[str, Any] = {}
        if cpu_only():
            extra = vllm_cpu_kwargs() | {"kv_cache_memory_bytes": self._kv_bytes}
        return AsyncEngineArgs(
            model=str(self._model_dir), max_model_len=self._max_len, max_num_seqs=self._max_batch,
            enable_lora=True, max_loras=self._max_loras, max_cpu_loras=self._max_loras,
            max_lora_rank=_vllm_rank(self._rank), seed=0,  # type: ignore[arg-type]
            **(extra | ({"dtype": self._dtype} if self._dtype else {}) | self._extra),
        )

    @property
    def max_model_len(self) -> int:
        return self._max_len

    def adapters(self) -> list[str]:
        return list(self._ids)

    def _engine(self) -> Any:
        if self._llm is None:
            raise EngineError("the vLLM engine is not started (or was closed)")
        return self._llm

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        from vllm import SamplingParams
        from vllm.inputs import tokens_input
        from vllm.sampling_params import RequestOutputKind

        llm = self._engine()
        lora = None
        if request.adapter is not None:
            lora = self._requests.get(request.adapter)
            if lora is None:
                raise EngineError(f"adapter {request.adapter!r} is not loaded")
        sampling = request.sampling
        params = SamplingParams(
            temperature=sampling.temperature, top_p=sampling.top_p, max_tokens=sampling.max_tokens,
            seed=sampling.seed, logprobs=0, detokenize=False, output_kind=RequestOutputKind.DELTA,
        )
        finished = False
        try:
            async for output in llm.generate(tokens_input(request.prompt_token_ids), params,
                                             request.request_id, lora_request=lora):
                completion = output.outputs[0]
                token_ids = [int(t) for t in completion.token_ids]
                logprobs = [float(entry[t].logprob) for t, entry in zip(token_ids, completion.logprobs or [],
                                                                        strict=True)]
                reason = completion.finish_reason if output.finished else None
                finished = output.finished
                if reason == "abort":  # not a finished answer: never report it as one
                    raise EngineError("vLLM aborted the request (engine shutting down?); retry")
                if token_ids or reason is not None:
                    yield TokenDelta(token_ids, logprobs, reason)
        except EngineError:
            raise
        except Exception as exc:
            if type(exc).__name__ in ("CancelledError", "GeneratorExit"):
                raise
            raise EngineError(f"vLLM failed: {exc}") from exc
        finally:
            if not finished:
                await llm.abort(request.request_id)

    async def load_adapter(self, name: str, path: Path) -> None:
        from vllm.lora.request import LoRARequest

        llm = self._engine()
        check_room(name, list(self._ids), self._max_loras)
        lora_id = next(self._next_id)
        lora = LoRARequest(name, lora_id, str(path))
        try:
            added = await llm.add_lora(lora)
        except Exception as exc:
            raise AdapterLoadError(f"vLLM could not load the adapter in {path}: {exc}") from exc
        if not added:
            raise AdapterLoadError(f"vLLM refused the adapter in {path}")
        self._ids[name] = lora_id
        self._requests[name] = lora

    async def unload_adapter(self, name: str) -> None:
        llm = self._engine()
        lora_id = self._ids.get(name)
        if lora_id is None:
            raise AdapterLoadError(f"no adapter named {name!r} is loaded")
        await llm.remove_lora(lora_id)
        del self._ids[name], self._requests[name]

    async def close(self) -> None:
        if self._llm is not None:
            llm, self._llm = self._llm, None
            await asyncio.to_thread(llm.shutdown)


def _vllm_rank(rank: int) -> int:
    """vLLM takes max_lora_rank from a fixed list; round up to the next allowed value."""
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    return 512
