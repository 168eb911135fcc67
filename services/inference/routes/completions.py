"""POST /v1/chat/completions and /v1/completions, with `stream: true` over server-sent events.

Every answer carries its `request_id` (body field, and the `X-Request-Id` header) for feedback,
and names in `model` the version that produced it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, StreamingResponse

from online_rl.events import SamplingParams
from online_rl.ingest import Forbidden, KeyInfo
from online_rl.serving import Chunk, EngineError, Prepared, UnknownModel
from services.common.errors import ApiError, openai_body
from services.inference.deps import CallerDep, ServiceDep
from services.inference.schemas import ChatRequest, CompletionRequest, usage
from services.inference.service import InferenceService

__all__ = ["router"]

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["completions"])
_ANONYMOUS = "anonymous"


def _prepare(service: InferenceService, body: ChatRequest | CompletionRequest, caller: KeyInfo) -> Prepared:
    config = service.settings.inference
    max_tokens = body.max_tokens
    if isinstance(body, ChatRequest) and body.max_completion_tokens is not None:
        max_tokens = body.max_completion_tokens
    sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p,
                              max_tokens=max_tokens or config.max_tokens_default, seed=body.seed)
    session = (body.metadata or {}).get("session_id")
    try:  # the interaction is recorded for the key's own user when the key is bound to one
        user = caller.user_for(body.user) or _ANONYMOUS
    except Forbidden as exc:
        raise ApiError(403, "permission_error", f"{exc}; leave `user` out (the key's own user is "
                       "used) or send that user's key", field="user", code="user_mismatch") from exc
    common: dict[str, Any] = {"model": body.model, "sampling": sampling, "user_id": user,
                              "session_id": session, "max_tokens_unset": max_tokens is None}
    if isinstance(body, ChatRequest):
        return service.core.prepare(messages=[m.to_message() for m in body.messages], **common)
    return service.core.prepare(prompt=body.prompt, **common)


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, service: ServiceDep, caller: CallerDep) -> Any:
    """Answer a chat. `model` is the base model id, an adapter version, or an alias."""
    return await _answer(service, body, caller, chat=True)


@router.post("/completions")
async def completions(body: CompletionRequest, service: ServiceDep, caller: CallerDep) -> Any:
    """Continue a raw text prompt (no chat template)."""
    return await _answer(service, body, caller, chat=False)


async def _answer(service: InferenceService, body: ChatRequest | CompletionRequest, caller: KeyInfo,
                  chat: bool) -> Any:
    prep = _prepare(service, body, caller)
    if body.stream:
        usage_too = bool(body.stream_options and body.stream_options.include_usage)
        return _stream(service, prep, chat=chat, include_usage=usage_too)
    return await _complete(service, prep, chat=chat)


def _headers(prep: Prepared) -> dict[str, str]:
    return {"X-Request-Id": prep.request_id}


async def _complete(service: InferenceService, prep: Prepared, chat: bool) -> JSONResponse:
    started = time.perf_counter()
    parts: list[str] = []
    last = Chunk("")
    version: str | None = None
    first: float | None = None
    try:
        async with contextlib.aclosing(service.core.stream(prep, incremental=False)) as chunks:
            async for served_by, chunk in chunks:
                version = served_by
                first = first or time.perf_counter()
                parts.append(chunk.text)
                last = chunk
    except EngineError:
        service.metrics.requests.labels(version or "base", "error").inc()
        raise
    served = version or service.core.base_model
    _observe(service, served, started, first, last.completion_tokens)
    text = "".join(parts)
    choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    body = {"id": prep.request_id, "request_id": prep.request_id,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(prep.created_at), "model": served, "choices": [choice],
            "usage": usage(last.prompt_tokens, last.completion_tokens)}
    return JSONResponse(body, headers=_headers(prep) | {"X-Model-Version": served})


def _stream(service: InferenceService, prep: Prepared, chat: bool, include_usage: bool) -> StreamingResponse:
    kind = "chat.completion.chunk" if chat else "text_completion"
    base = service.core.base_model

    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def frame(served: str, text: str | None, finish: str | None, role: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["delta"] = ({"role": "assistant", "content": text or ""} if role
                               else ({"content": text} if text else {}))
        else:
            choice["text"] = text or ""
        return event({"id": prep.request_id, "request_id": prep.request_id, "object": kind,
                      "created": int(prep.created_at), "model": served, "choices": [choice]})

    async def body() -> AsyncIterator[bytes]:
        started, first = time.perf_counter(), None
        served, sent_role, last = base, False, Chunk("")
        try:
            async with contextlib.aclosing(service.core.stream(prep)) as chunks:
                async for version, chunk in chunks:
                    served = version or base
                    if chat and not sent_role:
                        yield frame(served, "", None, role=True)
                        sent_role = True
                    first = first or time.perf_counter()
                    last = chunk
                    if chunk.text or chunk.finish_reason:
                        yield frame(served, chunk.text, chunk.finish_reason)
        except Exception as exc:  # headers are sent: report the error in the stream
            service.metrics.requests.labels(served, "error").inc()
            error_kind = "engine_error" if isinstance(exc, EngineError) else "server_error"
            if isinstance(exc, UnknownModel):
                error_kind = "invalid_request_error"
            else:
                logger.warning("stream %s failed: %s", prep.request_id, exc)
            # The 200 went with the headers: only the body says what failed.
            yield event(openai_body(ApiError(500, error_kind, f"generation failed: {exc}")))
            yield b"data: [DONE]\n\n"
            return
        _observe(service, served, started, first, last.completion_tokens)
        if include_usage:
            yield event({"id": prep.request_id, "request_id": prep.request_id, "object": kind,
                         "created": int(prep.created_at), "model": served, "choices": [],
                         "usage": usage(last.prompt_tokens, last.completion_tokens)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(body(), media_type="text/event-stream",
                             headers=_headers(prep) | {"Cache-Control": "no-cache"})


def _observe(service: InferenceService, version: str, started: float, first: float | None,
             tokens: int) -> None:
    metrics = service.metrics
    metrics.requests.labels(version, "ok").inc()
    metrics.tokens.labels(version).inc(tokens)
    metrics.latency.labels(version).observe(time.perf_counter() - started)
    if first is not None:
        metrics.first_token.observe(first - started)
