"""The off-policy gate's estimate: self-normalised importance sampling on logged traffic."""

from __future__ import annotations

import math
import random

import pytest

from online_rl.rollout import snips


def test_the_same_policy_gets_the_logged_reward_and_every_sample_counts() -> None:
    out = snips([1.0, 0.0, 1.0, 1.0], [-3.0, -1.0, -2.0, -5.0], [-3.0, -1.0, -2.0, -5.0])
    assert out.value == pytest.approx(0.75) and out.logged_value == pytest.approx(0.75)
    assert out.effective_samples == pytest.approx(4.0) and out.samples == 4


def test_weights_by_hand_and_huge_log_ratios_stay_finite() -> None:
    out = snips([1.0, 0.0], [math.log(0.6), math.log(0.4)], [math.log(0.2), math.log(0.8)])
    weights = [3.0, 0.5]
    assert out.value == pytest.approx(3.0 / 3.5)
    assert out.effective_samples == pytest.approx(sum(weights) ** 2 / sum(w * w for w in weights))
    assert snips([1.0, 0.0], [900.0, 0.0], [0.0, 0.0]).value == pytest.approx(1.0)


def test_it_recovers_another_policy_s_reward_from_logged_choices() -> None:
    """Behaviour picks the good answer 30 % of the time, the target 80 %: the estimate is ~0.8."""
    rng = random.Random(0)
    rewards, target, behaviour = [], [], []
    for _ in range(5000):
        good = rng.random() < 0.3
        rewards.append(1.0 if good else 0.0)
        target.append(math.log(0.8 if good else 0.2))
        behaviour.append(math.log(0.3 if good else 0.7))
    out = snips(rewards, target, behaviour)
    assert out.logged_value == pytest.approx(0.3, abs=0.03)
    assert out.value == pytest.approx(0.8, abs=0.03)
    assert out.effective_samples < 5000


def test_mismatched_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="one reward, target and behaviour log-probability per"):
        snips([1.0], [0.0, 0.0], [0.0])
