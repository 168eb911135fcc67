"""Request and response bodies of the feedback API (their docstrings become the OpenAPI text)."""

from __future__ import annotations

import time

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from online_rl.events import Feedback

__all__ = ["Accepted", "BatchAccepted", "ErrorBody", "ErrorDetail", "FeedbackBatchIn", "FeedbackIn"]

_EXAMPLES: list[JsonValue] = [
    {"event_id": "3f1c9a2e-thumbs", "request_id": "chatcmpl-7f3a", "user_id": "user-42",
     "kind": "thumbs", "value": 1},
    {"event_id": "3f1c9a2e-rating", "request_id": "chatcmpl-7f3a", "user_id": "user-42",
     "kind": "rating", "value": 4, "scale": [1, 5], "comment": "good but long"},
    {"event_id": "3f1c9a2e-pref", "request_id": "chatcmpl-7f3a", "user_id": "user-42",
     "kind": "preference", "other_request_id": "chatcmpl-9b21", "winner": "other"},
    {"event_id": "3f1c9a2e-copied", "request_id": "chatcmpl-7f3a", "user_id": "user-42",
     "kind": "implicit", "signal": "copied"},
]


class FeedbackIn(Feedback):
    """One feedback event. `event_id` is chosen by the client and makes retries safe; `created_at`
    defaults to the moment the API receives the event."""

    model_config = ConfigDict(json_schema_extra={"examples": _EXAMPLES})
    created_at: float = Field(default_factory=time.time, ge=0, allow_inf_nan=False,
                              description="Unix time of the judgement.")


class FeedbackBatchIn(BaseModel):
    """Several feedback events in one request (at most the configured maximum)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"events": _EXAMPLES[:2]}]})
    events: list[FeedbackIn] = Field(min_length=1)


class Accepted(BaseModel):
    """The event is durably on the bus (or was already: `duplicate`)."""

    event_id: str
    request_id: str
    duplicate: bool = False


class BatchAccepted(BaseModel):
    """Every event of the batch is durably on the bus."""

    accepted: int = Field(description="Events written now.")
    duplicates: int = Field(description="Events already written earlier (same event_id), not written again.")
    event_ids: list[str]


class ErrorDetail(BaseModel):
    field: str
    message: str
    fix: str


class ErrorBody(BaseModel):
    """Every error answer has this shape."""

    type: str
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)
