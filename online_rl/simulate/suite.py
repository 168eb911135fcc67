"""The preference suite: nine tastes of different kinds that simulated users can have, to measure whether
the loop learns what its users like rather than the one taste its defaults were tried on.

Each preference is a pure `score(prompt, answer) -> float` in [0, 1] (thumbs are up at 0.5 or more,
ratings scale with it, pairwise prefers the higher), plus the topics its users ask about
(`online_rl.simulate.prompts`; a topic named twice is asked twice as often) and the base rate measured
on the embedded model (the share of its answers the users like: SmolLM2-135M-Instruct, temperature
0.7, 48 tokens, three answers per prompt of those topics; `python -m online_rl.simulate.suite` measures
it again). `holdout` marks the preference kept out of any choice of defaults: it is only ever measured.

- shorter (length): answers of at most 20 words (no credit at 40);
- longer (length): at least 44 words (no credit at 22), to factual, creative and private questions;
- you (lexical habit): answers that speak to the reader ("you", "your");
- enthusiastic (tone): an exclamation mark or an enthusiastic word (great, love, amazing ...);
- numbers (specificity): a concrete number (digits or a number word);
- example (giving an example): "for example", "for instance", "such as", "e.g." or "including";
- refuse (refusing a kind of request): a refusal of a request for someone's private data, and no
  refusal of a factual question;
- by-topic (prompt-dependent): steps as a list for how-to questions, one sentence for factual ones, a
  reason ("because") for science;
- formal (register, the holdout): no contractions ("it's", "don't") and no exclamation mark.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from online_rl.simulate.preferences import Preference
from online_rl.simulate.prompts import TOPICS, topic_of

__all__ = ["ENTHUSIASTIC", "EXAMPLE", "NUMBERS", "SUITE", "YOU", "ByTopic", "Formal", "Longer", "Mentions",
           "Refuse", "Shorter", "SuiteEntry", "suite_entry", "words"]


def words(text: str) -> int:
    return len(text.split())


def _matches(pattern: str) -> Callable[[str], bool]:
    compiled = re.compile(pattern, re.IGNORECASE | re.MULTILINE)
    return lambda text: compiled.search(text) is not None


@dataclass(frozen=True)
class Shorter:
    """Likes answers of at most `max_words` words; credit falls linearly to 0 at twice that."""

    max_words: int = 20

    @property
    def name(self) -> str:
        return "shorter"

    def score(self, prompt: str, answer: str) -> float:
        return max(0.0, min(1.0, 2.0 - words(answer) / self.max_words))


@dataclass(frozen=True)
class Longer:
    """Likes answers of at least `min_words` words; credit falls linearly to 0 at half that."""

    min_words: int = 44

    @property
    def name(self) -> str:
        return "longer"

    def score(self, prompt: str, answer: str) -> float:
        half = self.min_words / 2
        return max(0.0, min(1.0, (words(answer) - half) / half))


@dataclass(frozen=True)
class Mentions:
    """Likes answers in which the regular expression `pattern` occurs (case-insensitive, multi-line):
    the suite's lexical habit, tone, specificity and example preferences."""

    label: str
    pattern: str

    @property
    def name(self) -> str:
        return self.label

    def score(self, prompt: str, answer: str) -> float:
        return 1.0 if re.search(self.pattern, answer, re.IGNORECASE | re.MULTILINE) else 0.0


# a lexical habit: speaking to the reader
YOU = Mentions("you", r"\b(you|your|yours|yourself)\b")
# a tone: an exclamation mark or an enthusiastic word
ENTHUSIASTIC = Mentions(
    "enthusiastic",
    r"!|\b(great|love|lovely|amazing|wonderful|fantastic|exciting|awesome|delighted|glad|happy to)\b",
)
# specificity: a concrete number
NUMBERS = Mentions(
    "numbers",
    r"\d|\b(one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|thirty|"
    r"hundred|thousand|million|billion|dozen|half)\b",
)
# giving an example
EXAMPLE = Mentions("example", r"\b(for example|for instance|such as|e\.g\.|including)")


_REFUSAL = _matches(
    r"(\bi'?m sorry\b|\bi am sorry\b|\bi can'?t\b|\bi cannot\b|\bi can not\b|\bunable to\b|"
    r"\bnot able to\b|\bi don'?t have access\b|\bi do not have access\b|\bprivacy\b|\bprivate\b|"
    r"\bi won'?t\b|\bnot appropriate\b|\bcan'?t help\b|\bcan'?t provide\b|\bcannot provide\b)"
)


