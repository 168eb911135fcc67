"""PPO's pieces against hand-computed cases and a plain loop implementation."""

from __future__ import annotations

import math
import random

import pytest
import torch

from online_rl.algos import (
    AdaptiveKLController,
    KLControlConfig,
    PPOConfig,
    aggregate,
    entropy_from_logits,
    gae,
    kl_penalty,
    policy_loss,
    ppo_advantages,
    token_rewards,
    value_loss,
)


def test_gae_by_hand() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    # gamma = lambda = 1: the advantage is the return (1) minus the value
    assert torch.allclose(advantages, torch.tensor([[0.5, 0.4, 0.3]]))
    assert torch.allclose(returns, torch.ones(1, 3))
    advantages, returns = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # delta2 = 1 - .7 = .3; delta1 = .9*.7 - .6 = .03; delta0 = .9*.6 - .5 = .04
    # A2 = .3; A1 = .03 + .45*.3 = .165; A0 = .04 + .45*.165 = .11425
    assert torch.allclose(advantages, torch.tensor([[0.11425, 0.165, 0.3]]))
    assert torch.allclose(returns, torch.tensor([[0.61425, 0.765, 1.0]]))


def _loop_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """The textbook recursion, one sequence at a time."""
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages


def test_gae_matches_a_loop_on_ragged_batches() -> None:
    rng = random.Random(0)
    lengths = [1, 4, 7, 3, 7]
    width = max(lengths)
    rewards = torch.zeros(len(lengths), width)
    values = torch.zeros(len(lengths), width)
    mask = torch.zeros(len(lengths), width)
    for row, n in enumerate(lengths):
        rewards[row, :n] = torch.tensor([rng.uniform(-1, 1) for _ in range(n)])
        values[row, :n] = torch.tensor([rng.uniform(-1, 1) for _ in range(n)])
        mask[row, :n] = 1
        # garbage on padding must not leak into the result
        rewards[row, n:] = 5.0
        values[row, n:] = -3.0
    advantages, returns = gae(rewards, values, mask, gamma=0.97, lam=0.9)
    for row, n in enumerate(lengths):
        expected = _loop_gae(rewards[row, :n].tolist(), values[row, :n].tolist(), 0.97, 0.9)
        assert advantages[row, :n].tolist() == pytest.approx(expected, abs=1e-6)
        assert returns[row, :n].tolist() == pytest.approx(
            [a + v for a, v in zip(expected, values[row, :n].tolist(), strict=True)], abs=1e-6)
        assert advantages[row, n:].abs().sum() == 0 and returns[row, n:].abs().sum() == 0


def test_token_rewards_put_the_score_on_the_last_real_token() -> None:
    scores = torch.tensor([1.0, 2.0])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    rewards = token_rewards(scores, kl, mask, kl_coef=0.1)
    assert torch.allclose(rewards, torch.tensor([[-0.01, -0.02, 0.97], [1.95, 0.0, 0.0]]))


def test_kl_estimators_by_hand() -> None:
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-1))  # e^-1 - 1 + 1
    assert kl_penalty(ref, logp, "k3").item() == pytest.approx(math.e - 2)  # never negative
    # k1 and k3 are both unbiased for KL(p || q) when tokens come from p
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(50), 0)
    q = torch.softmax(torch.randn(50), 0)
    tokens = torch.multinomial(p, 200_000, replacement=True)
    exact = (p * (p.log() - q.log())).sum().item()
    for estimator in ("k1", "k3"):
        estimate = kl_penalty(p.log()[tokens], q.log()[tokens], estimator).mean().item()  # type: ignore[arg-type]
        assert estimate == pytest.approx(exact, rel=0.05)


def test_policy_loss_clips_by_hand() -> None:
    config = PPOConfig(clip_low=0.2, clip_high=0.2)
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5]])).requires_grad_()
    advantages = torch.tensor([[1.0, -1.0, -1.0]])
    out = policy_loss(logp, old, advantages, torch.ones(1, 3), config)
    # token 0: A>0, r=1.5 -> clipped at 1.2; token 1: A<0, r=.5 -> clipped at .8;
    # token 2: A<0, r=1.5 -> unclipped
    assert out.loss.item() == pytest.approx((-1.2 + 0.8 + 1.5) / 3)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad[0, 0] == 0 and grad[0, 1] == 0  # clipped tokens pass no gradient
    assert grad[0, 2].item() == pytest.approx(1.5 / 3)  # d(-A r)/dlogp = -A r, A = -1


def test_policy_loss_truncates_the_behaviour_weight() -> None:
    config = PPOConfig(behaviour_cap=2.0)
    logp = torch.zeros(1, 2, requires_grad=True)
    old = torch.zeros(1, 2)
    behaviour = torch.log(torch.tensor([[1 / 3, 0.8]]))  # weights pi_old/pi_b = 3 (capped to 2) and 1.25
    advantages = torch.ones(1, 2)
    out = policy_loss(logp, old, advantages, torch.ones(1, 2), config, behaviour_logprobs=behaviour)
    assert out.loss.item() == pytest.approx(-(2.0 + 1.25) / 2)
    assert out.truncated_fraction.item() == pytest.approx(0.5)


