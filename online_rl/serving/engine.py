"""The generation engine contract: what the inference service needs from vLLM or transformers.

An engine turns prompt token ids into sampled completion token ids with the log-probability the
policy gave each sampled token, streaming them as they come, for the base model or for one of
several resident LoRA adapters. It knows nothing about HTTP, chat templates, text or the bus:
the caller tokenizes, detokenizes and logs.

Log-probabilities are the policy's own (`log_softmax` of the raw logits, before temperature or
top-p), which is what a trainer recomputes with a forward pass of the same weights.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path

from online_rl.events import SamplingParams
from online_rl.serving.errors import AdapterLoadError

__all__ = ["Engine", "GenerationRequest", "TokenDelta", "check_room"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One prompt to complete. `adapter` is the engine-level adapter name, or None for the base."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    adapter: str | None = None


@dataclass(slots=True)
class TokenDelta:
    """Tokens sampled since the previous delta; the last delta has a `finish_reason`."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" (end of sequence) or "length" (max_tokens)


def check_room(name: str, loaded: list[str], limit: int) -> None:
    """Refuse a load whose name is taken or for which no adapter slot is free (both engines)."""
    if name in loaded:
        raise AdapterLoadError(f"an adapter named {name!r} is already loaded")
    if len(loaded) >= limit:
        raise AdapterLoadError(f"{len(loaded)} adapters are loaded, the most this engine holds "
                               "(inference.max_loras); unload one first")


class Engine(abc.ABC):
    """A generation engine with LoRA adapters resident beside the base model."""

    name: str  # "vllm" or "transformers"

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Finish starting inside the service's event loop (vLLM starts its engine core here)."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        """Stream the completion of `request`; cancelling the iteration aborts the request."""

    @abc.abstractmethod
    async def load_adapter(self, name: str, path: Path) -> None:
        """Make the PEFT LoRA adapter in `path` servable as `name`; raises `AdapterLoadError`."""

    @abc.abstractmethod
    async def unload_adapter(self, name: str) -> None:
        """Free `name`; the caller makes sure no request still uses it."""

    @abc.abstractmethod
    def adapters(self) -> list[str]:
        """Names of the resident adapters."""

    @property
    @abc.abstractmethod
    def max_model_len(self) -> int:
        """The longest prompt + completion the engine accepts, in tokens."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the engine and free its memory."""
