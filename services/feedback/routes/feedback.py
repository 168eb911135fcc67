"""POST /v1/feedback and /v1/feedback/batch."""

from __future__ import annotations

import json
import time

from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from online_rl.ingest import Forbidden, KeyInfo
from services.common.errors import ApiError
from services.feedback.deps import IngestDep, WriterKeyDep, require_writer
from services.feedback.schemas import Accepted, BatchAccepted, ErrorBody, FeedbackBatchIn, FeedbackIn
from services.feedback.service import FeedbackService

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["feedback"])

_ERRORS: dict[int | str, dict[str, object]] = {
    401: {"model": ErrorBody, "description": "Missing or unknown API key."},
    403: {"model": ErrorBody, "description": "The API key may not post feedback."},
    413: {"model": ErrorBody, "description": "The body is larger than the configured limit."},
    422: {"model": ErrorBody, "description": "Invalid body; `details` names each field and the fix."},
    429: {"model": ErrorBody, "description": "Rate limit or per-user cap reached; see Retry-After."},
    503: {"model": ErrorBody, "description": "The bus did not confirm; retry after Retry-After."},
}


@router.post(
    "/feedback",
    status_code=202,
    response_model=Accepted,
    responses=_ERRORS,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/FeedbackIn"}}}}},
)
async def post_feedback(request: Request) -> Response:
    """Record one feedback event. Answers 202 only once the event is durably on the bus."""
    # The hot path, written out by hand: FastAPI's body and dependency machinery cost about 0.2 ms
    # per request here, ten times the validation itself. Same checks, same errors.
    service: FeedbackService = request.app.state.service
    headers = request.headers
    key = await require_writer(request, headers.get("authorization"), headers.get("x-api-key"))
    start = time.perf_counter()
    try:
        event = FeedbackIn.model_validate_json(await request.body())
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from exc
    _check_dated([event], service)
    _check_speaker([event], key)
    outcome = await service.accept([event], key)
    service.metrics.latency.labels("feedback").observe(time.perf_counter() - start)
    body = {"event_id": event.event_id, "request_id": event.request_id, "duplicate": bool(outcome.duplicates)}
    return Response(json.dumps(body), status_code=202, media_type="application/json")


@router.post("/feedback/batch", status_code=202, response_model=BatchAccepted, responses=_ERRORS)
async def post_feedback_batch(batch: FeedbackBatchIn, key: WriterKeyDep, service: IngestDep) -> BatchAccepted:
    """Record several feedback events at once; all or none are written."""
    limit = service.settings.feedback_api.max_batch
    if len(batch.events) > limit:
        raise ApiError(422, "validation_error", f"events: {len(batch.events)} events in one batch",
                       fix=f"send at most {limit} events per batch")
    _check_dated(batch.events, service, "events.{}.")
    _check_speaker(batch.events, key, "events.{}.")
    start = time.perf_counter()
    outcome = await service.accept(batch.events, key)
    service.metrics.latency.labels("batch").observe(time.perf_counter() - start)
    return BatchAccepted(accepted=len(outcome.accepted), duplicates=len(outcome.duplicates),
                         event_ids=[e.event_id for e in batch.events])


def _check_speaker(events: list[FeedbackIn], key: KeyInfo, where: str = "") -> None:
    """A key bound to one user speaks only for that user (its `user_id` must be the key's)."""
    for number, event in enumerate(events):
        try:
            key.user_for(event.user_id)
        except Forbidden as exc:
            field = where.format(number) + "user_id"
            raise ApiError(403, "forbidden", f"{field}: {exc}",
                           fix=f"send user_id '{key.subject}' (the key's own user) or post with a key "
                               "made for this user (`online-rl keys new --user <id>`)", field=field) from exc


def _check_dated(events: list[FeedbackIn], service: FeedbackService, where: str = "") -> None:
    """Refuse a `created_at` the join could only misuse: ahead of the server's clock by more than
    `join.max_clock_skew_s`, or older than `join.retention_s` (the join has forgotten that answer)."""
    now, join = time.time(), service.settings.join
    kept = max(join.retention_s, join.window_s)  # what the joiner keeps (online-rl join)
    for number, event in enumerate(events):
        field = where.format(number) + "created_at"
        if event.created_at > now + join.max_clock_skew_s:
            raise ApiError(422, "validation_error",
                           f"{field}: {event.created_at:.0f} is {event.created_at - now:.0f} s ahead of the "
                           "server's clock",
                           fix=f"send the Unix time in seconds of the judgement (at most "
                               f"{join.max_clock_skew_s:g} s ahead: join.max_clock_skew_s), or leave "
                               "created_at out for now", field=field)
        if event.created_at < now - kept:
            raise ApiError(422, "validation_error",
                           f"{field}: {event.created_at:.0f} is {now - event.created_at:.0f} s old; the join "
                           f"keeps an answer {kept:g} s (join.retention_s), so it could never be trained on",
                           fix="send feedback within join.retention_s of the answer, in Unix seconds (not "
                               "milliseconds), or leave created_at out for now", field=field)
