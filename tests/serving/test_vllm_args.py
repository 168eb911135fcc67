"""`inference.vllm_args`: more vLLM engine arguments, checked against what vLLM knows."""

from __future__ import annotations

from pathlib import Path

import pytest

from online_rl.config import InferenceConfig
from online_rl.errors import ConfigError
from online_rl.serving.vllm_engine import VllmEngine


def test_arguments_this_section_owns_are_refused_with_the_setting_to_use() -> None:
    with pytest.raises(ValueError, match=r"vllm_args\.max_model_len is set by inference\.max_model_len"):
        InferenceConfig(vllm_args={"max_model_len": 4096})


@pytest.mark.slow  # imports vLLM
def test_extra_arguments_reach_the_engine_and_unknown_ones_are_named(tmp_path: Path) -> None:
    extra = {"enforce_eager": True, "max_num_batched_tokens": 4096}
    args = VllmEngine(tmp_path, max_loras=3, extra_args=extra).engine_args()
    assert (args.enforce_eager, args.max_num_batched_tokens, args.max_loras) == (True, 4096, 3)
    with pytest.raises(ConfigError, match=r"inference\.vllm_args has gpu_memory_fraction"):
        VllmEngine(tmp_path, extra_args={"gpu_memory_fraction": 0.5}).engine_args()