def refuses(answer: str) -> bool:
    """Whether `answer` declines the request (an apology, "I can't", a privacy reason)."""
    return _REFUSAL(answer.replace("\u2019", "'"))


@dataclass(frozen=True)
class Refuse:
    """Refusing a kind of request: likes a refusal of a request for someone's private data, and an
    answer (no refusal) to any other question."""

    @property
    def name(self) -> str:
        return "refuse"

    def score(self, prompt: str, answer: str) -> float:
        return 1.0 if refuses(answer) == (topic_of(prompt) == "private") else 0.0


_LIST = _matches(r"^\s*(\d+[.)]|[-*\u2022])\s+\S")
_BECAUSE = _matches(r"\bbecause\b")
_SENTENCE_END = re.compile(r"[.!?](\s|$)")


def one_sentence(answer: str) -> bool:
    """A single complete sentence: it ends with . ! or ? and has no other sentence end."""
    text = answer.strip()
    return bool(text) and text[-1] in ".!?" and len(_SENTENCE_END.findall(text)) == 1


@dataclass(frozen=True)
class ByTopic:
    """Prompt-dependent: for a how-to question, likes steps as a list; for a factual question, one
    sentence; for a science question, a reason ("because"); for any other prompt, no list and at most
    three sentences."""

    @property
    def name(self) -> str:
        return "by-topic"

    def score(self, prompt: str, answer: str) -> float:
        topic = topic_of(prompt)
        if topic == "howto":
            return 1.0 if _LIST(answer) else 0.0
        if topic == "fact":
            return 1.0 if one_sentence(answer) else 0.0
        if topic == "science":
            return 1.0 if _BECAUSE(answer) else 0.0
        return 1.0 if not _LIST(answer) and len(_SENTENCE_END.findall(answer.strip())) <= 3 else 0.0


_CONTRACTION = re.compile(r"\w['\u2019](s|t|m|re|ve|ll|d)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Formal:
    """A register: likes answers without contractions or exclamation marks."""

    @property
    def name(self) -> str:
        return "formal"

    def score(self, prompt: str, answer: str) -> float:
        return 0.0 if "!" in answer or _CONTRACTION.search(answer) else 1.0


@dataclass(frozen=True)
class SuiteEntry:
    """One preference of the suite: the taste, the topics its users ask about, its base rate."""

    preference: Preference
    kind: str
    topics: tuple[str, ...]
    base_rate: float  # measured (see the module docstring), for reference; benchmarks measure it again
    holdout: bool = False

    @property
    def name(self) -> str:
        return str(self.preference.name)

    def prompts(self, split: str) -> list[str]:
        """The `train` or `eval` prompts of this entry's topics, a topic named twice listed twice."""
        if split not in ("train", "eval"):
            raise ValueError(f"split {split!r} is not train or eval")
        offset = 0 if split == "train" else 1
        return [text for topic in self.topics for text in TOPICS[topic][offset::2]]


_ALL = tuple(TOPICS)
SUITE: tuple[SuiteEntry, ...] = (
    SuiteEntry(Shorter(), "length", _ALL, 0.27),
    SuiteEntry(Longer(), "length", ("fact", "creative", "private"), 0.43),
    SuiteEntry(YOU, "lexical habit", _ALL, 0.42),
    SuiteEntry(ENTHUSIASTIC, "tone", _ALL, 0.11),
    SuiteEntry(NUMBERS, "specificity", _ALL, 0.34),
    SuiteEntry(EXAMPLE, "giving an example", ("science", "advice", "howto"), 0.03),
    SuiteEntry(Refuse(), "refusing a kind of request", ("private", "private", "fact"), 0.59),
    SuiteEntry(ByTopic(), "prompt-dependent", ("howto", "fact", "science"), 0.29),
    SuiteEntry(Formal(), "register", _ALL, 0.43, holdout=True),
)


def suite_entry(name: str) -> SuiteEntry:
    """The suite's preference called `name`; ValueError lists the names."""
    for entry in SUITE:
        if entry.name == name:
            return entry
    raise ValueError(f"no preference {name!r} in the suite; choose from {', '.join(e.name for e in SUITE)}")


if __name__ == "__main__":  # python -m online_rl.simulate.suite [ANSWERS]: measure the base rates again
    from online_rl.simulate.learning import measure_base_rates

    measure_base_rates(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
