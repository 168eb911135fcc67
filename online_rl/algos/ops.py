"""Masked reductions shared by the losses: token masks, per-sequence normalisation, whitening.

Tensors are (batch, tokens) with a 0/1 (or bool) mask of the same shape marking real tokens. Results
are float32 whatever the input (a bfloat16 value head would otherwise round sums of hundreds of
tokens), and whatever sits on padding (NaN, inf) never reaches them.
"""

from __future__ import annotations

import torch

from online_rl.algos.config import Aggregation

__all__ = ["aggregate", "masked", "masked_mean", "masked_var", "masked_whiten"]


def masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`values` in float32 where `mask` is set and 0 elsewhere (NaN or inf on padding cannot leak)."""
    return torch.where(mask.bool(), values.float(), 0.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set (over `dim`, or over everything), in float32."""
    weights = mask.float()
    if dim is None:
        return masked(values, mask).sum() / weights.sum().clamp(min=1.0)
    return masked(values, mask).sum(dim) / weights.sum(dim).clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked values (Bessel-corrected unless `unbiased` is False)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((masked(values, mask) - mean) ** 2, mask)
    if unbiased:
        count = mask.float().sum()
        variance = variance * count / (count - 1).clamp(min=1.0)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Scale the masked values to unit variance (and zero mean unless `shift_mean` is False)."""
    mean, variance = masked_mean(values, mask), masked_var(values, mask)
    whitened = (masked(values, mask) - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return masked(whitened, mask)


def aggregate(losses: torch.Tensor, mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    token-mean: every token weighs the same (long answers weigh more);
    seq-mean-token-mean: every sequence weighs the same;
    seq-mean-token-sum: every sequence contributes its summed loss.
    """
    if mode == "token-mean":
        return masked_mean(losses, mask)
    weights = mask.float()
    per_sequence = masked(losses, mask).sum(-1)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / weights.sum(-1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown aggregation {mode!r}")
    present = (weights.sum(-1) > 0).float()
    return (per_sequence * present).sum() / present.sum().clamp(min=1.0)
