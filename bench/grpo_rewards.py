"""The reward function `bench/grpo.py` teaches with (loaded by target: `bench.grpo_rewards:brief_on_topic`).

"Answers under N words that still contain the key word": the key word is the prompt's longest word (for
"What is the capital of France?", "capital"); an answer scores 1 when it holds that word in at most 8
words, falling linearly to 0 at 40 words, and 0 without the word however short it is. The base model
answers at length, so most of its answers score low: the gap is what GRPO has to close.
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
