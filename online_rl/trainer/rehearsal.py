"""Fact rehearsal: DPO pairs that hold facts the model knows, mixed into every step.

A taste learned from users pulls the model's answers towards a register, and on a 135M model that
pull also moves answers it had right (docs/learning.md, "The ideal signal"). Rehearsal holds the
facts without holding the register: for a few prompts of a fixed set of simple questions, the adapter
being trained samples several answers, a verifier (the words a correct answer contains, as the
ability gate's probe has) marks each, and a correct answer is preferred over

- `edited_pairs` (the default): the same answer with its fact swapped for another fact of the set, a
  minimal pair that differs in the fact alone: the answer is the adapter's own, in whatever register
  it has reached, and the pair says "this fact, not that one" and nothing about the style;
- `rehearsal_pairs`: a wrong answer the adapter sampled to the same prompt. The two differ in form as
  well (a right answer is often the plainer one), so this pair also pulls towards that form.

A prompt with no correct answer makes no pair and costs only its sampling.

The built-in set (`REHEARSAL_SET`) shares no prompt with the ability gate's probe
(`online_rl.trainer.gate.ABILITY_PROBE`), the fact check that measures forgetting
(`online_rl.simulate.facts.FACT_CHECK`), the general-ability check
(`online_rl.demo.report.ABILITY_PROMPTS`), the cold-start anchors or the simulated users' prompts, so
what those measure is held out of it; the base model answers each of its prompts correctly at
temperature 0 (checked on SmolLM2-135M-Instruct, fp32). Pure: the sampling is the caller's.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from online_rl.errors import ConfigError
from online_rl.trainer.gate import ProbeItem, load_probe, probe_correct
from online_rl.trainer.samples import Pair

__all__ = ["REHEARSAL_SET", "RehearsalDraw", "draw_prompts", "edit_fact", "edited_pairs",
           "load_rehearsal_set", "rehearsal_pairs"]

REHEARSAL_SET: tuple[ProbeItem, ...] = tuple(ProbeItem(p, a) for p, a in (
    ("What is the capital of Iraq?", ("baghdad",)),
    ("What is the capital of Nigeria?", ("abuja",)),
    ("What is the capital of Pakistan?", ("islamabad",)),
    ("What is the capital of Ghana?", ("accra",)),
    ("What is the capital of Ethiopia?", ("addis ababa",)),
    ("What is the capital of Afghanistan?", ("kabul",)),
    ("What is the capital of Syria?", ("damascus",)),
    ("What is the capital of Lebanon?", ("beirut",)),
    ("What is the capital of Cambodia?", ("phnom penh",)),
    ("What is the capital of Nepal?", ("kathmandu",)),
    ("What is the capital of Romania?", ("bucharest",)),
    ("What is the capital of Bulgaria?", ("sofia",)),
    ("What is the capital of Bangladesh?", ("dhaka",)),
    ("What is the capital of Libya?", ("tripoli",)),
    ("Which planet is known as the Red Planet?", ("mars",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("What colour is the sky on a clear day?", ("blue",)),
    ("What gas do plants take in from the air?", ("carbon dioxide", "co2")),
    ("At what temperature in Celsius does water boil?", ("100", "hundred")),
    ("How many days are in a week?", ("7", "seven")),
    ("What is 3 times 4?", ("12", "twelve")),
    ("What is the opposite of hot?", ("cold",)),
    ("What is the opposite of early?", ("late",)),
    ("What is the opposite of heavy?", ("light",)),
    ("What is the opposite of love?", ("hate",)),
    ("What is the opposite of good?", ("bad", "evil")),
    ("What is the currency of South Africa?", ("rand",)),
    ("What is the main language spoken in Brazil?", ("portuguese",)),
    ("What is the main language spoken in Argentina?", ("spanish",)),
    ("In which city is the Brandenburg Gate?", ("berlin",)),
    ("In which country is the Parthenon?", ("greece",)),
    ("In which country is the city of Munich?", ("germany",)),
    ("In which country is the city of Mumbai?", ("india",)),
    ("In which country is the city of Rio de Janeiro?", ("brazil",)),
    ("In which country is the city of Barcelona?", ("spain",)),
))


def load_rehearsal_set(path: Path | None) -> tuple[ProbeItem, ...]:
    """`trainer.rehearsal_set`: the JSON-lines set at `path`, or the built-in one when it is empty; a
    missing or malformed file is a config error that names the field."""
    if path is None:
        return REHEARSAL_SET
    if not Path(path).is_file():
        raise ConfigError(f"trainer.rehearsal_set={path} is not a file: give a JSON-lines set of "
                          '{"prompt": ..., "accept": [...]}, or leave it empty for the built-in one')
    try:
        return load_probe(path)
    except ValueError as exc:
        raise ConfigError(str(exc).replace("trainer.ability_probe", "trainer.rehearsal_set")) from exc


def draw_prompts(size: int, count: int, seed: int, step: int) -> list[int]:
    """The indexes of the `count` rehearsal prompts (of `size`) asked at `step`: without repeats within
    a step, and the same for the same (seed, step), so a trainer resumed from a checkpoint asks what it
    would have asked."""
    return random.Random(seed * 1_000_003 + step).sample(range(size), min(count, size))


@dataclass(frozen=True)
class RehearsalDraw:
    pairs: list[Pair]  # (prompt ids, a correct answer's ids, a wrong answer's ids)
    asked: int  # prompts sampled
    answers: int  # answers sampled
    correct: int  # ... of which the verifier accepted

    def as_metrics(self) -> dict[str, float]:
        return {"rehearsal_pairs": float(len(self.pairs)),
                "rehearsal_correct": self.correct / self.answers if self.answers else 0.0}


Graded = list[tuple[ProbeItem, list[int], Sequence[tuple[list[int], str]], list[bool]]]


def _graded(items: Sequence[ProbeItem], prompt_ids: Sequence[list[int]],
            answers: Sequence[Sequence[tuple[list[int], str]]]) -> Graded:
    """(item, prompt ids, its answers, whether each is correct) for each prompt asked."""
    if not len(items) == len(prompt_ids) == len(answers):
        raise ValueError(f"rehearsal: {len(items)} prompts, {len(prompt_ids)} prompt encodings and "
                         f"{len(answers)} answer groups")
    return [(item, prompt, group, probe_correct([item] * len(group), [text for _, text in group]))
            for item, prompt, group in zip(items, prompt_ids, answers, strict=True)]


def _draw(pairs: list[Pair], graded: Graded) -> RehearsalDraw:
    return RehearsalDraw(pairs, len(graded), sum(len(group) for _, _, group, _ in graded),
                         sum(sum(verdicts) for _, _, _, verdicts in graded))


def rehearsal_pairs(items: Sequence[ProbeItem], prompt_ids: Sequence[list[int]],
                    answers: Sequence[Sequence[tuple[list[int], str]]]) -> RehearsalDraw:
    """One pair per prompt whose sampled `answers` (token ids, text) hold both a correct and a wrong
    one: the first correct chosen over the first wrong. `items`, `prompt_ids` and `answers` are
    parallel (one entry per prompt asked)."""
    pairs: list[Pair] = []
    graded = _graded(items, prompt_ids, answers)
    for _, prompt, group, verdicts in graded:
        right = next((ids for (ids, _), ok in zip(group, verdicts, strict=True) if ok and ids), None)
        wrong = next((ids for (ids, _), ok in zip(group, verdicts, strict=True) if not ok and ids), None)
        if right is not None and wrong is not None and right != wrong:
            pairs.append((list(prompt), list(right), list(wrong)))
    return _draw(pairs, graded)


def _stem(prompt: str) -> str:
    return " ".join(prompt.lower().split()[:4])  # "what is the capital", "in which country is"


def _numeric(item: ProbeItem) -> bool:
    return item.accept[0].isdigit()


def _whole(word: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!\w){re.escape(word)}(?!\w)", re.IGNORECASE)


def _form(text: str, accept: Sequence[str]) -> int | None:
    """The index of the first accepted form ("7" or "seven") that `text` holds as a whole word."""
    return next((i for i, word in enumerate(accept) if _whole(word).search(text)), None)


def edit_fact(text: str, accept: Sequence[str], distractor: str) -> str | None:
    """`text` with every whole-word occurrence of the first accepted word it holds replaced by
    `distractor`, capitalised as the occurrence was; None when it holds none as a whole word."""
    for word in accept:
        pattern = _whole(word)
        if not pattern.search(text):
            continue

        def cased(match: re.Match[str]) -> str:
            found = match.group(0)
            if found.isupper() and len(found) > 1:
                return distractor.upper()
            return distractor.title() if found[:1].isupper() else distractor

        return pattern.sub(cased, text)
    return None


def edited_pairs(items: Sequence[ProbeItem], prompt_ids: Sequence[list[int]],
                 answers: Sequence[Sequence[tuple[list[int], str]]], pool: Sequence[ProbeItem],
                 encode: Callable[[str], list[int]], eos_id: int, rng: random.Random) -> RehearsalDraw:
    """One minimal pair per prompt with a correct sampled answer: that answer (re-encoded) over the same
    text with its fact swapped for another item's of `pool` (a prompt of the same form first: a capital
    for a capital; a number only ever for a number, in the form the answer wrote it: "seven" for
    "twelve"), so the two differ in the fact alone and the pair says nothing about the register, nor
    about whether an answer holds a number. A prompt answered only wrongly makes none, and so does one
    whose fact has no other of its kind in `pool`."""
    pairs: list[Pair] = []
    graded = _graded(items, prompt_ids, answers)
    for item, prompt, group, verdicts in graded:
        right = next(((ids, text) for (ids, text), ok in zip(group, verdicts, strict=True) if ok), None)
        if right is None:
            continue
        ids, text = right
        form = _form(text, item.accept)
        if form is None:
            continue
        others = [o for o in pool if o.prompt != item.prompt and _numeric(o) == _numeric(item)
                  and not any(a in text.lower() or a in item.accept for a in o.accept[:1])]
        alike = [o for o in others if _stem(o.prompt) == _stem(item.prompt)]
        if not others:  # a number only for a number, a word for a word: else the pair says "a number"
            continue
        other = rng.choice(alike or others)
        edited = edit_fact(text, (item.accept[form],), other.accept[min(form, len(other.accept) - 1)])
        if edited is None:
            continue
        tail = [eos_id] if ids and ids[-1] == eos_id else []
        chosen, rejected = encode(text) + tail, encode(edited) + tail
        if chosen != rejected:
            pairs.append((list(prompt), chosen, rejected))
    return _draw(pairs, graded)
