"""The cold-start KL term: KL(reference || policy) of the next-token distributions on anchor answers."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from online_rl.algos.anchor import adapt_anchor_coef, token_kl
from online_rl.algos.batch import anchor_kl_batch_loss
from online_rl.algos.logprobs import causal_lm
from tests.algos.conftest import load_policy, random_ids


def test_token_kl_is_the_kl_divergence_and_only_the_policy_gets_a_gradient() -> None:
    torch.manual_seed(0)
    reference = torch.log_softmax(torch.randn(5, 11), -1)
    policy = torch.log_softmax(torch.randn(5, 11), -1).requires_grad_()
    expected = torch.nn.functional.kl_div(policy, reference, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(token_kl(policy, reference), expected, atol=1e-6)
    assert torch.all(token_kl(policy, reference) > 0)
    assert torch.allclose(token_kl(reference, reference), torch.zeros(5), atol=1e-6)
    token_kl(policy, reference).sum().backward()
    assert policy.grad is not None and policy.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="differ in shape"):
        token_kl(policy[:3], reference)


def test_the_adaptive_weight_rises_past_the_target_and_falls_back_to_its_floor() -> None:
    # over the target: x(1 + the clipped relative error); at most x1.2 a step by default
    assert adapt_anchor_coef(1.0, observed_kl=0.011, target=0.01, floor=0.25) == pytest.approx(1.1)
    assert adapt_anchor_coef(1.0, observed_kl=0.5, target=0.01, floor=0.25) == pytest.approx(1.2)
    assert adapt_anchor_coef(1.0, observed_kl=0.5, target=0.01, floor=0.25, rate=0.5) == pytest.approx(1.5)
    # under it: down, but never below the floor (the policy equals the reference at first: KL 0)
    assert adapt_anchor_coef(1.0, observed_kl=0.0, target=0.01, floor=0.25) == pytest.approx(0.8)
    assert adapt_anchor_coef(0.25, observed_kl=0.0, target=0.01, floor=0.25) == 0.25
    assert adapt_anchor_coef(999.0, observed_kl=1.0, target=0.01, floor=0.25) == 1000.0  # the ceiling
    assert adapt_anchor_coef(2.0, observed_kl=float("nan"), target=0.01, floor=0.25) == 2.0
    weight = 0.25  # a run of drifting steps, then held ones: up to where it holds, then back to the floor
    for _ in range(10):
        weight = adapt_anchor_coef(weight, observed_kl=0.05, target=0.01, floor=0.25)
    assert weight == pytest.approx(0.25 * 1.2 ** 10)
    for _ in range(30):
        weight = adapt_anchor_coef(weight, observed_kl=0.001, target=0.01, floor=0.25)
    assert weight == 0.25
    with pytest.raises(ValueError, match="target=0"):
        adapt_anchor_coef(1.0, observed_kl=0.1, target=0, floor=0.25)


def test_the_anchor_term_is_zero_for_the_reference_and_the_per_sample_kl_otherwise(tiny_model: Path) -> None:
    rng = random.Random(3)
    anchors = [(random_ids(rng, 2, 8), random_ids(rng, 1, 6)) for _ in range(4)]
    identity = load_policy(tiny_model, random_adapter=False)  # LoRA's B is zero: the policy is the base
    assert anchor_kl_batch_loss(identity, anchors).total.abs().item() < 1e-6

    moved = load_policy(tiny_model, random_adapter=True)
    held = anchor_kl_batch_loss(moved, anchors)
    assert held.tokens == sum(len(a) for _, a in anchors)
    expected = torch.zeros(())
    for prompt, answer in anchors:  # one sample at a time, the plain way, against the adapter-disabled base
        ids = torch.tensor([prompt + answer])
        start = len(prompt) - 1
        with torch.no_grad():
            policy = torch.log_softmax(moved(input_ids=ids).logits[0, start:start + len(answer)].float(), -1)
            with moved.disable_adapter():
                base = torch.log_softmax(causal_lm(moved)(input_ids=ids).logits[0, start:start + len(answer)]
                                         .float(), -1)
        expected += token_kl(policy, base).sum()
    assert held.total.item() > 1e-3
    assert torch.allclose(held.total.detach(), expected, rtol=1e-4)
    held.total.backward()
    grads = [p.grad for n, p in moved.named_parameters() if "lora_" in n]
    assert grads and all(g is not None for g in grads) and sum(g.abs().sum() for g in grads) > 0
