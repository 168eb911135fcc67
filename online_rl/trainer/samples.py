"""From joined training samples to what each algorithm trains on, and why a sample cannot be used.

Pairs go to DPO, labelled singles (thumbs, ratings, scalars mapped to a desirable/undesirable label by
the reward mapping) to KTO. A sample the trainer can never use (another base model, no completion
tokens, identical answers in a pair, longer than the model's context) is returned with the reason, for
the dead-letter topic; a sample that is merely not for the configured algorithm, or carries only a
default reward (nobody answered), is skipped. Pure: no model, no bus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from online_rl.events import TrainingSample

__all__ = ["Routed", "route"]

Pair = tuple[list[int], list[int], list[int]]
Thumb = tuple[list[int], list[int], bool]


@dataclass
class Routed:
    pairs: list[Pair] = field(default_factory=list)
    thumbs: list[Thumb] = field(default_factory=list)
    skipped: int = 0
    unusable: list[tuple[TrainingSample, str]] = field(default_factory=list)
    behaviour_versions: set[str] = field(default_factory=set)
    reward_mapping_versions: set[str] = field(default_factory=set)

    @property
    def trained(self) -> int:
        return len(self.pairs) + len(self.thumbs)

    @property
    def tokens(self) -> int:
        """Tokens computed for these samples (each prompt once)."""
        return (sum(len(p) + len(c) + len(r) for p, c, r in self.pairs)
                + sum(len(p) + len(c) for p, c, _ in self.thumbs))


def _problem(sample: TrainingSample, base_model: str, max_tokens: int) -> str | None:
    if sample.model != base_model:
        return f"sample of base model {sample.model!r}; this trainer trains {base_model!r}"
    if not sample.prompt_token_ids:
        return "no prompt tokens"
    completions = [sample.chosen, sample.rejected] if sample.kind == "pair" else [sample.completion]
    for completion in completions:
        if completion is None or not completion.token_ids:
            return "a completion has no tokens"
        if len(sample.prompt_token_ids) + len(completion.token_ids) > max_tokens:
            return f"longer than the model's context ({max_tokens} tokens)"
    if sample.kind == "pair" and sample.chosen and sample.rejected \
            and sample.chosen.token_ids == sample.rejected.token_ids:
        return "chosen and rejected are the same tokens: nothing to prefer"
    return None


def route(samples: Sequence[TrainingSample], algorithm: Literal["auto", "dpo", "kto"], base_model: str,
          max_tokens: int) -> Routed:
    """Sort `samples` into DPO pairs, KTO thumbs, skipped and unusable ones."""
    routed = Routed()
    for sample in samples:
        problem = _problem(sample, base_model, max_tokens)
        if problem:
            routed.unusable.append((sample, problem))
            continue
        if sample.kind == "pair" and algorithm in ("auto", "dpo"):
            assert sample.chosen is not None and sample.rejected is not None  # checked by the event
            routed.pairs.append((list(sample.prompt_token_ids), list(sample.chosen.token_ids),
                                 list(sample.rejected.token_ids)))
        elif (sample.kind == "single" and algorithm in ("auto", "kto") and sample.label is not None
              and not sample.defaulted):
            assert sample.completion is not None
            routed.thumbs.append((list(sample.prompt_token_ids), list(sample.completion.token_ids),
                                  sample.label))
        else:
            routed.skipped += 1
            continue
        routed.behaviour_versions.update(v or "base" for v in sample.behaviour_versions)
        routed.reward_mapping_versions.add(sample.reward_mapping_version)
    return routed
