"""One completion from prompt to logged interaction, independent of HTTP.

`InferenceCore` tokenizes a chat or a raw prompt, checks its length, leases the adapter version
that serves the requested model, streams the engine's tokens as text and, once the completion is
finished, hands an `Interaction` (token ids, the policy's per-token log-probabilities, sampling
parameters, version) to the interaction logger, and holds the answer's last chunk until the bus has
confirmed it (at most `log_confirm_s`; not while the bus is away). The service layer only maps HTTP
to these calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from online_rl.events import Interaction, Message, SamplingParams
from online_rl.serving.adapters import AdapterManager
from online_rl.serving.engine import Engine, GenerationRequest
from online_rl.serving.errors import PromptTooLong
from online_rl.serving.interaction_log import InteractionLogger
from online_rl.serving.text import IncrementalText

__all__ = ["Chunk", "InferenceCore", "new_request_id"]

logger = logging.getLogger(__name__)


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex}"


@dataclass
class Chunk:
    """Text produced since the previous chunk; the last one has `finish_reason` and the totals."""

    text: str
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class Prepared:
    """A validated request, ready to stream."""

    request_id: str
    user_id: str
    session_id: str | None
    model: str  # what the client asked for (base, version or alias)
    messages: list[Message]
    prompt_token_ids: list[int]
    sampling: SamplingParams
    created_at: float = field(default_factory=time.time)


class InferenceCore:
    """Tokenize, generate on a leased version, detokenize, log."""

    def __init__(self, engine: Engine, adapters: AdapterManager, tokenizer: Any,
                 log: InteractionLogger | None, log_confirm_s: float = 0.0) -> None:
        self.engine = engine
        self.adapters = adapters
        self.tokenizer = tokenizer
        self.log = log
        self.log_confirm_s = log_confirm_s
        self.unconfirmed = 0  # answers sent before the bus confirmed their record (the bus was away)
        self._confirm_paused_until = 0.0

    @property
    def base_model(self) -> str:
        return self.adapters.base_model

    def prepare(self, *, model: str, sampling: SamplingParams, user_id: str, session_id: str | None,
                messages: list[Message] | None = None, prompt: str | None = None,
                request_id: str | None = None, max_tokens_unset: bool = False) -> Prepared:
        """Tokenize a chat (`messages`, with the chat template) or a raw `prompt`; check lengths."""
        self.adapters.resolve(model)  # unknown models fail before any work
        if messages is not None:
            rendered = self.tokenizer.apply_chat_template(
                [m.model_dump() for m in messages], add_generation_prompt=True, tokenize=True)
            ids = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
            field_name = "messages"
        else:
            assert prompt is not None
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=False))
            messages = [Message(role="user", content=prompt)]
            field_name = "prompt"
        if not ids:
            raise PromptTooLong(f"the {field_name} is empty after tokenization; send some text", field_name)
        limit = self.engine.max_model_len
        if len(ids) >= limit:
            raise PromptTooLong(f"the {field_name} has {len(ids)} tokens; this model takes at most "
                                f"{limit - 1} (inference.max_model_len)", field_name)
        if max_tokens_unset:  # like OpenAI: without max_tokens, up to what the context allows
            sampling = sampling.model_copy(update={"max_tokens": min(sampling.max_tokens, limit - len(ids))})
        if len(ids) + sampling.max_tokens > limit:
            raise PromptTooLong(f"{len(ids)} prompt tokens + max_tokens {sampling.max_tokens} exceed the "
                                f"context of {limit} tokens; lower max_tokens to at most "
                                f"{limit - len(ids)}", "max_tokens")
        return Prepared(request_id or new_request_id(), user_id, session_id, model, messages, ids, sampling)

    async def stream(self, prep: Prepared, incremental: bool = True
                     ) -> AsyncGenerator[tuple[str | None, Chunk], None]:
        """Yield (version, chunk) pairs; the version (None = base) is fixed for the whole request.
        Without `incremental` the text comes in one chunk at the end (no per-token decoding).
        The interaction is logged when the completion finishes."""
        started = time.perf_counter()
        with self.adapters.lease(prep.model) as version:
            request = GenerationRequest(prep.request_id, prep.prompt_token_ids, prep.sampling, version)
            text = IncrementalText(self.tokenizer) if incremental else None
            token_ids: list[int] = []
            logprobs: list[float] = []
            async with contextlib.aclosing(self.engine.generate(request)) as deltas:
                async for delta in deltas:
                    token_ids += delta.token_ids
                    logprobs += delta.logprobs
                    if delta.finish_reason is None:
                        piece = text.push(delta.token_ids) if text is not None else ""
                        if piece:
                            yield version, Chunk(piece)
                        continue
                    completion = str(self.tokenizer.decode(token_ids, skip_special_tokens=True))
                    piece = text.push(delta.token_ids) + text.flush() if text is not None else completion
                    # The record before the answer's last bytes: a process killed after a client has
                    # its answer has logged it (the wait is skipped while the bus is away).
                    await self._record(prep, version, completion, token_ids, logprobs, delta.finish_reason,
                                       started)
                    yield version, Chunk(piece, delta.finish_reason, len(prep.prompt_token_ids),
                                         len(token_ids))
                    return

    async def _record(self, prep: Prepared, version: str | None, completion: str, token_ids: list[int],
                      logprobs: list[float], finish_reason: str, started: float) -> None:
        if self.log is None:
            return
        try:
            interaction = Interaction(
            request_id=prep.request_id, user_id=prep.user_id, session_id=prep.session_id,
            created_at=prep.created_at, model=self.base_model, adapter_version=version,
            sampling=prep.sampling, prompt=prep.messages, prompt_token_ids=prep.prompt_token_ids,
            completion=completion, completion_token_ids=token_ids,
            completion_logprobs=[max(v, -1e30) for v in logprobs], finish_reason=finish_reason,
            latency_ms=(time.perf_counter() - started) * 1000.0,
            )
        except ValueError:  # the answer was served; never fail it for its log record
            logger.exception("interaction %s could not be recorded", prep.request_id)
            self.log.stats.dropped += 1
            return
        if self.log_confirm_s <= 0:
            self.log.log(interaction)
            return
        if not self.log.healthy or time.monotonic() < self._confirm_paused_until:
            self.unconfirmed += self.log.log(interaction)  # answered at once: the bus is away or slow
            return
        loop = asyncio.get_running_loop()
        confirmed = loop.create_future()

        def settle() -> None:
            if not confirmed.done():  # (a wait that timed out cancelled it)
                confirmed.set_result(None)

        def on_logged() -> None:  # from the writer thread
            loop.call_soon_threadsafe(settle)

        if not self.log.log(interaction, on_logged):
            return  # dropped: the buffer is full (counted there)
        try:
            await asyncio.wait_for(confirmed, self.log_confirm_s)
        except TimeoutError:  # the bus is slow or going away: answer the next ones at once for a while
            self._confirm_paused_until = time.monotonic() + 10 * self.log_confirm_s
            self.unconfirmed += 1
