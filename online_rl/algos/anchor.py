"""A neutral defence against forgetting: hold the policy's next-token distributions to the reference's.

On anchor texts (general prompts and the base model's own answers to them) the policy should stay what
the reference is, whatever the users teach elsewhere. Unlike training the anchors as thumbs-up (which
pulls towards their form: short answers when they are short), the term below leans towards no taste:
at every anchor position it is the full-vocabulary KL(reference || policy), zero where the policy is
unchanged and growing quadratically with the change, so small moves cost little and a rewrite of what
the model knows costs much. Pure functions on log-probabilities.
"""

from __future__ import annotations

import math

import torch

__all__ = ["adapt_anchor_coef", "token_kl"]


def token_kl(policy_logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(reference || policy) at each position: sum over the vocabulary of
    p_ref * (log p_ref - log p_policy), from (positions, vocabulary) log-probabilities. Differentiable in
    the policy's; the reference's should carry no gradient."""
    if policy_logprobs.shape != reference_logprobs.shape:
        raise ValueError(f"policy log-probs {tuple(policy_logprobs.shape)} and reference log-probs "
                         f"{tuple(reference_logprobs.shape)} differ in shape: give both at the same "
                         "positions")
    reference = reference_logprobs.float()
    terms = reference.exp() * (reference - policy_logprobs.float())
    # where the reference gives a token no probability its term is 0 (0 * log 0), not NaN
    return torch.where(reference > float("-inf"), terms, torch.zeros_like(terms)).sum(-1)


def adapt_anchor_coef(coef: float, observed_kl: float, target: float, floor: float, rate: float = 0.2,
                      ceiling: float = 1000.0) -> float:
    """The anchor term's next weight: moved so the observed mean KL per anchor token tracks `target`.

    coef * (1 + clip(observed / target - 1, -rate, rate)), kept within [floor, ceiling]. The floor (the
    configured weight) keeps the term from fading to nothing while the policy still equals the
    reference (the KL is 0 then, below any target): the weight only rises above it while the answers to
    the anchor prompts drift past the target, and falls back to it once they are held.
    """
    if not (target > 0 and rate > 0 and 0 <= floor <= ceiling):
        raise ValueError(f"adapt_anchor_coef: target={target} and rate={rate} must be > 0 and "
                         f"0 <= floor={floor} <= ceiling={ceiling}")
    if math.isnan(observed_kl):  # no evidence, no move
        return min(max(coef, floor), ceiling)
    error = min(max(observed_kl / target - 1.0, -rate), rate)
    return min(max(coef * (1.0 + error), floor), ceiling)
