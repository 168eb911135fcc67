"""Serving: generation engines, adapter versions, streamed text and interaction logging."""

from online_rl.serving.adapters import AdapterInfo, AdapterManager
from online_rl.serving.core import Chunk, InferenceCore, Prepared, new_request_id
from online_rl.serving.engine import Engine, GenerationRequest, TokenDelta
from online_rl.serving.errors import (
    AdapterLoadError,
    AdapterUnavailable,
    EngineError,
    PromptTooLong,
    UnknownModel,
    VersionConflict,
)
from online_rl.serving.factory import build_engine, choose_engine
from online_rl.serving.interaction_log import InteractionLogger, LogStats
from online_rl.serving.text import IncrementalText

__all__ = [
    "AdapterInfo",
    "AdapterLoadError",
    "AdapterManager",
    "AdapterUnavailable",
    "Chunk",
    "Engine",
    "EngineError",
    "GenerationRequest",
    "IncrementalText",
    "InferenceCore",
    "InteractionLogger",
    "LogStats",
    "Prepared",
    "PromptTooLong",
    "TokenDelta",
    "UnknownModel",
    "VersionConflict",
    "build_engine",
    "choose_engine",
    "new_request_id",
]
