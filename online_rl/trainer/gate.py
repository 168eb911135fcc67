"""The ability gate: the trainer refuses to publish a version that lost general ability.

Learning a taste from a few hundred thumbs moves a small model fast, and the same steps can make it
forget facts it knew (docs/learning.md: general ability fell to 4 of 8 on three tastes of the
preference suite). Before each publish the trainer answers a fixed probe of factual prompts greedily
with the adapter it is about to publish, and once at start with the base (adapter off); a prompt is
answered correctly when the answer contains one of its accepted words. A version that gets more than
`tolerance` of the prompts the base got right wrong is not published: the trainer goes back to the
last published adapter (the base before the first) and trains on at a lower learning rate.

The built-in probe's prompts are none of the users' prompts (the demo's and the preference suite's),
the cold-start anchors' or the general-ability check's (`online_rl.demo.report.ABILITY_PROMPTS`), and
the embedded model answers each of them correctly at temperature 0 in float32 (15 of the 16 in the
trainer's batched bfloat16: only what the base answers counts). Matching is by substring, as in the
ability check (`online_rl.demo.report.correct`). A deployment can bring its own
(`trainer.ability_probe`: JSON lines of {"prompt": ..., "accept": [...]}). Pure: no model, no Ray.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ABILITY_PROBE", "GateVerdict", "ProbeItem", "judge", "load_probe", "probe_correct"]


@dataclass(frozen=True)
class ProbeItem:
    prompt: str
    accept: tuple[str, ...]  # lower-case words; an answer containing any of them is correct


ABILITY_PROBE: tuple[ProbeItem, ...] = tuple(ProbeItem(p, a) for p, a in (
    ("What is the capital of Kenya?", ("nairobi",)),
    ("What is the capital of Norway?", ("oslo",)),
    ("What is the capital of Sweden?", ("stockholm",)),
    ("What is the capital of Ireland?", ("dublin",)),
    ("What is the capital of Thailand?", ("bangkok",)),
    ("Who developed the theory of relativity?", ("einstein",)),
    ("Who invented the light bulb?", ("edison",)),
    ("Who wrote Pride and Prejudice?", ("austen",)),
    ("What is the opposite of north?", ("south",)),
    ("What is the opposite of wet?", ("dry",)),
    ("Which organ pumps blood through the body?", ("heart",)),
    ("What is the currency of the United States?", ("dollar",)),
    ("What is the currency of the United Kingdom?", ("pound",)),
    ("Which instrument has black and white keys?", ("piano",)),
    ("What is the main language spoken in France?", ("french",)),
    ("How many legs does a cat have?", ("4", "four")),
))


def load_probe(path: Path) -> tuple[ProbeItem, ...]:
    """A probe from a JSON-lines file, one {"prompt": str, "accept": [str, ...]} per line."""
    items = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"trainer.ability_probe {path} line {number}: not JSON ({exc.msg})") from exc
        prompt, accept = (row.get("prompt"), row.get("accept")) if isinstance(row, dict) else (None, None)
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"trainer.ability_probe {path} line {number}: 'prompt' must be a non-empty "
                             "string")
        if (not isinstance(accept, list) or not accept
                or not all(isinstance(word, str) and word.strip() for word in accept)):
            raise ValueError(f"trainer.ability_probe {path} line {number}: 'accept' must be a non-empty "
                             'list of words a correct answer contains, e.g. ["paris"]')
        items.append(ProbeItem(prompt, tuple(word.lower() for word in accept)))
    if not items:
        raise ValueError(f"trainer.ability_probe {path}: no prompts; give one JSON object per line")
    return tuple(items)


def probe_correct(probe: Sequence[ProbeItem], answers: Sequence[str]) -> list[bool]:
    """For each probe prompt, whether its answer contains one of the accepted words."""
    if len(answers) != len(probe):
        raise ValueError(f"{len(answers)} answers for {len(probe)} probe prompts")
    return [any(word in answer.lower() for word in item.accept) for item, answer in zip(probe, answers,
                                                                                         strict=True)]


@dataclass(frozen=True)
class GateVerdict:
    passed: bool
    base_correct: int  # prompts the base answers correctly
    correct: int  # of those, the ones the version still answers correctly
    lost: tuple[str, ...]  # the prompts the version lost

    def as_metrics(self) -> dict[str, float]:
        return {"ability_probe_base": float(self.base_correct), "ability_probe_kept": float(self.correct),
                "ability_probe_passed": 1.0 if self.passed else 0.0}


def judge(probe: Sequence[ProbeItem], base: Sequence[bool], version: Sequence[bool],
          tolerance: int) -> GateVerdict:
    """Whether a version whose probe answers are `version` (correct or not) may be published, against
    the base's `base`: it may lose at most `tolerance` of the prompts the base got right (what the base
    got wrong does not count either way)."""
    if not len(probe) == len(base) == len(version):
        raise ValueError("judge: the probe, the base's and the version's answers differ in length")
    lost = tuple(item.prompt for item, b, v in zip(probe, base, version, strict=True) if b and not v)
    base_correct = sum(base)
    return GateVerdict(len(lost) <= tolerance, base_correct, base_correct - len(lost), lost)
