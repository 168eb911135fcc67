"""Attention over a packed row: per sample, as plain matrix products with the sample's own mask.

The linear layers see all samples as one padding-free row; attention alone is done by sample (the
batch's `AttentionLayout`), so no token attends outside its sample and no work is spent on the
blocks between samples. A sample's branches must not see each other, so the fused kernels' causal
fast path does not apply; PyTorch's CPU flash kernel with an explicit mask was measured slower here
than two matrix products and a softmax, whose products run on the bfloat16 units under autocast.
Grouped-query heads share their key/value head by a reshape instead of a copy.

`packed_attention(config)` switches a transformers model to this implementation for the duration of a
block (the model reads its attention implementation from its config at every call), so a model must
not be generating on another thread meanwhile. Sliding windows, logit soft-capping and attention
sinks (Mistral, Gemma 2, gpt-oss) are refused rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["ATTENTION_NAME", "packed_attention"]

ATTENTION_NAME = "online_rl_packed"


def _attend(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
            attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
            packed_layout: Any | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Attention for (batch, heads, tokens, dim) inputs; by sample when the row is packed.

    A packed row's tokens are gathered into (samples, longest sample) slots, attended with each
    sample's mask in one batched product, and scattered back: a few large operations per layer
    instead of a few small ones per sample.
    """
    unsupported = [name for name in ("sliding_window", "softcap", "s_aux") if kwargs.get(name) is not None]
    if unsupported:
        raise NotImplementedError(f"packed attention does not implement {', '.join(unsupported)}: this "
                                  "model needs an attention variant online-rl has not built (Llama-style "
                                  "models work)")
    dropout = dropout if module.training else 0.0
    if packed_layout is None:
        return _dense(query, key, value, attention_mask, scaling, dropout), None
    samples, width = packed_layout.slot_mask.shape[0], packed_layout.slot_mask.shape[-1]

    def slots(states: torch.Tensor) -> torch.Tensor:  # (1, h, tokens, d) -> (samples, h, width, d)
        gathered = states[0].index_select(1, packed_layout.slot_token)
        return gathered.view(states.shape[1], samples, width, states.shape[-1]).transpose(0, 1)

    out = _dense(slots(query), slots(key), slots(value), packed_layout.slot_mask, scaling, dropout)
    flat = out.reshape(samples * width, query.shape[1], query.shape[-1])
    return flat.index_select(0, packed_layout.token_slot).unsqueeze(0), None


def _dense(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
           scaling: float, dropout: float) -> torch.Tensor:
    batch, heads, length, dim = query.shape
    kv_heads, keys = key.shape[1], key.shape[2]
    group = heads // kv_heads
    # Query head kv * group + j uses key/value head kv (the layout transformers' repeat_kv produces).
    grouped = query.reshape(batch, kv_heads, group * length, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * scaling
    scores = scores.view(batch, kv_heads, group, length, keys)
    if attention_mask is None:
        attention_mask = torch.ones(length, keys, dtype=torch.bool, device=query.device).tril(keys - length)
        attention_mask = attention_mask.view(1, 1, length, keys)
    if attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask.unsqueeze(2), float("-inf"))
    else:
        scores = scores + attention_mask.unsqueeze(2)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if dropout:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    out = torch.matmul(probs.view(batch, kv_heads, group * length, keys), value)
    return out.view(batch, heads, length, dim).transpose(1, 2)


@contextmanager
def packed_attention(config: Any) -> Iterator[None]:
    """Use the packed attention in every model sharing `config` within this block."""
    from transformers import AttentionInterface

    if ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, _attend)
    previous = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = previous
