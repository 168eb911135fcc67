"""Request and response bodies of the OpenAI-compatible API (the subset this server implements).

Fields the server does not implement are refused by name rather than silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from online_rl.events import Message

__all__ = [
    "AdapterIn",
    "AliasIn",
    "ChatMessageIn",
    "ChatRequest",
    "CompletionRequest",
    "StreamOptions",
]

_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
UserId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@/+=-]+$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessageIn(_Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[TextPart] = Field(description="Text, or a list of text parts.")

    @field_validator("content")
    @classmethod
    def _not_huge(cls, value: str | list[TextPart]) -> str | list[TextPart]:
        size = len(value) if isinstance(value, str) else sum(len(p.text) for p in value)
        if size > 200_000:
            raise ValueError("a message holds at most 200,000 characters; shorten it")
        return value
    name: str | None = None

    def to_message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return Message(role=role, content=text)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str = Field(min_length=1, description="Base model id, adapter version, or alias (GET /v1/models).")
    max_tokens: int | None = Field(default=None, ge=1, description="Most tokens to generate.")
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    n: Literal[1] = Field(default=1, description="Only one choice per request is supported.")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: UserId | None = Field(default=None, description="Pseudonymous user id, recorded for training.")
    metadata: dict[str, str] | None = Field(
        default=None, description="Free-form tags; `session_id` is recorded with the interaction."
    )

    @field_validator("metadata")
    @classmethod
    def _small(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        too_big = value is not None and (
            len(value) > 16 or any(len(k) > 64 or len(v) > 512 for k, v in value.items()))
        if too_big:
            raise ValueError("metadata takes at most 16 keys of <= 64 characters with values of <= 512")
        session = (value or {}).get("session_id")
        if session is not None and not _ID.fullmatch(session):
            raise ValueError("metadata.session_id must be 1-128 letters, digits or ._:@/+=- characters")
        return value


class ChatRequest(_Sampling):
    """POST /v1/chat/completions."""

    messages: list[ChatMessageIn] = Field(min_length=1, max_length=1024)
    max_completion_tokens: int | None = Field(default=None, ge=1, description="Same as max_tokens.")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "model": "SmolLM2-135M-Instruct",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32, "temperature": 0.7, "user": "user-42"}]})


class CompletionRequest(_Sampling):
    """POST /v1/completions."""

    prompt: str = Field(min_length=1, max_length=200_000)
    max_tokens: int | None = Field(default=16, ge=1)


class AdapterIn(_Strict):
    """POST /admin/adapters: load an adapter version."""

    source: str = Field(min_length=1, description="A local adapter folder or models:/<name>/<version> "
                        "(or models:/<name>@<alias>).")
    name: str | None = Field(default=None, description="Version name for a local folder; an MLflow "
                             "version is always served as <registered-name>-v<version>.")
    alias: str | None = Field(default=None, description="Point this alias at the version once loaded.")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"source": "models:/online-rl-policy/3", "alias": "online-rl-policy"}]})


class AliasIn(_Strict):
    """PUT /admin/aliases/{alias}."""

    version: str = Field(min_length=1, description="A loaded version name.")


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
