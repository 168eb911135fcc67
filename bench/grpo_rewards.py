"""The reward function `bench/grpo.py` teaches with (loaded by target: `bench.grpo_rewards:brief_on_topic`).

"Answers under N words that still contain the key word": the key word is the prompt's longest word (for
"What is the capital of France?", "capital"); an answer scores 1 when it holds that word in at most 8
words, falling linearly to 0 at 40 words, and 0 without the word however short it is. The base model
answers at length, so most of its answers score low: the gap is what GRPO has to close.

`taste_<name>` (`bench.grpo_rewards:taste_enthusiastic`, `taste_by_topic`, ...) is a preference of the
suite (online_rl/simulate/suite.py) as a reward: its own noise-free score of the answer. With it
(`bench/grpo.py --preference NAME`) GRPO learns the taste from the ideal signal, an upper bound for what
the feedback loop learns of it from users' thumbs (docs/learning.md).
"""

from __future__ import annotations

import re
from typing import Any

SHORT, LONG = 8, 40


def key_word(prompt: str) -> str:
    words = re.findall(r"[a-zA-Z]+", prompt.split("assistant")[0])
    return max(words, key=len).lower() if words else ""


def brief_on_topic(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    words = completion.split()
    key = key_word(prompt)
    if not key or key not in completion.lower():
        return 0.0
    return max(0.0, min(1.0, (LONG - len(words)) / (LONG - SHORT)))


def _taste(name: str) -> Any:
    from online_rl.simulate.suite import suite_entry

    preference = suite_entry(name).preference

    def score(prompt: str, completion: str, meta: dict[str, Any]) -> float:
        return float(preference.score(prompt, completion))

    score.__name__ = f"taste_{name.replace('-', '_')}"
    return score


# one per preference of the suite (online_rl/simulate/suite.py): `bench.grpo_rewards:taste_by_topic`, ...
def __getattr__(name: str) -> Any:
    if name.startswith("taste_"):
        try:
            return _taste(name[len("taste_"):].replace("_", "-"))
        except ValueError as error:  # no such taste: what getattr's callers expect
            raise AttributeError(str(error)) from None
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def probe_facts(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """A verifier on the trainer's ability probe (`online_rl.trainer.gate.ABILITY_PROBE`, 16 facts, none of
    the fact check's or the ability check's): 1 when the answer to a probe prompt holds an accepted word,
    else 0; 0 for every other prompt, which within a group of answers to one prompt changes nothing.
    Trained beside a taste (`bench/ideal.py --rehearse W`), it rehearses answering facts rightly."""
    from online_rl.trainer.gate import ABILITY_PROBE, probe_correct

    item = next((item for item in ABILITY_PROBE if item.prompt == prompt), None)
    return 0.0 if item is None else float(probe_correct([item], [completion])[0])
