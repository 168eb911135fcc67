"""From joined training samples to what each algorithm trains on, and why a sample cannot be used.

Pairs go to DPO, labelled singles (thumbs, ratings, scalars mapped to a desirable/undesirable label by
the reward mapping) to KTO. A sample the trainer can never use (another base model, no completion
tokens, identical answers in a pair, longer than the model's context) is returned with the reason, for
the dead-letter topic; a sample that is merely not for the configured algorithm, or carries only a
default reward (nobody answered), is skipped. Pure: no model, no bus.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from online_rl.algos import mismatched_pairs
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.registry.runs import served_by

__all__ = ["Algorithm", "Anchor", "Rollout", "Routed", "Shard", "ThumbPairer", "anchor_sequences", "held_out",
           "load_cold_start", "route", "shard"]

Pair = tuple[list[int], list[int], list[int]]
Thumb = tuple[list[int], list[int], bool]
Anchor = tuple[list[int], list[int]]  # (prompt, answer) the policy is held to the reference on
# (prompt, completion, the serving policy's log-probs of the completion or None, reward in [0, 1])
Rollout = tuple[list[int], list[int], list[float] | None, float]
Algorithm = Literal["auto", "dpo", "kto", "ppo"]
GRADED = frozenset({"rating", "scalar", "implicit"})  # feedback kinds `auto` sends to PPO


@dataclass
class Routed:
    pairs: list[Pair] = field(default_factory=list)
    thumbs: list[Thumb] = field(default_factory=list)
    pair_ids: list[str] = field(default_factory=list)  # sample ids, parallel to `pairs`
    paired_thumb_ids: list[str] = field(default_factory=list)  # the thumbs-down of pairs made of two thumbs
    thumb_ids: list[str] = field(default_factory=list)  # ... and to `thumbs`
    rollouts: list[Rollout] = field(default_factory=list)
    rollout_ids: list[str] = field(default_factory=list)
    anchors: list[Anchor] = field(default_factory=list)  # cold-start texts for the KL term, not trained on
    rehearsed: int = 0  # of `pairs`, the fact-rehearsal pairs added at the step (not users' samples)
    skipped: int = 0
    unusable: list[tuple[TrainingSample, str]] = field(default_factory=list)
    behaviour_versions: set[str] = field(default_factory=set)
    reward_mapping_versions: set[str] = field(default_factory=set)

    @property
    def trained(self) -> int:
        return len(self.pairs) + len(self.thumbs) + len(self.rollouts)

    def split(self, held_out: Callable[[str], bool]) -> tuple[Routed, Routed]:
        """(kept, held): the samples whose id `held_out` accepts go to held, the rest (and the counts,
        unusable samples and versions seen) to kept."""
        kept = Routed(skipped=self.skipped, unusable=self.unusable,
                      behaviour_versions=self.behaviour_versions,
                      reward_mapping_versions=self.reward_mapping_versions)
        held = Routed()
        for pair, sample_id in zip(self.pairs, self.pair_ids, strict=True):
            target = held if held_out(sample_id) else kept
            target.pairs.append(pair)
            target.pair_ids.append(sample_id)
        for thumb, sample_id in zip(self.thumbs, self.thumb_ids, strict=True):
            target = held if held_out(sample_id) else kept
            target.thumbs.append(thumb)
            target.thumb_ids.append(sample_id)
        kept.rollouts, kept.rollout_ids = self.rollouts, self.rollout_ids  # PPO is judged by its reward
        kept.anchors = self.anchors
        return kept, held

    @property
    def sample_ids(self) -> set[str]:
        """The ids of every sample this step trains on (both thumbs of a pair made of two)."""
        return set(self.pair_ids) | set(self.paired_thumb_ids) | set(self.thumb_ids) | set(self.rollout_ids)

    @property
    def tokens(self) -> int:
        """Tokens computed for these samples (each prompt once)."""
        return (sum(len(p) + len(c) + len(r) for p, c, r in self.pairs)
                + sum(len(p) + len(c) for p, c, _ in self.thumbs))


def _problem(sample: TrainingSample, base_model: str, max_tokens: int, vocab_size: int | None) -> str | None:
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
        largest = max(max(sample.prompt_token_ids), max(completion.token_ids))
        if vocab_size is not None and largest >= vocab_size:
            return f"a token id outside the model's vocabulary (0 to {vocab_size - 1})"
    if sample.kind == "pair" and sample.chosen and sample.rejected \
            and sample.chosen.token_ids == sample.rejected.token_ids:
        return "chosen and rejected are the same tokens: nothing to prefer"
    return None


def route(samples: Sequence[TrainingSample], algorithm: Algorithm, base_model: str,
          max_tokens: int, vocab_size: int | None = None) -> Routed:
    """Sort `samples` into DPO pairs, KTO thumbs, PPO rollouts, skipped and unusable ones.

    auto: pairs to DPO, thumbs to KTO, graded rewards (ratings, scalars, implicit signals) to PPO;
    dpo/kto/ppo: only what that algorithm trains on (ppo: every single with a reward)."""
    routed = Routed()
    for sample in samples:
        problem = _problem(sample, base_model, max_tokens, vocab_size)
        if problem:
            routed.unusable.append((sample, problem))
            continue
        if sample.kind == "pair" and algorithm in ("auto", "dpo"):
            assert sample.chosen is not None and sample.rejected is not None  # checked by the event
            routed.pairs.append((list(sample.prompt_token_ids), list(sample.chosen.token_ids),
                                 list(sample.rejected.token_ids)))
            routed.pair_ids.append(sample.sample_id)
        elif sample.kind == "single" and not sample.defaulted and _to_ppo(sample, algorithm):
            assert sample.completion is not None and sample.reward is not None
            logprobs = list(sample.completion.logprobs)
            routed.rollouts.append((list(sample.prompt_token_ids), list(sample.completion.token_ids),
                                    logprobs if len(logprobs) == len(sample.completion.token_ids) else None,
                                    float(sample.reward)))
            routed.rollout_ids.append(sample.sample_id)
        elif (sample.kind == "single" and algorithm in ("auto", "kto") and sample.label is not None
              and not sample.defaulted):
            assert sample.completion is not None
            routed.thumbs.append((list(sample.prompt_token_ids), list(sample.completion.token_ids),
                                  sample.label))
            routed.thumb_ids.append(sample.sample_id)
        else:
            routed.skipped += 1
            continue
        routed.behaviour_versions |= served_by(sample)
        routed.reward_mapping_versions.add(sample.reward_mapping_version)
    return routed


class ThumbPairer:
    """Opposite thumbs on one prompt become a DPO pair (`trainer.pair_thumbs`).

    A thumbs-up and a thumbs-down on the same prompt (the same prompt tokens) say which of two answers
    a user prefers, as a pairwise vote does, and DPO on the pair cancels what the two answers share: the
    prompt itself, which unpaired thumbs can mistake for the taste. A thumb is paired with an opposite
    one of its batch, else with the newest opposite thumb of the last `memory` unpaired thumbs of
    earlier batches (which trained as KTO thumbs when they came and are used once more, in the pair);
    one that finds no partner trains as a KTO thumb and waits in the memory. Thumbs whose ids are in
    `exclude` (the cold-start set) are never paired. The memory lives in the trainer process: after a
    restart it starts empty and fewer pairs form, nothing is lost. Pure: no model, no bus.
    """

    def __init__(self, memory: int) -> None:
        self.memory = memory
        # prompt tokens -> unpaired thumbs of earlier batches: (completion, label, sample id), oldest first
        self._waiting: OrderedDict[tuple[int, ...], list[tuple[list[int], bool, str]]] = OrderedDict()
        self._held = 0

    def __len__(self) -> int:
        return self._held

    def pair(self, routed: Routed, exclude: Container[str] = ()) -> Routed:
        """`routed` with its pairable thumbs made into pairs (chosen: the thumbs-up's answer)."""
        out = Routed(pairs=list(routed.pairs), pair_ids=list(routed.pair_ids),
                     paired_thumb_ids=list(routed.paired_thumb_ids), rollouts=routed.rollouts,
                     rollout_ids=routed.rollout_ids, anchors=routed.anchors, skipped=routed.skipped,
                     unusable=routed.unusable, behaviour_versions=routed.behaviour_versions,
                     reward_mapping_versions=routed.reward_mapping_versions)
        batch: dict[tuple[int, ...], list[int]] = {}  # prompt -> indexes of this batch's unpaired thumbs
        single = [True] * len(routed.thumbs)
        for i, (thumb, sample_id) in enumerate(zip(routed.thumbs, routed.thumb_ids, strict=True)):
            prompt, completion, up = thumb
            if sample_id in exclude:
                continue
            key = tuple(prompt)
            mate = next((j for j in reversed(batch.get(key, [])) if routed.thumbs[j][2] != up
                         and routed.thumbs[j][1] != completion), None)
            if mate is not None:
                batch[key].remove(mate)
                single[mate] = single[i] = False
                other, other_id = routed.thumbs[mate][1], routed.thumb_ids[mate]
            else:
                earlier = self._take(key, up, completion)
                if earlier is None:
                    batch.setdefault(key, []).append(i)
                    continue
                single[i] = False
                other, other_id = earlier
            chosen, rejected = (completion, other) if up else (other, completion)
            out.pairs.append((list(prompt), chosen, rejected))
            out.pair_ids.append(sample_id if up else other_id)
            out.paired_thumb_ids.append(other_id if up else sample_id)
        for i, keep in enumerate(single):
            if keep:
                out.thumbs.append(routed.thumbs[i])
                out.thumb_ids.append(routed.thumb_ids[i])
        for key, indexes in batch.items():
            for i in indexes:
                self._remember(key, routed.thumbs[i][1], routed.thumbs[i][2], routed.thumb_ids[i])
        return out

    def _take(self, key: tuple[int, ...], up: bool, completion: list[int]) -> tuple[list[int], str] | None:
        waiting = self._waiting.get(key)
        if not waiting:
            return None
        for j in range(len(waiting) - 1, -1, -1):
            other, label, sample_id = waiting[j]
            if label != up and other != completion:
                del waiting[j]
                self._held -= 1
                if not waiting:
                    del self._waiting[key]
                return other, sample_id
        return None

    def _remember(self, key: tuple[int, ...], completion: list[int], up: bool, sample_id: str) -> None:
        if self.memory <= 0:
            return
        self._waiting.setdefault(key, []).append((completion, up, sample_id))
        self._waiting.move_to_end(key)
        self._held += 1
        while self._held > self.memory:  # forget the oldest thumb of the least recently thumbed prompt
            oldest = next(iter(self._waiting))
            self._waiting[oldest].pop(0)
            self._held -= 1
            if not self._waiting[oldest]:
                del self._waiting[oldest]


@dataclass
class Shard:
    """One data-parallel worker's share of a step's batch, with the whole batch's counts.

    `partners` are the mismatched completions of this shard's thumbs for KTO's reference point, chosen
    over the whole batch (empty when the batch holds fewer than two thumbs: its reference point is 0).
    """

    pairs: list[Pair] = field(default_factory=list)
    thumbs: list[Thumb] = field(default_factory=list)
    partners: list[list[int]] | None = None
    total_pairs: int = 0
    total_thumbs: int = 0
    rollouts: list[Rollout] = field(default_factory=list)
    rollout_index: list[int] = field(default_factory=list)  # each rollout's place in the whole batch
    total_rollouts: int = 0
    total_rollout_tokens: int = 0
    anchors: list[Anchor] = field(default_factory=list)
    total_anchor_tokens: int = 0  # answer tokens of the whole batch's anchors (the KL term's mean)
    anchor_kl_coef: float | None = None  # the KL term's weight this step (adapted); None: the worker's own
    kto_weights: tuple[float, float] | None = None  # KTO's (desirable, undesirable) weights; None: the spec's

    @property
    def total(self) -> int:
        """Samples of the DPO/KTO step in the whole batch (PPO takes its own step)."""
        return self.total_pairs + self.total_thumbs


def held_out(sample_id: str, fraction: float) -> bool:
    """Whether `sample_id` belongs to the held-out evaluation share (`fraction`, by a hash of the id,
    so every lifetime and every worker agrees)."""
    if fraction <= 0:
        return False
    digest = hashlib.sha256(sample_id.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def _tokens(sample: Pair | Thumb | Rollout | Anchor) -> int:
    if len(sample) in (2, 4):  # an anchor or a rollout: prompt and completion
        return len(sample[0]) + len(sample[1])
    second = sample[2]  # type: ignore[misc]  # a pair's rejected answer, or a thumb's label
    return len(sample[0]) + len(sample[1]) + (len(second) if isinstance(second, list) else 0)


def shard(routed: Routed, workers: int, anchor_kl_coef: float | None = None,
          kto_weights: tuple[float, float] | None = None) -> list[Shard]:
    """Split a step's samples over `workers`, balancing tokens (the longest first, each to the least
    loaded worker). Which shard a sample lands in changes nothing about the update: losses are
    weighted by the whole batch's counts and KTO's partners are chosen before the split."""
    partner_of = ([routed.thumbs[j][1] for j in mismatched_pairs(len(routed.thumbs))]
                  if len(routed.thumbs) >= 2 else None)
    shards = [Shard(partners=[] if partner_of is not None else None, total_pairs=len(routed.pairs),
                    total_thumbs=len(routed.thumbs), total_rollouts=len(routed.rollouts),
                    total_rollout_tokens=sum(len(r[1]) for r in routed.rollouts),
                    total_anchor_tokens=sum(len(a[1]) for a in routed.anchors), anchor_kl_coef=anchor_kl_coef,
                    kto_weights=kto_weights) for _ in range(workers)]
    load = [0] * workers
    work: list[tuple[int, str, int]] = [(_tokens(p), "pair", i) for i, p in enumerate(routed.pairs)]
    work += [(_tokens(t), "thumb", i) for i, t in enumerate(routed.thumbs)]
    work += [(_tokens(r), "rollout", i) for i, r in enumerate(routed.rollouts)]
    work += [(_tokens(a), "anchor", i) for i, a in enumerate(routed.anchors)]
    for tokens, kind, index in sorted(work, key=lambda w: (-w[0], w[1], w[2])):
        target = min(range(workers), key=lambda w: (load[w], w))
        load[target] += tokens
        if kind == "rollout":
            shards[target].rollouts.append(routed.rollouts[index])
            shards[target].rollout_index.append(index)
        elif kind == "anchor":
            shards[target].anchors.append(routed.anchors[index])
        elif kind == "pair":
            shards[target].pairs.append(routed.pairs[index])
        else:
            shards[target].thumbs.append(routed.thumbs[index])
            if partner_of is not None:
                shards[target].partners.append(partner_of[index])  # type: ignore[union-attr]
    return shards


def _to_ppo(sample: TrainingSample, algorithm: Algorithm) -> bool:
    kind = str(sample.feedback_kind) if sample.feedback_kind is not None else None
    return algorithm == "ppo" or (algorithm == "auto" and kind in GRADED)


def anchor_sequences(samples: Sequence[TrainingSample]) -> list[Anchor]:
    """Every (prompt, answer) of `samples` (both answers of a pair), whatever their feedback: the texts
    the KL term holds the policy to the reference on (`trainer.cold_start_loss: kl`)."""
    out: list[Anchor] = []
    for sample in samples:
        answers = [sample.chosen, sample.rejected] if sample.kind == "pair" else [sample.completion]
        out.extend((list(sample.prompt_token_ids), list(a.token_ids)) for a in answers if a is not None)
    return out


def load_cold_start(path: Path, algorithm: Algorithm, base_model: str, max_tokens: int,
                    as_anchors: bool = False, vocab_size: int | None = None) -> list[TrainingSample]:
    """The cold-start samples of a JSONL file (one TrainingSample JSON object per line), every one
    checked up front: a bad line is a configuration error naming the line, not a crash mid-training.
    `as_anchors`: the samples are KL anchors, so any sample with answer tokens will do, whatever the
    algorithm trains."""
    if not path.is_file():
        raise ConfigError(f"trainer.cold_start={path} does not exist: give a JSONL file of training "
                          "samples, or leave trainer.cold_start empty")
    samples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            samples.append(TrainingSample.model_validate_json(line))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "the line"
            raise ConfigError(f"trainer.cold_start={path}:{number}: {where}: {error['msg']} (each line must "
                              "be one training sample as JSON)") from exc
    routed = route(samples, algorithm, base_model, max_tokens, vocab_size)
    if routed.unusable:
        sample, reason = routed.unusable[0]
        raise ConfigError(f"trainer.cold_start={path}: sample {sample.sample_id} cannot be trained: {reason}")
    if not routed.trained and not as_anchors:
        raise ConfigError(f"trainer.cold_start={path} has no sample that trainer.algorithm={algorithm} "
                          "trains (pairs for dpo, labelled singles for kto, rewarded singles for ppo)")
    return samples
