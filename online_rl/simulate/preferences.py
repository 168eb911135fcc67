"""What simulated users like: preferences as plug-ins that score an answer from 0 (dislike) to 1.

A preference is any object with a `name` and `score(prompt, answer) -> float` in [0, 1]. Built in:
`phrase:<text>` (the answer contains the text), `length:<words>` (at most that many words; longer
answers lose credit linearly, none at twice the length), `format:<regex>` (the answer matches the
regular expression, multi-line), `suite:<name>` (a preference of the suite,
`online_rl.simulate.suite`: shorter, longer, you, enthusiastic, numbers, example, refuse, by-topic,
formal). Anything else is `module:attribute` — a Preference object, or a
class or function called with the text after a second colon (`my_pkg.prefs:Polite:strict`) — so a
new preference is written without touching the rest. Pure: no HTTP.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Format", "Length", "Phrase", "Preference", "load_preference"]


@runtime_checkable
class Preference(Protocol):
    @property
    def name(self) -> str:
        """What the preference is called (in reports and logs)."""
        ...

    def score(self, prompt: str, answer: str) -> float:
        """How much the user likes `answer` to `prompt`, from 0 to 1."""
        ...


@dataclass(frozen=True)
class Phrase:
    """Likes answers that contain `phrase` (case-insensitive)."""

    phrase: str

    @property
    def name(self) -> str:
        return f"phrase:{self.phrase}"

    def score(self, prompt: str, answer: str) -> float:
        return 1.0 if self.phrase.lower() in answer.lower() else 0.0


@dataclass(frozen=True)
class Length:
    """Likes answers of at most `max_words` words; credit falls linearly to 0 at twice that."""

    max_words: int

    def __post_init__(self) -> None:
        if self.max_words < 1:
            raise ValueError(f"length:{self.max_words}: the word limit must be at least 1, e.g. length:20")

    @property
    def name(self) -> str:
        return f"length:{self.max_words}"

    def score(self, prompt: str, answer: str) -> float:
        words = len(answer.split())
        return max(0.0, min(1.0, 2.0 - words / self.max_words))


@dataclass(frozen=True)
class Format:
    """Likes answers that match the regular expression `pattern` (re.MULTILINE)."""

    pattern: str

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"format:{self.pattern}: not a regular expression ({exc})") from exc

    @property
    def name(self) -> str:
        return f"format:{self.pattern}"

    def score(self, prompt: str, answer: str) -> float:
        return 1.0 if re.search(self.pattern, answer, re.MULTILINE) else 0.0


def _suite(name: str) -> Preference:
    from online_rl.simulate.suite import suite_entry

    preference: Preference = suite_entry(name).preference
    return preference


_BUILT_IN = {"phrase": Phrase, "length": lambda text: Length(int(text)), "format": Format, "suite": _suite}


def load_preference(spec: str) -> Preference:
    """The preference `spec` names (see the module docstring); ValueError says how to fix a bad one."""
    kind, _, argument = spec.partition(":")
    if kind in _BUILT_IN:
        if not argument:
            raise ValueError(f"preference {spec!r} needs an argument, e.g. phrase:Paris, length:20, "
                             "format:^- , suite:numbers")
        try:
            made = _BUILT_IN[kind](argument)
        except ValueError as exc:
            raise ValueError(f"preference {spec!r}: {exc}") from exc
        assert isinstance(made, Preference)
        return made
    attribute, _, argument = argument.partition(":")
    if not kind or not attribute:
        raise ValueError(f"preference {spec!r} is neither phrase:, length:, format:, suite: nor "
                         "module:attribute")
    try:
        target = getattr(importlib.import_module(kind), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"preference {spec!r}: cannot import {kind}:{attribute} ({exc})") from exc
    call = isinstance(target, type) or (callable(target) and not isinstance(target, Preference))
    made = target(argument) if call else target
    if not isinstance(made, Preference):
        raise ValueError(f"preference {spec!r} gave {type(made).__name__}, which has no name and "
                         "score(prompt, answer)")
    return made
