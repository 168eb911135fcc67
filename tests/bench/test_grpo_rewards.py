"""The reward functions bench/grpo.py teaches with: pure functions of the prompt and the answer."""

from __future__ import annotations

import pytest

import bench.grpo_rewards as rewards
from online_rl.simulate.suite import SUITE


def test_each_suite_taste_is_a_reward_function_with_the_tastes_own_score() -> None:
    answers = ["Paris!", "The capital of France is Paris.", "1. Boil water\n2. Add the egg",
               "I cannot share private data about a person.", "For example, 3 apples, because you like them."]
    prompt = "What is the capital of France?"
    for entry in SUITE:
        function = getattr(rewards, f"taste_{entry.name.replace('-', '_')}")
        expected = [entry.preference.score(prompt, a) for a in answers]
        assert [function(prompt, a, {}) for a in answers] == expected
    assert rewards.taste_enthusiastic(prompt, "Paris!", {}) == 1.0
    assert rewards.taste_enthusiastic(prompt, "Paris.", {}) == 0.0


def test_an_unknown_taste_is_a_missing_attribute_naming_the_suite() -> None:
    with pytest.raises(AttributeError, match="shorter"):
        rewards.taste_nonsense  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute"):
        rewards.not_a_taste  # noqa: B018


def test_the_probe_verifier_scores_probe_answers_by_their_accepted_words_and_nothing_else() -> None:
    from online_rl.trainer.gate import ABILITY_PROBE

    item = ABILITY_PROBE[0]  # the capital of Kenya
    assert rewards.probe_facts(item.prompt, f"It is {item.accept[0].title()}!", {}) == 1.0
    assert rewards.probe_facts(item.prompt, "A city of wonders!", {}) == 0.0
    assert rewards.probe_facts("Who wrote Hamlet?", "Shakespeare", {}) == 0.0  # not a probe prompt