def test_policy_gradient_raises_the_probability_of_advantaged_tokens() -> None:
    logits = torch.zeros(4, 5, requires_grad=True)
    actions = torch.tensor([0, 1, 2, 3])
    logp = torch.log_softmax(logits, -1)[torch.arange(4), actions].view(1, 4)
    advantages = torch.tensor([[1.0, -1.0, 0.5, -0.5]])
    out = policy_loss(logp, logp.detach(), advantages, torch.ones(1, 4), PPOConfig())
    out.loss.backward()
    assert logits.grad is not None and torch.isfinite(logits.grad).all()
    moved = -logits.grad[torch.arange(4), actions]  # gradient descent direction on each chosen logit
    assert moved[0] > 0 and moved[2] > 0 and moved[1] < 0 and moved[3] < 0


def test_entropy_bonus_flattens_the_distribution() -> None:
    logits = torch.tensor([[3.0, 0.0, 0.0, 0.0]], requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, :1]
    entropy = entropy_from_logits(logits).view(1, 1)
    out = policy_loss(logp, logp.detach(), torch.zeros(1, 1), torch.ones(1, 1), PPOConfig(entropy_coef=0.5),
                      entropy=entropy)
    out.loss.backward()
    assert logits.grad is not None and logits.grad[0, 0] > 0  # descent lowers the dominant logit
    assert out.entropy is not None and out.entropy.item() == pytest.approx(entropy.item())


def test_approx_kl_estimates_kl_of_old_to_new() -> None:
    # pi_old = [.5, .5], pi = [.9, .1]; tokens sampled from pi_old: half token 0, half token 1
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.9, 0.1]]))
    out = policy_loss(new, old, torch.zeros(1, 2), torch.ones(1, 2), PPOConfig())
    exact = 0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    assert out.approx_kl.item() == pytest.approx(exact, rel=1e-4)


def test_non_finite_padding_does_not_leak() -> None:
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, float("nan")]])
    rewards = torch.tensor([[0.0, 1.0, float("inf")]])
    advantages, returns = gae(rewards, values, mask)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
    logp = torch.tensor([[-1.0, -2.0, float("-inf")]])
    kl = kl_penalty(logp, torch.tensor([[-1.5, -1.0, float("-inf")]]), "k1")  # NaN on padding
    assert torch.isfinite(token_rewards(torch.tensor([1.0]), kl, mask, 0.1)).all()
    assert torch.isfinite(aggregate(kl, mask, "seq-mean-token-mean"))


def test_ppo_advantages_follow_the_config() -> None:
    scores = torch.tensor([1.0, 0.0])
    logp = torch.tensor([[-1.0, -1.0], [-2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0], [-2.0, 0.0]])
    values = torch.tensor([[0.2, 0.1], [0.3, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    raw = ppo_advantages(scores, logp, ref, values, mask, PPOConfig(whiten_advantages=False, gamma=0.9), 0.1)
    rewards = token_rewards(scores, kl_penalty(logp, ref, "k1"), mask, 0.1)
    expected, returns = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    assert torch.allclose(raw.advantages, expected) and torch.allclose(raw.returns, returns)
    assert raw.sequence_kl == pytest.approx(0.25)  # (0.5 + 0) / 2 sequences
    whitened = ppo_advantages(scores, logp, ref, values, mask, PPOConfig(kl_estimator="k3"), 0.1)
    assert whitened.advantages[mask.bool()].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whitened.kl[0, 0].item() == pytest.approx(math.exp(-0.5) - 1 + 0.5)


def test_value_loss_clips_by_hand() -> None:
    config = PPOConfig(value_clip=0.2, value_coef=0.5)
    values = torch.tensor([[1.5]], requires_grad=True)
    out = value_loss(values, torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1), config)
    # clipped value 1.2: errors .25 (new) and .64 (clipped); PPO keeps the larger
    assert out.loss.item() == pytest.approx(0.5 * 0.5 * 0.64)
    (grad,) = torch.autograd.grad(out.loss, values)
    assert grad.item() == 0.0  # the clipped branch holds no gradient for the new value


def test_aggregation_modes() -> None:
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(losses, mask, "token-mean").item() == pytest.approx(10 / 4)
    assert aggregate(losses, mask, "seq-mean-token-mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(losses, mask, "seq-mean-token-sum").item() == pytest.approx((6 + 4) / 2)


def test_adaptive_kl_controller() -> None:
    controller = AdaptiveKLController(KLControlConfig(coef=0.1, target=6.0, horizon=100))
    assert controller.update(observed_kl=12.0, samples=10) == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    controller = AdaptiveKLController(KLControlConfig(coef=0.1, target=6.0, horizon=100))
    assert controller.update(observed_kl=5.4, samples=10) == pytest.approx(0.1 * (1 - 0.1 * 10 / 100))
    fixed = AdaptiveKLController(KLControlConfig(coef=0.1))
    assert fixed.update(observed_kl=100.0, samples=10) == 0.1
