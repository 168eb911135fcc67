"""Base models: the embedded default (prepared from a GGUF shipped on PyPI) and a tiny test model."""

from online_rl.models.chat import user_turn_ids
from online_rl.models.embedded import (
    CHECK_EXPECTED,
    CHECK_PROMPT,
    EMBEDDED_MODEL_ID,
    PreparedModel,
    greedy_chat,
    locate_gguf,
    prepare_embedded_model,
    validate_model_dir,
)
from online_rl.models.tiny import build_tiny_llama

__all__ = [
    "CHECK_EXPECTED",
    "CHECK_PROMPT",
    "EMBEDDED_MODEL_ID",
    "PreparedModel",
    "build_tiny_llama",
    "greedy_chat",
    "locate_gguf",
    "prepare_embedded_model",
    "user_turn_ids",
    "validate_model_dir",
]
