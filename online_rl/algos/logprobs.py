"""Per-token log-probabilities of completions under a causal LM (teacher forcing).

What the trainer computes for the policy (and, with the adapter disabled, for the reference):
the same quantity the serving engines log for each sampled token, so the two can be compared.
Pure torch: no Ray, Kafka or MLflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["completion_logprobs"]


def completion_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                        **forward_kwargs: Any) -> torch.Tensor:
    """log p(completion_ids[t] | prompt, completion_ids[:t]) for each t, as a float32 vector."""
    if not completion_ids:
        return torch.zeros(0)
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    logits = model(input_ids=ids, **forward_kwargs).logits[0].float()
    # The logit at position i predicts token i + 1.
    start = len(prompt_ids) - 1
    predicted = logits[start : start + len(completion_ids)]
    targets = torch.tensor(list(completion_ids), dtype=torch.long)
    return torch.log_softmax(predicted, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)
