"""Reward functions the rollout flow's tests load by target (`tests.hybrid.reward_fns:<name>`); they run
in the reward functions' Ray actor, which imports `tests` from the repository root (run pytest there)."""

from __future__ import annotations

import time
from typing import Any


def brief(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """1 for an answer of at most 8 words, falling to 0 at 24: the users want it short."""
    words = len(completion.split())
    return max(0.0, min(1.0, (24 - words) / 16))


def raises_on_some_rows(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """A user's function with a bug: it raises on every third row."""
    if meta["row"] % 3 == 0:
        raise KeyError("expected_field")
    return 0.5


def hangs_once(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """A user's function that hangs on the first training step's last row (a stuck HTTP call)."""
    if meta.get("step") == 0 and meta["row"] == 7 and not meta.get("evaluation"):
        time.sleep(1000)
    return 1.0


def characters(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """The completion's length in characters / 100: varies even among a tiny random model's answers."""
    return len(completion) / 100


def repetitive(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """1 − distinct characters / characters: varies among a tiny random Llama's answers, so the pipeline
    tests' groups have advantages to train on (a random model learns nothing from it in a few steps)."""
    return 1.0 - len(set(completion)) / len(completion) if completion else 0.0


def alphanumeric(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """The share of the completion's characters that are ASCII letters or digits: what the tiny model
    that prefers single characters (online_rl/models/tiny.py) learns to do more of within ten steps."""
    return sum(c.isascii() and c.isalnum() for c in completion) / len(completion) if completion else 0.0


# tests/hybrid/test_rehearsal.py's rehearsal set
REHEARSED = ("What is the capital of France?", "What is the capital of Japan?")


def rehearsal_prompt(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    """1 when the prompt is one of the test's rehearsal prompts as its set writes it, else 0."""
    return float(prompt in REHEARSED)
