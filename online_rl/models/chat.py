"""The one way a single user message becomes prompt token ids for the assistant's answer."""

from __future__ import annotations

from typing import Any

__all__ = ["user_turn_ids"]


def user_turn_ids(tokenizer: Any, prompt: str) -> list[int]:
    """`prompt` as the user's turn in the model's chat template, ready for the assistant's answer.
    The template writes its own special tokens, so the tokenizer adds none (a second BOS otherwise)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False).input_ids)
