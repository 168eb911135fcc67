"""Per-token log-probabilities of completions under a causal LM, computed without waste.

What the trainer computes for the policy and (with the LoRA adapter disabled, so it costs no extra
memory) for the reference: the same quantity the serving engines log for each sampled token.

`pack` lays variable-length samples out padding-free, back to back in one row, and a sample's
completions (a DPO pair's chosen and rejected answers, or a KTO answer and its mismatched partner) are
branches after one copy of their prompt: position ids continue from the prompt for every branch, and
the attention (`online_rl.algos.attention`) runs per sample with a mask that keeps branches apart. So
every prompt is computed once, every real token exactly once, and no padding token at all.
`forward` runs the backbone once and the LM head only where a completion token is predicted.
Pure torch: no Ray, Kafka or MLflow.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from online_rl.algos.attention import packed_attention

__all__ = [
    "AttentionLayout",
    "PackedBatch",
    "PolicyOutput",
    "Sample",
    "causal_lm",
    "completion_logprobs",
    "forward",
    "hidden_states",
    "next_token_logprobs",
    "pack",
    "reference_adapter_disabled",
    "reference_policy",
]


def completion_logprobs(model: Any, prompt_ids: Sequence[int], completion_ids: Sequence[int],
                        **forward_kwargs: Any) -> torch.Tensor:
    """log p(completion_ids[t] | prompt, completion_ids[:t]) for each t, as a float32 vector (one sample,
    the plain way: the reference against which the packed path is tested)."""
    if not completion_ids:
        return torch.zeros(0)
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)], dtype=torch.long)
    logits = model(input_ids=ids, **forward_kwargs).logits[0].float()
    # The logit at position i predicts token i + 1.
    start = len(prompt_ids) - 1
    predicted = logits[start : start + len(completion_ids)]
    targets = torch.tensor(list(completion_ids), dtype=torch.long)
    return torch.log_softmax(predicted, dim=-1).gather(1, targets.unsqueeze(1)).squeeze(1)


@dataclass(frozen=True)
class Sample:
    """One prompt and the completions scored after it (1 for KTO/PPO, 2 for a DPO pair)."""

    prompt: Sequence[int]
    completions: Sequence[Sequence[int]]


@dataclass(frozen=True)
class AttentionLayout:
    """How the packed row's attention is done by sample: its tokens in (samples, width) slots.

    Slots past a sample's end repeat its first token and attend only to themselves; their output
    is never read.
    """

    slot_token: torch.Tensor  # (samples * width,) the token in each slot
    slot_mask: torch.Tensor  # (samples, 1, width, width) bool, True = may attend
    token_slot: torch.Tensor  # (tokens,) the slot of each token


@dataclass(frozen=True)
class PackedBatch:
    """Samples laid out back to back in one row, and where to read each completion token's prediction.

    Completions are numbered in order: sample 0's completions, then sample 1's, ...
    """

    input_ids: torch.Tensor  # (1, tokens)
    position_ids: torch.Tensor  # (1, tokens)
    attention: AttentionLayout
    predict_at: torch.Tensor  # (targets,) index of the token predicting each target
    targets: torch.Tensor  # (targets,) the completion tokens, in completion order
    owner: torch.Tensor  # (targets,) which completion each target belongs to
    last_token_at: torch.Tensor  # (completions,) index of each completion's last token
    lengths: torch.Tensor  # (completions,) tokens per completion

    @property
    def num_completions(self) -> int:
        return int(self.lengths.numel())

    def to(self, device: torch.device | str) -> PackedBatch:
        """The same batch with every tensor on `device` (a no-op when they are there already)."""
        if self.input_ids.device == torch.device(device):
            return self
        layout = AttentionLayout(*(t.to(device) for t in astuple_shallow(self.attention)))
        moved = {name: value.to(device) for name, value in vars(self).items()
                 if isinstance(value, torch.Tensor)}
        return replace(self, attention=layout, **moved)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def per_completion(self, values: torch.Tensor) -> torch.Tensor:
        """Sum a per-target vector over each completion's tokens."""
        out = values.new_zeros(self.num_completions)
        return out.index_add(0, self.owner.to(values.device), values)

    def padded(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A per-target vector as (completions, longest) right-padded with zeros, and its 0/1 mask."""
        batch = self.to(values.device)
        width = int(batch.lengths.max()) if batch.num_completions else 0
        starts = torch.cumsum(batch.lengths, 0) - batch.lengths
        index = torch.arange(batch.targets.numel(), device=values.device) - starts[batch.owner]
        out = values.new_zeros(batch.num_completions, width)
        out[batch.owner, index] = values
        mask = torch.arange(width, device=values.device).unsqueeze(0) < batch.lengths.unsqueeze(1)
        return out, mask.to(values.dtype)


def astuple_shallow(instance: Any) -> tuple[Any, ...]:
    """A dataclass's field values, not copied (unlike dataclasses.astuple)."""
    return tuple(getattr(instance, f.name) for f in fields(instance))


def _tree_mask(prompt: int, branches: Sequence[int]) -> torch.Tensor:
    """Causal attention where each branch sees the prompt and itself, never another branch."""
    branch = torch.repeat_interleave(torch.arange(len(branches) + 1), torch.tensor([prompt, *branches]))
    visible = (branch.unsqueeze(0) == 0) | (branch.unsqueeze(0) == branch.unsqueeze(1))
    return visible & torch.ones(len(branch), len(branch), dtype=torch.bool).tril()


def _attention_layout(spans: Sequence[tuple[int, torch.Tensor]]) -> AttentionLayout:
    """Slots for samples starting at the given token index with the given (length, length) masks."""
    width = max(mask.shape[0] for _, mask in spans)
    slot_token = torch.empty(len(spans), width, dtype=torch.long)
    slot_mask = torch.eye(width, dtype=torch.bool).repeat(len(spans), 1, 1)
    token_slot: list[int] = []
    for number, (start, mask) in enumerate(spans):
        length = mask.shape[0]
        slot_token[number] = start
        slot_token[number, :length] = torch.arange(start, start + length)
        slot_mask[number, :length, :length] = mask
        token_slot.extend(range(number * width, number * width + length))
    return AttentionLayout(slot_token.view(-1), slot_mask.unsqueeze(1), torch.tensor(token_slot))


def pack(samples: Sequence[Sample]) -> PackedBatch:
    """Lay `samples` out back to back in one row, with no padding and each prompt once.

    Each completion follows its prompt as a branch: its positions continue from the prompt's end and
    it attends to the prompt and to itself only.
    """
    if not samples:
        raise ValueError("pack needs at least one sample")
    ids: list[int] = []
    positions: list[int] = []
    spans: list[tuple[int, torch.Tensor]] = []
    predict_at: list[int] = []
    last_token_at: list[int] = []
    lengths: list[int] = []
    for number, sample in enumerate(samples):
        if not sample.prompt:
            raise ValueError(f"sample {number} has an empty prompt: a completion's first token is predicted "
                             "from a prompt token (add the BOS token or the chat template)")
        if not sample.completions or any(not c for c in sample.completions):
            raise ValueError(f"sample {number} has no completion or an empty one")
        start, p = len(ids), len(sample.prompt)
        ids.extend(sample.prompt)
        positions.extend(range(p))
        for completion in sample.completions:
            n, col = len(completion), len(ids)
            ids.extend(completion)
            positions.extend(range(p, p + n))
            predict_at.extend([start + p - 1, *range(col, col + n - 1)])
            last_token_at.append(col + n - 1)
            lengths.append(n)
        spans.append((start, _tree_mask(p, [len(c) for c in sample.completions])))
    counts = torch.tensor(lengths, dtype=torch.long)
    return PackedBatch(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([positions], dtype=torch.long),
        attention=_attention_layout(spans),
        predict_at=torch.tensor(predict_at, dtype=torch.long),
        targets=torch.tensor([t for s in samples for c in s.completions for t in c], dtype=torch.long),
        owner=torch.repeat_interleave(torch.arange(len(lengths)), counts),
        last_token_at=torch.tensor(last_token_at, dtype=torch.long),
        lengths=counts,
    )


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside `model` (a PEFT wrapper's LoRA layers stay in place)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def hidden_states(model: Any, batch: PackedBatch) -> torch.Tensor:
    """The backbone's last hidden states for the packed row: (tokens, hidden)."""
    lm = causal_lm(model)
    batch = batch.to(lm.device)
    with packed_attention(lm.config):
        out = lm.model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False,
                       packed_layout=batch.attention)
    return out.last_hidden_state[0]


@dataclass(frozen=True)
class PolicyOutput:
    """Log-probabilities of every completion token (in completion order) and their sums."""

    token_logprobs: torch.Tensor  # (tokens,)
    sequence_logprobs: torch.Tensor  # (completions,)
    hidden: torch.Tensor  # (tokens, hidden) at the predicting positions (for a value head)
    entropy: torch.Tensor | None = None  # (tokens,) when asked for


def forward(model: Any, batch: PackedBatch, with_entropy: bool = False) -> PolicyOutput:
    """Run `model` on `batch` and score its completion tokens (with autograd when enabled)."""
    batch = batch.to(causal_lm(model).device)
    hidden = hidden_states(model, batch)[batch.predict_at]
    logits = causal_lm(model).lm_head(hidden).float()
    normaliser = torch.logsumexp(logits, dim=-1)
    token_logprobs = logits.gather(1, batch.targets.unsqueeze(1)).squeeze(1) - normaliser
    entropy = None
    if with_entropy:
        entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return PolicyOutput(token_logprobs, batch.per_completion(token_logprobs), hidden, entropy)


def next_token_logprobs(model: Any, batch: PackedBatch) -> torch.Tensor:
    """The full next-token distribution (float32 log-softmax over the vocabulary) at every position that
    predicts a completion token, in completion order: (targets, vocabulary)."""
    batch = batch.to(causal_lm(model).device)
    hidden = hidden_states(model, batch)[batch.predict_at]
    return torch.log_softmax(causal_lm(model).lm_head(hidden).float(), dim=-1)


@contextmanager
def reference_adapter_disabled(model: Any) -> Iterator[None]:
    """Within this block a PEFT model is its base model: the reference policy, at no memory cost."""
    if not hasattr(model, "disable_adapter"):
        raise TypeError("the reference policy is the base model with the LoRA adapter disabled: "
                        "pass a PEFT model (peft.get_peft_model) or compute reference log-probs separately")
    with model.disable_adapter():
        yield


@contextmanager
def reference_policy(model: Any, adapter: str | None = None) -> Iterator[None]:
    """Within this block the PEFT model is the reference policy: its base (`adapter` None), or the base
    with the frozen adapter `adapter` (e.g. the serving champion, loaded with `load_adapter`) active
    in place of the trained one. Use under `torch.no_grad()`."""
    if adapter is None:
        with reference_adapter_disabled(model):
            yield
        return
    if adapter not in getattr(model, "peft_config", {}):
        raise ValueError(f"reference adapter {adapter!r} is not loaded in the model: load_adapter it first")
    active = model.active_adapter
    model.set_adapter(adapter)
    try:
        yield
    finally:
        model.set_adapter(active)  # PEFT makes the active adapter's weights trainable again
