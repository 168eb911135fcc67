"""DPO, KTO and Bradley-Terry by hand; the configs' error messages."""

from __future__ import annotations

import math

import pytest
import torch

from online_rl.algos import (
    DPOConfig,
    KLControlConfig,
    KTOConfig,
    PPOConfig,
    RewardModelConfig,
    balanced_weights,
    bradley_terry_loss,
    dpo_loss,
    kto_loss,
    kto_reference_point,
    mismatched_pairs,
    thumbs_loss,
)
from online_rl.algos.policy import LoraSpec
from online_rl.errors import ConfigError


def _softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_dpo_by_hand_and_gradients_prefer_chosen() -> None:
    chosen, rejected = torch.tensor([-1.0], requires_grad=True), torch.tensor([-2.0], requires_grad=True)
    ref = torch.tensor([-1.5])
    out = dpo_loss(chosen, rejected, ref, ref, DPOConfig(beta=0.1))
    # log-ratios +.5 and -.5, delta = .1 * 1
    assert out.loss.item() == pytest.approx(_softplus(-0.1))
    assert out.chosen_rewards.item() == pytest.approx(0.05)
    assert out.rejected_rewards.item() == pytest.approx(-0.05)
    assert out.accuracy.item() == 1.0
    grad_chosen, grad_rejected = torch.autograd.grad(out.loss, [chosen, rejected])
    assert grad_chosen.item() < 0 < grad_rejected.item()  # descent raises chosen, lowers rejected
    smoothed = dpo_loss(chosen, rejected, ref, ref, DPOConfig(beta=0.1, label_smoothing=0.1))
    assert smoothed.loss.item() == pytest.approx(0.9 * _softplus(-0.1) + 0.1 * _softplus(0.1))


def test_ipo_by_hand() -> None:
    out = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]),
                   DPOConfig(beta=0.1, loss="ipo"), chosen_lengths=torch.tensor([2]),
                   rejected_lengths=torch.tensor([4]))
    assert out.loss.item() == pytest.approx((0.5 / 2 + 0.5 / 4 - 1 / 0.2) ** 2)
    with pytest.raises(ValueError, match="chosen_lengths"):
        dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), DPOConfig(loss="ipo"))


def test_kto_by_hand_and_gradients() -> None:
    logps = torch.tensor([-1.0, -1.0], requires_grad=True)
    out = kto_loss(logps, torch.tensor([-1.5, -1.5]), torch.tensor([True, False]), torch.tensor(0.2),
                   KTOConfig(beta=0.1, undesirable_weight=2.0))
    sigmoid = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert out.losses.tolist() == pytest.approx([1 - sigmoid(0.1 * 0.3), 2 * (1 - sigmoid(0.1 * -0.3))])
    (grad,) = torch.autograd.grad(out.loss, logps)
    assert grad[0] < 0 < grad[1]  # thumbs-up raised, thumbs-down lowered
    # the reference point is floored at 0
    assert kto_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])).item() == 0.0
    assert kto_reference_point(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -3.0])).item() == 0.75
    assert mismatched_pairs(3) == [1, 2, 0]
    with pytest.raises(ValueError, match="at least 2"):
        mismatched_pairs(1)


def test_kto_balance_raises_the_rarer_labels_weight_up_to_its_cap() -> None:
    config = KTOConfig(beta=0.1)
    rare_ups = balanced_weights(ups=5, downs=20, config=config, cap=10)
    assert (rare_ups.desirable_weight, rare_ups.undesirable_weight, rare_ups.beta) == (4.0, 1.0, 0.1)
    rare_downs = balanced_weights(ups=30, downs=10, config=config, cap=10)
    assert (rare_downs.desirable_weight, rare_downs.undesirable_weight) == (1.0, 3.0)
    assert balanced_weights(ups=1, downs=100, config=config, cap=10).desirable_weight == 10.0  # the cap
    # the configured weights count: 2 x 5 ups against 20 downs is half, so x2 more
    assert balanced_weights(5, 20, KTOConfig(desirable_weight=2.0), cap=10).desirable_weight == 4.0
    for ups, downs in ((0, 7), (7, 0), (6, 6)):  # one label unseen, or already even: unchanged
        assert balanced_weights(ups, downs, config, cap=10) == config
    with pytest.raises(ValueError, match=r"cap=0\.5 must be >= 1"):
        balanced_weights(1, 2, config, cap=0.5)


