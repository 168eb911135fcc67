"""Fixtures for the learning algorithms: the tiny Llama as a LoRA policy, and token-id data."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch


def load_policy(tiny_model: Path, random_adapter: bool = True, rank: int = 8, seed: int = 0) -> Any:
    """The tiny Llama with a LoRA adapter on q, k, v, o; `random_adapter` makes it differ from the base."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=not random_adapter, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


@pytest.fixture
def policy(tiny_model: Path) -> Any:
    return load_policy(tiny_model)


def random_ids(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(100, 5000) for _ in range(rng.randint(low, high))]


@pytest.fixture
def pairs() -> list[tuple[list[int], list[int], list[int]]]:
    """Preference pairs of varied lengths: (prompt, chosen, rejected) token ids."""
    rng = random.Random(7)
    return [(random_ids(rng, 2, 9), random_ids(rng, 1, 7), random_ids(rng, 1, 7)) for _ in range(6)]
