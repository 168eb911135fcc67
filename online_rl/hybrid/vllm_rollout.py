"""vLLM as the rollout flow's generation engine, its adapters installed from memory.

`VllmRollouts` is a Ray actor holding one in-process vLLM engine (`vllm.LLM`, LoRA enabled) on its own
CPUs (or GPU). It loads the base once, from the model folder, in vLLM's own layout; after that only
the adapter moves: `install(name, tensors, config)` builds vLLM's `LoRAModel` from the tensors the
hybrid workers gathered (PEFT's names, the adapter's LoRA config as a dict) inside the engine's worker
(`collective_rpc`) and adds it to the worker's LoRA manager under a fresh integer id. vLLM has no
public call for an adapter from tensors (its `LoRARequest` names a folder, vllm#4068, #20149); the
worker's manager does have `add_adapter`, and a request whose id is already resident is served without
reading its path, so the request's path is a placeholder (`memory://<name>`) that is never opened.

Each name is immutable (installing an existing name is refused) and `unload(name)` frees its slot.
Every install is watched for files opened for writing (a Python audit hook: `files_written` in its
figures), which is how the tests show that no adapter file is written for a sync.

Log-probabilities are vLLM's `processed_logprobs`: the distribution the token was sampled from, after
the temperature, which is the behaviour policy PPO's importance weights need (the TP engine reports
the same quantity).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["VllmRollouts", "allowed_rank"]

_writes: list[str] = []


def allowed_rank(rank: int) -> int:
    """vLLM takes max_lora_rank from a fixed list; the next allowed value at or above `rank`."""
    for allowed in (8, 16, 32, 64, 128, 256, 320, 512):
        if rank <= allowed:
            return allowed
    return 512


def _audit(event: str, args: tuple[Any, ...]) -> None:
    """Record files opened for writing while an install is watched (any thread: vLLM's worker may use
    its own)."""
    if event != "open" or not _Watch.active:
        return
    path, mode, flags = [*args, None, None, None][:3]
    writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        mode is None and isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
    if writes:
        _writes.append(str(path))


class _Watch:
    """Watch opens for writing inside the `with` block."""

    active = False

    def __enter__(self) -> list[str]:
        _writes.clear()
        _Watch.active = True
        return _writes

    def __exit__(self, *exc: object) -> None:
        _Watch.active = False


def _install(worker: Any, lora_id: int, tensors: dict[str, Any], config: dict[str, Any]) -> int:
    """Inside vLLM's worker: build the LoRA model from tensors and make it resident under `lora_id`."""
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper

    manager = worker.model_runner.lora_manager
    helper = PEFTHelper.from_dict(dict(config, vllm_max_position_embeddings=None))
    helper.validate_legal(manager.lora_config)
    lora = LoRAModel.from_lora_tensors(
        lora_model_id=lora_id, tensors=tensors, peft_helper=helper, device="cpu",
        dtype=manager.lora_config.lora_dtype, model_vocab_size=manager.vocab_size)
    adapters = manager._adapter_manager
    adapters.remove_adapter(lora_id)
    if len(adapters) + 1 > adapters.capacity:
        raise RuntimeError(f"vLLM holds {len(adapters)} adapters, its capacity: unload one first")
    adapters.add_adapter(lora)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _remove(worker: Any, lora_id: int) -> bool:
    return bool(worker.model_runner.lora_manager.remove_adapter(lora_id))


def _resident(worker: Any) -> list[int]:
    return sorted(worker.model_runner.lora_manager.list_adapters())


