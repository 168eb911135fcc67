"""The events that flow through the bus: `Interaction`, `Feedback` and `TrainingSample`.

Each is a validated pydantic model with a `schema_version`. On the wire a record is one format
byte followed by MessagePack (compact, fast, and keeps token ids and log-probabilities as numbers).
`decode_*` raise `UnsupportedSchemaVersion` for a record written by a newer producer and
`MalformedRecord` for anything else that is not a valid event, so a consumer can send it to the
dead-letter topic and carry on.

This module knows nothing about Kafka, the join or training.
"""

from __future__ import annotations

import math
import sys
from array import array
from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from online_rl.errors import DecodeError, MalformedRecord, UnsupportedSchemaVersion  # exported here too

__all__ = [
    "SCHEMA_VERSION",
    "Completion",
    "DecodeError",
    "Feedback",
    "FeedbackKind",
    "Interaction",
    "MalformedRecord",
    "Message",
    "SamplingParams",
    "TrainingSample",
    "UnsupportedSchemaVersion",
    "decode",
    "encode",
]

SCHEMA_VERSION = 1
_WIRE_FORMAT = b"\x01"  # msgpack envelope, version 1
_BIG_ENDIAN = sys.byteorder == "big"
Id = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:@/+=-]+$")]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]  # the model's vocabulary is checked where it is known
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_version: int = Field(default=SCHEMA_VERSION, ge=1)


class Message(BaseModel):
    """One chat message of a prompt."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=200_000)


class SamplingParams(BaseModel):
    """The sampling parameters a completion was generated with."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=256, ge=1, le=131_072)
    seed: int | None = None


def _logprobs(values: list[float]) -> list[float]:
    """Round log-probabilities to float32, the precision they travel in, and check them there (a value
    below float32's range would become -inf on the way)."""
    try:
        rounded = array("f", values).tolist()
    except OverflowError as exc:
        raise ValueError("log-probabilities must be finite numbers <= 0 within float32's range") from exc
    for value in rounded:
        if not math.isfinite(value) or value > 0.0:
            raise ValueError("log-probabilities must be finite numbers <= 0 within float32's range")
    return rounded


class Interaction(_Event):
    """One served completion, with what the trainer needs to learn from it."""

    request_id: Id
    user_id: Id
    session_id: Id | None = None
    created_at: Seconds = Field(description="Unix time (seconds) when the request arrived.")
    model: str = Field(min_length=1, max_length=256, description="Base model id.")
    adapter_version: str | None = Field(
        default=None, max_length=256, description="Immutable serving name of the adapter; None = base."
    )
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    prompt: list[Message] = Field(min_length=1, max_length=1024)
    prompt_token_ids: list[TokenId] = Field(min_length=1)
    completion: str
    completion_token_ids: list[TokenId]
    completion_logprobs: list[float] = Field(
        description="The behaviour policy's log-probability of each sampled completion token."
    )
    finish_reason: str = Field(default="stop", max_length=32)
    latency_ms: float = Field(default=0.0, ge=0, allow_inf_nan=False)

    _check_logprobs = field_validator("completion_logprobs")(_logprobs)

    @model_validator(mode="after")
    def _lengths_match(self) -> Interaction:
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"completion_logprobs has {len(self.completion_logprobs)} values but "
                f"completion_token_ids has {len(self.completion_token_ids)}; send one log-probability "
                "per completion token"
            )
        return self


class FeedbackKind(StrEnum):
    thumbs = "thumbs"
    rating = "rating"
    scalar = "scalar"
    preference = "preference"
    implicit = "implicit"


class Feedback(_Event):
    """A user's judgement of one served response (or of two, for a preference)."""

    event_id: Id = Field(description="Client-chosen idempotency key: a retry repeats it.")
    request_id: Id
    user_id: Id
    created_at: Seconds
    kind: FeedbackKind
    value: float | None = Field(
        default=None,
        description="thumbs: 1 (up) or -1 (down); rating: a value on `scale`; scalar: the reward; "
        "implicit: the signal's measurement (e.g. dwell seconds); preference: unused.",
    )
    scale: tuple[float, float] | None = Field(default=None, description="rating: (min, max).")
    signal: str | None = Field(default=None, max_length=64, description="implicit: the signal name.")
    other_request_id: Id | None = Field(default=None, description="preference: the other response.")
    winner: Literal["this", "other"] | None = Field(default=None, description="preference: which won.")
    comment: str | None = Field(default=None, max_length=8_000)
    corrected_completion: str | None = Field(default=None, max_length=200_000)

    @model_validator(mode="after")
    def _kind_fields(self) -> Feedback:
        kind, value = self.kind, self.value
        if value is not None and not math.isfinite(value):
            raise ValueError("value must be a finite number")
        if kind is FeedbackKind.thumbs and value not in (1.0, -1.0):
            raise ValueError("thumbs feedback needs value 1 (up) or -1 (down)")
        if kind is FeedbackKind.rating:
            if self.scale is None or value is None:
                raise ValueError("rating feedback needs value and scale, e.g. value=4, scale=[1, 5]")
            low, high = self.scale
            if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(high - low)):
                raise ValueError(f"rating scale [{low}, {high}] must be two finite numbers, e.g. [1, 5]")
            if not low < high or not low <= value <= high:
                raise ValueError(f"rating value {value} must lie on its scale [{low}, {high}] (min < max)")
        if kind is FeedbackKind.scalar and value is None:
            raise ValueError("scalar feedback needs a value (the reward)")
        if kind is FeedbackKind.implicit and not self.signal:
            raise ValueError("implicit feedback needs a signal name, e.g. 'copied' or 'dwell_time'")
        if kind is FeedbackKind.preference:
            if self.other_request_id is None or self.winner is None:
                raise ValueError("preference feedback needs other_request_id and winner ('this' or 'other')")
            if self.other_request_id == self.request_id:
                raise ValueError("preference feedback must compare two different request ids")
        return self