def test_bradley_terry_by_hand() -> None:
    chosen, rejected = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.5])
    out = bradley_terry_loss(chosen, rejected, RewardModelConfig())
    assert out.loss.item() == pytest.approx((_softplus(-1.0) + _softplus(0.5)) / 2)
    assert out.accuracy.item() == 0.5
    out = bradley_terry_loss(chosen, rejected, RewardModelConfig(margin=0.5, center_coef=0.1))
    assert out.loss.item() == pytest.approx((_softplus(-0.5) + _softplus(1.0)) / 2 + 0.1 * (1 + 0.25) / 2)


def test_thumbs_loss_by_hand_each_kind_weighing_half() -> None:
    rewards, up = torch.tensor([2.0, -1.0, 0.5]), torch.tensor([True, False, False])
    out = thumbs_loss(rewards, up)
    # the thumbs-up alone is half the loss, the two thumbs-down share the other half
    assert out.loss.item() == pytest.approx((_softplus(-2.0) + (_softplus(-1.0) + _softplus(0.5)) / 2) / 2)
    assert out.accuracy.item() == pytest.approx(2 / 3)  # the last thumbs-down scored above 0
    only_downs = thumbs_loss(torch.tensor([-1.0, 0.5]), torch.tensor([False, False]))
    assert only_downs.loss.item() == pytest.approx((_softplus(-1.0) + _softplus(0.5)) / 2)


@pytest.mark.parametrize(
    ("build", "message"),
    [(lambda: DPOConfig(beta=0), "dpo.beta=0 must be > 0"),
     (lambda: DPOConfig(loss="hinge"), "dpo.loss='hinge' is not one of sigmoid, ipo"),
     (lambda: DPOConfig(label_smoothing=0.5), "dpo.label_smoothing=0.5 must lie in"),
     (lambda: DPOConfig(loss="ipo", label_smoothing=0.1), "applies to loss 'sigmoid' only"),
     (lambda: KTOConfig(undesirable_weight=-1), "kto.undesirable_weight=-1 must be > 0"),
     (lambda: PPOConfig(clip_low=1.5), "ppo.clip_low=1.5 must lie in [0.0, 1.0]"),
     (lambda: PPOConfig(behaviour_cap=0.5), "ppo.behaviour_cap=0.5 must be >= 1"),
     (lambda: PPOConfig(gamma=0), "ppo.gamma=0 must lie in (0, 1]"),
     (lambda: PPOConfig(aggregation="mean"), "ppo.aggregation='mean' is not one of"),
     (lambda: PPOConfig(kl_estimator="k4"), "ppo.kl_estimator='k4' is not one of k1, k2, k3"),
     (lambda: KLControlConfig(coef=0, target=6.0), "kl.coef must be > 0 when kl.target is set"),
     (lambda: KLControlConfig(target=-1.0), "kl.target=-1.0 must be > 0"),
     (lambda: RewardModelConfig(margin=-1), "reward_model.margin=-1 must be >= 0"),
     (lambda: LoraSpec(rank=0), "lora.rank=0 must lie in [1, 256]"),
     (lambda: LoraSpec(targets=()), "lora.targets is empty")],
)
def test_bad_settings_name_the_field_and_the_fix(build: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        build()  # type: ignore[operator]
    assert message in str(error.value)
    assert "e.g." in str(error.value) or "not one of" in str(error.value) or "only" in str(error.value)
