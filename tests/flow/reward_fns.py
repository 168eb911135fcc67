"""Reward functions the flow's tests load by target (`tests.flow.reward_fns:<name>`).

They run in the reward actor, a Ray worker process, which imports `tests` because Ray starts its
workers in the driver's working folder and puts it on their path: run pytest from the repository root.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from typing import Any

NOT_CALLABLE = 3


def has_answer(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    return 1.0 if re.search(r"<answer>.+</answer>", completion) else 0.0


def lengths(prompts: list[str], completions: list[str], metas: list[dict[str, Any]]) -> list[float]:
    return [float(len(c)) for c in completions]


Meta = dict[str, Any]


async def async_lengths(prompts: list[str], completions: list[str], metas: list[Meta]) -> list[float]:
    await asyncio.sleep(0.01)
    return [float(len(c)) + m.get("bonus", 0.0) for c, m in zip(completions, metas, strict=True)]


async def async_echo_bonus(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    await asyncio.sleep(0.01)
    return float(meta["bonus"])


def fails_on_bad(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    if "bad" in completion:
        raise ValueError(f"cannot judge {completion!r}")
    return 1.0


def batched_fails_on_bad(prompts: list[str], completions: list[str], metas: list[Meta]) -> list[float]:
    if any("bad" in c for c in completions):
        raise ValueError("a bad row in the batch")
    return [2.0 for _ in completions]


def hangs_on_slow(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    if "slow" in completion:
        time.sleep(1000)
    return 1.0


def crashes_on_crash(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    if "crash" in completion:
        os._exit(3)  # the worker process dies, as a segfault in a native library would kill it
    return 1.0


def pid(prompt: str, completion: str, meta: dict[str, Any]) -> float:
    return float(os.getpid())


def junk(prompt: str, completion: str, meta: dict[str, Any]) -> Any:
    return {"nan": float("nan"), "inf": float("inf"), "str": "high", "none": None}.get(completion, 0.5)


def one_score(prompts: list[str], completions: list[str], metas: list[dict[str, Any]]) -> list[float]:
    return [1.0]