class Completion(BaseModel):
    """One completion inside a training sample."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    request_id: Id
    text: str
    token_ids: list[TokenId]
    logprobs: list[float]
    adapter_version: str | None = None
    finish_reason: str = "stop"

    _check_logprobs = field_validator("logprobs")(_logprobs)


class TrainingSample(_Event):
    """A joined record: one completion with its reward, or a chosen/rejected pair."""

    sample_id: Id = Field(description="Deterministic id: the same join result always has the same id.")
    kind: Literal["single", "pair"]
    model: str
    user_id: Id
    prompt: list[Message]
    prompt_token_ids: list[TokenId]
    completion: Completion | None = None
    reward: float | None = Field(default=None, allow_inf_nan=False)
    feedback_kind: FeedbackKind | None = None
    label: bool | None = Field(default=None, description="Desirable (True) or not, for KTO.")
    defaulted: bool = Field(default=False, description="The reward is the default: no feedback came.")
    chosen: Completion | None = None
    rejected: Completion | None = None
    reward_mapping_version: str
    behaviour_versions: list[str | None]
    feedback_event_ids: list[str] = Field(default_factory=list)
    created_at: Seconds

    @model_validator(mode="after")
    def _shape(self) -> TrainingSample:
        if self.kind == "single" and (self.completion is None or self.reward is None):
            raise ValueError("a single sample needs completion and reward")
        if self.kind == "pair" and (self.chosen is None or self.rejected is None):
            raise ValueError("a pair sample needs chosen and rejected")
        return self


_TYPES: dict[str, type[_Event]] = {
    "interaction": Interaction,
    "feedback": Feedback,
    "sample": TrainingSample,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}
E = TypeVar("E", bound=_Event)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)


def _pack_floats(body: dict[str, Any], pack: bool) -> None:
    """Log-probabilities travel as little-endian float32 bytes: 4 bytes each instead of 9."""
    for key, value in body.items():
        if key.endswith("logprobs"):
            if pack and isinstance(value, list):
                floats = array("f", value)
                if _BIG_ENDIAN:
                    floats.byteswap()
                body[key] = floats.tobytes()
            elif not pack and isinstance(value, bytes):
                floats = array("f")
                floats.frombytes(value)
                if _BIG_ENDIAN:
                    floats.byteswap()
                body[key] = floats.tolist()
        elif isinstance(value, dict):
            _pack_floats(value, pack)


def encode(event: _Event) -> bytes:
    """The wire bytes of an event."""
    body: dict[str, Any] = event.model_dump(mode="json", exclude_none=True)
    body["type"] = next(_NAMES[cls] for cls in type(event).__mro__ if cls in _NAMES)
    _pack_floats(body, pack=True)
    return _WIRE_FORMAT + _encoder.encode(body)


def decode(data: bytes, expected: type[E]) -> E:
    """Decode wire bytes into an event of type `expected`, or raise a `DecodeError`: whatever the bytes,
    nothing else (a consumer dead-letters a `DecodeError` and moves on)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedRecord(f"a record value must be bytes, not {type(data).__name__}")
    data = bytes(data)
    if not data or data[:1] != _WIRE_FORMAT:
        raise MalformedRecord(f"unknown wire format byte {data[:1]!r} (expected {_WIRE_FORMAT!r})")
    try:
        body = _decoder.decode(data[1:])
    except (msgspec.DecodeError, RecursionError, MemoryError, ValueError, TypeError) as exc:
        raise MalformedRecord(f"not MessagePack: {exc}") from exc
    if not isinstance(body, dict):
        raise MalformedRecord(f"a record must be a map of fields, not a {type(body).__name__}")
    if not all(isinstance(key, str) for key in body):
        key = next(k for k in body if not isinstance(k, str))
        raise MalformedRecord(f"field names must be strings, not {type(key).__name__} {str(key)[:40]!r}")
    kind = body.pop("type", None)
    if not isinstance(kind, str) or _TYPES.get(kind) is not expected:
        raise MalformedRecord(f"record type {str(kind)[:80]!r} is not {_NAMES[expected]!r}")
    version = body.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise UnsupportedSchemaVersion(
            f"{_NAMES[expected]} schema_version {version} is newer than this code ({SCHEMA_VERSION}); "
            "upgrade online-rl"
        )
    try:
        _pack_floats(body, pack=False)
        return expected.model_validate(body)
    except (ValidationError, ValueError, TypeError, AttributeError, KeyError, OverflowError,
            RecursionError) as exc:
        if not isinstance(exc, ValidationError):
            problem = f"{type(exc).__name__}: {str(exc)[:200]}"
            raise MalformedRecord(f"invalid {_NAMES[expected]}: {problem}") from exc
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(record)"
        raise MalformedRecord(f"invalid {_NAMES[expected]}: {field}: {first['msg']}") from exc
