"""Masked reductions shared by the losses: token masks, per-sequence normalisation, whitening.

Tensors are (batch, tokens) with a 0/1 (or bool) mask of the same shape marking real tokens.
"""

from __future__ import annotations

import torch

from online_rl.algos.config import Aggregation

__all__ = ["aggregate", "masked_mean", "masked_var", "masked_whiten"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set (over `dim`, or over everything)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked values (Bessel-corrected unless `unbiased` is False)."""
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.to(values.dtype).sum()
        variance = variance * count / (count - 1).clamp(min=1.0)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Scale the masked values to unit variance (and zero mean unless `shift_mean` is False)."""
    mean, variance = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(variance + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask.to(values.dtype)


def aggregate(losses: torch.Tensor, mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    token-mean: every token weighs the same (long answers weigh more);
    seq-mean-token-mean: every sequence weighs the same;
    seq-mean-token-sum: every sequence contributes its summed loss.
    """
    if mode == "token-mean":
        return masked_mean(losses, mask)
    weights = mask.to(losses.dtype)
    per_sequence = (losses * weights).sum(-1)
    if mode == "seq-mean-token-mean":
        per_sequence = per_sequence / weights.sum(-1).clamp(min=1.0)
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown aggregation {mode!r}")
    present = (weights.sum(-1) > 0).to(losses.dtype)
    return (per_sequence * present).sum() / present.sum().clamp(min=1.0)