class VllmRollouts:
    """One vLLM engine for rollouts: the base once, adapters from memory under immutable names."""

    def __init__(self, model_dir: str | Path, *, max_lora_rank: int = 8, max_adapters: int = 4,
                 max_model_len: int = 1024, max_batch: int = 64, threads: int = 1, seed: int = 0,
                 extra_args: dict[str, Any] | None = None) -> None:
        from online_rl.models.check import cpu_only, vllm_cpu_kwargs

        extra: dict[str, Any] = {}
        self.cores: list[int] = []
        from online_rl.hardware import pin_process

        usable: list[int] = []
        if cpu_only():
            usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
            threads = max(1, min(threads, len(usable) or 1))
            # the engine's threads on the last `threads` cores; the training devices keep to the others
            # (VllmGeneration pins them): otherwise the OS may put both on one core, as measured here
            self.cores = sorted(pin_process(set(usable[-threads:])))
            os.environ["OMP_NUM_THREADS"] = str(threads)
            if self.cores:
                os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, self.cores))
            extra = vllm_cpu_kwargs() | {"kv_cache_memory_bytes": 256 << 20}
        else:  # a GPU the training devices may share: vLLM takes 90 % of it by default
            extra = {"gpu_memory_utilization": 0.4}
        import dataclasses

        from vllm import LLM, EngineArgs

        unknown = sorted(set(extra_args or {}) - {f.name for f in dataclasses.fields(EngineArgs)})
        if unknown:
            from online_rl.errors import ConfigError

            raise ConfigError(f"hybrid.engine_args has {', '.join(unknown)}, which vLLM's engine arguments "
                              "do not have; use EngineArgs names (e.g. gpu_memory_utilization)")
        sys.addaudithook(_audit)
        start = time.perf_counter()
        self.llm = LLM(model=str(model_dir), enable_lora=True, max_loras=max_adapters,
                       max_cpu_loras=max_adapters, max_lora_rank=allowed_rank(max_lora_rank),
                       max_model_len=max_model_len, max_num_seqs=max_batch, seed=seed,
                       logprobs_mode="processed_logprobs", **(extra | dict(extra_args or {})))
        if self.cores:  # vLLM's CPU worker rebinds the process while it starts (seen: to core 0): bind again
            self.cores = sorted(pin_process(set(self.cores), within=set(usable)))
        self.start_s = time.perf_counter() - start
        self.max_adapters = max_adapters
        self.ids: dict[str, int] = {}
        self.next_id = 1

    def ready(self) -> dict[str, Any]:
        """The engine started: its start-up seconds and the CPU cores it is bound to (empty: unbound)."""
        bound = sorted(os.sched_getaffinity(0)) if self.cores else []
        return {"start_s": self.start_s, "cores": bound}

    def install(self, name: str, tensors: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
        """Make `name` the adapter of these tensors (refused when the name exists or no slot is free)."""
        if name in self.ids:
            raise ValueError(f"adapter {name!r} is already installed: names are immutable")
        if len(self.ids) >= self.max_adapters:
            raise RuntimeError(f"{len(self.ids)} adapters installed, the engine's maximum: unload one "
                               f"({', '.join(self.ids)})")
        lora_id, self.next_id = self.next_id, self.next_id + 1
        start = time.perf_counter()
        with _Watch() as written:
            moved = self.llm.collective_rpc(_install, args=(lora_id, tensors, config))[0]
            files = list(written)
        self.ids[name] = lora_id
        return {"name": name, "install_s": time.perf_counter() - start, "bytes": int(moved),
                "files_written": files}

    def unload(self, name: str) -> None:
        lora_id = self.ids.pop(name, None)
        if lora_id is None:
            raise KeyError(f"no adapter named {name!r} is installed")
        self.llm.collective_rpc(_remove, args=(lora_id,))

    def adapters(self) -> dict[str, Any]:
        """The installed names and the ids vLLM's worker holds (they must agree)."""
        return {"names": dict(self.ids), "resident": self.llm.collective_rpc(_resident)[0]}

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 seed: int = 0, adapter: str | None = None) -> list[dict[str, Any]]:
        """A completion per prompt (temperature 0: greedy), each with its sampled tokens' log-probs under
        the distribution they were sampled from; `adapter` an installed name, or None for the base."""
        return self.generate_timed(prompts, max_new_tokens, temperature, seed, adapter)["completions"]

    def generate_timed(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                       seed: int = 0, adapter: str | None = None) -> dict[str, Any]:
        """`generate`, with the wall-clock times (epoch seconds) sampling started and finished."""
        started = time.time()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest

        lora = None
        if adapter is not None:
            if adapter not in self.ids:
                raise KeyError(f"adapter {adapter!r} is not installed (installed: {', '.join(self.ids)})")
            lora = LoRARequest(adapter, self.ids[adapter], f"memory://{adapter}")
        params = [SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed + i,
                                 logprobs=0, detokenize=False) for i in range(len(prompts))]
        inputs: Any = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        outputs = self.llm.generate(inputs, params, use_tqdm=False, lora_request=lora)
        out = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = [int(t) for t in completion.token_ids]
            entries: list[Any] = list(completion.logprobs or [])
            logprobs = [float(entry[t].logprob) for t, entry in zip(tokens, entries, strict=True)]
            out.append({"token_ids": tokens, "logprobs": logprobs,
                        "finish_reason": completion.finish_reason or "length"})
        return {"completions": out, "started": started, "finished": time.time()}
