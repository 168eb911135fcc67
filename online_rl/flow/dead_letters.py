"""Reward functions' failures on the dead-letter topic: each row a function could not score, as the
rollout it was (prompt, completion, meta) with the function's name and why, for an operator to inspect
or replay. Formats and sends; knows nothing about how the scores were made."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from online_rl.flow.functions import RewardScores

if TYPE_CHECKING:
    from online_rl.bus.dlq import DeadLetters

__all__ = ["dead_letter_failures"]

_MAX_TEXT = 100_000  # characters kept of a prompt or a completion: a dead letter stays under Kafka's 1 MB


def dead_letter_failures(dead: DeadLetters, scores: RewardScores, prompts: Sequence[str],
                         completions: Sequence[str], metas: Sequence[Mapping[str, Any]] | None = None) -> int:
    """Send each of `scores.failures` to the dead-letter topic as a JSON record keyed by the function's
    name: {"kind": "reward_function_failure", "function", "reason", "row", "prompt", "completion",
    "meta"}. The rows are those `scores` was made from. Returns how many were sent; they are confirmed on
    `dead.flush()`."""
    for failure in scores.failures:
        row = failure.row
        dead.send_json({"kind": "reward_function_failure", "function": failure.name, "reason": failure.reason,
                        "row": row, "prompt": _clip(prompts[row]), "completion": _clip(completions[row]),
                        "meta": dict(metas[row]) if metas is not None else {}},
                       f"reward function {failure.name!r} {failure.reason}", key=failure.name.encode())
    return len(scores.failures)


def _clip(text: str) -> str:
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT] + f"... [{len(text) - _MAX_TEXT} more]"
