"""The cold-start anchors: neutral ones are the base model's own greedy answers, short ones the fixed
first sentences; neither overlaps the prompts users ask or the ability check."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from online_rl.config import Settings
from online_rl.demo.anchors import ANCHORS, NEUTRAL_PROMPTS, base_answers, write_cold_start
from online_rl.demo.report import ABILITY_PROMPTS
from online_rl.events import TrainingSample
from online_rl.simulate.prompts import TOPICS
from online_rl.simulate.runner import PROMPTS
from tests.conftest import TINY_NAME


def test_no_anchor_prompt_is_one_users_ask_or_the_ability_check_asks() -> None:
    asked = set(PROMPTS) | {text for texts in TOPICS.values() for text in texts}
    asked |= {prompt for prompt, _ in ABILITY_PROMPTS}
    anchors = set(NEUTRAL_PROMPTS) | {prompt for prompt, _ in ANCHORS}
    assert not anchors & asked
    assert len(set(NEUTRAL_PROMPTS)) == len(NEUTRAL_PROMPTS) >= 16


def test_neutral_anchors_are_the_base_models_own_greedy_answers(tmp_path: Path, tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    settings = Settings(cache_dir=tmp_path, model={"name": TINY_NAME, "path": tiny_model})  # type: ignore[arg-type]
    path = write_cold_start(settings, tmp_path / "anchors.jsonl", "neutral")
    samples = [TrainingSample.model_validate(json.loads(line)) for line in path.read_text().splitlines()]
    assert [s.prompt[0].content for s in samples] == list(NEUTRAL_PROMPTS)
    assert all(s.label is True and s.model == TINY_NAME and s.user_id == "cold-start" for s in samples)
    assert len({s.sample_id for s in samples}) == len(samples)

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    first = samples[0]
    assert first.completion is not None
    step = list(first.prompt_token_ids)
    for token in first.completion.token_ids[:8]:  # greedy: each answer token is the base model's argmax
        with torch.no_grad():
            assert int(model(torch.tensor([step])).logits[0, -1].argmax()) == token
        step.append(token)
    assert base_answers(settings, NEUTRAL_PROMPTS[:1], 4)[0][2] == first.completion.token_ids[:4]


def test_short_anchors_keep_their_fixed_answers(tmp_path: Path, tiny_model: Path) -> None:
    settings = Settings(cache_dir=tmp_path, model={"name": TINY_NAME, "path": tiny_model})  # type: ignore[arg-type]
    path = write_cold_start(settings, tmp_path / "short.jsonl", "short")
    samples = [TrainingSample.model_validate(json.loads(line)) for line in path.read_text().splitlines()]
    pairs = [(s.prompt[0].content, s.completion.text if s.completion else None) for s in samples]
    assert pairs == list(ANCHORS)
