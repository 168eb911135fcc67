"""GRPO, RLOO and REINFORCE++ as pure functions: groups of any size in any order, dropped groups, bad
settings. (Equality with TRL on sampled batches: test_critic_free_vs_trl.py.)"""

from __future__ import annotations

import pytest
import torch

from online_rl.algos import (
    CriticFreeConfig,
    critic_free_advantages,
    critic_free_loss,
    grpo_advantages,
    rloo_advantages,
    zero_variance_groups,
)
from online_rl.errors import ConfigError


def test_groups_may_be_uneven_and_interleaved() -> None:
    rewards = torch.tensor([1.0, 5.0, 3.0, 0.0, 7.0])
    groups = torch.tensor([9, 4, 9, 4, 4])  # group 9: rows 0, 2; group 4: rows 1, 3, 4
    advantages = grpo_advantages(rewards, groups, scale="none")
    assert advantages.tolist() == pytest.approx([-1.0, 1.0, 1.0, -4.0, 3.0])
    scaled = grpo_advantages(rewards, groups, scale="group", eps=0.0)
    std9, std4 = torch.tensor([1.0, 3.0]).std(), torch.tensor([5.0, 0.0, 7.0]).std()
    expected = [-1 / std9, 1 / std4, 1 / std9, -4 / std4, 3 / std4]
    assert scaled.tolist() == pytest.approx([float(v) for v in expected], rel=1e-6)
    # RLOO: the mean of the other answers of the group
    assert rloo_advantages(rewards, groups).tolist() == pytest.approx([-2.0, 1.5, 2.0, -6.0, 4.5])


def test_an_answer_alone_in_its_group_has_no_advantage() -> None:
    rewards, groups = torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1])
    assert rloo_advantages(rewards, groups)[0] == 0
    assert grpo_advantages(rewards, groups)[0] == 0


def test_zero_variance_groups_are_dropped_from_the_loss() -> None:
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    assert zero_variance_groups(rewards, groups).tolist() == [True, True, False, False]
    config = CriticFreeConfig(group_size=2)
    batch = critic_free_advantages(config, rewards, groups)
    assert batch.keep.tolist() == [False, False, True, True] and batch.zero_variance_fraction == 0.5

    logprobs = torch.randn(4, 3, requires_grad=True)
    mask = torch.ones(4, 3)
    loss = critic_free_loss(logprobs, logprobs.detach(), batch.advantages, mask, config, keep=batch.keep)
    (grad,) = torch.autograd.grad(loss.loss, logprobs)
    assert grad[:2].abs().sum() == 0 and grad[2:].abs().sum() > 0
    # with every group kept, the dropped rows' zero advantages would still dilute the token mean
    kept_all = critic_free_loss(logprobs, logprobs.detach(), batch.advantages, mask, config)
    assert kept_all.loss.item() == pytest.approx(loss.loss.item() / 2)


def test_clip_higher_lets_good_tokens_rise_further() -> None:
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), 0.25, requires_grad=True)  # ratio e^0.25 = 1.28
    mask, advantage = torch.ones(1, 1), torch.ones(1)
    symmetric = critic_free_loss(new, old, advantage, mask, CriticFreeConfig(clip_high=0.2))
    higher = critic_free_loss(new, old, advantage, mask, CriticFreeConfig(clip_high=0.3))
    assert float(symmetric.clip_fraction) == 1.0 and float(higher.clip_fraction) == 0.0
    assert torch.autograd.grad(higher.loss, new)[0].item() < 0  # still pushed up


def test_reinforce_pp_needs_the_token_logprobs() -> None:
    with pytest.raises(ValueError, match="logprobs"):
        critic_free_advantages(CriticFreeConfig(estimator="reinforce++"), torch.ones(2), torch.zeros(2))


@pytest.mark.parametrize(("options", "field"), [
    ({"estimator": "ppo"}, "estimator"),
    ({"estimator": "grpo", "group_size": 1}, "group_size"),
    ({"loss_aggregation": "sum"}, "loss_aggregation"),
    ({"clip_high": 0.0}, "clip_high"),
    ({"ratio_level": "answer"}, "ratio_level"),
])
def test_bad_settings_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError, match=f"critic_free.{field}"):
        CriticFreeConfig(**options)  # type: ignore[arg-type]
