"""The feedback API against a real bus: what clients see, and what lands on the topic."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from online_rl.events import FeedbackKind
from tests.services.feedback.conftest import Api, serve, thumbs_body


def test_thumbs_is_accepted_and_on_the_topic(api: Api) -> None:
    body = thumbs_body("req-1", up=True)
    response = api.client.post("/v1/feedback", json=body, headers=api.auth())
    assert response.status_code == 202
    assert response.json() == {"event_id": body["event_id"], "request_id": "req-1", "duplicate": False}
    (event,) = api.feedback_on_bus()
    assert event.event_id == body["event_id"] and event.kind is FeedbackKind.thumbs and event.value == 1.0
    assert event.created_at > 0


def test_every_kind_is_accepted(api: Api) -> None:
    bodies = [
        thumbs_body("r1", up=False),
        {"event_id": "e-rating", "request_id": "r1", "user_id": "u1", "kind": "rating", "value": 4,
         "scale": [1, 5], "comment": "fine"},
        {"event_id": "e-scalar", "request_id": "r1", "user_id": "u1", "kind": "scalar", "value": 0.3},
        {"event_id": "e-pref", "request_id": "r1", "user_id": "u1", "kind": "preference",
         "other_request_id": "r2", "winner": "other"},
        {"event_id": "e-impl", "request_id": "r1", "user_id": "u1", "kind": "implicit", "signal": "copied",
         "corrected_completion": "Paris."},
    ]
    for body in bodies:
        response = api.client.post("/v1/feedback", json=body, headers=api.auth())
        assert response.status_code == 202, response.text
    assert sorted(e.kind.value for e in api.feedback_on_bus()) == sorted(b["kind"] for b in bodies)


def test_a_retry_is_acknowledged_and_written_once(api: Api) -> None:
    body = thumbs_body()
    first = api.client.post("/v1/feedback", json=body, headers=api.auth())
    again = api.client.post("/v1/feedback", json=body, headers=api.auth())
    assert first.status_code == again.status_code == 202
    assert again.json()["duplicate"] is True
    assert len(api.feedback_on_bus()) == 1


def test_batch_writes_new_events_and_skips_repeats(api: Api) -> None:
    seen = thumbs_body("r0")
    assert api.client.post("/v1/feedback", json=seen, headers=api.auth()).status_code == 202
    events = [seen, thumbs_body("r1"), thumbs_body("r2")]
    response = api.client.post("/v1/feedback/batch", json={"events": events}, headers=api.auth())
    assert response.status_code == 202
    assert response.json()["accepted"] == 2 and response.json()["duplicates"] == 1
    assert sorted(e.request_id for e in api.feedback_on_bus()) == ["r0", "r1", "r2"]


@pytest.mark.parametrize(
    ("body", "field", "fix"),
    [
        ({"request_id": "r", "user_id": "u", "kind": "thumbs", "value": 1}, "event_id", "add this field"),
        ({**thumbs_body(), "value": 0}, "(body)", "value 1 (up) or -1 (down)"),
        ({**thumbs_body(), "value": "yes"}, "value", "send a number"),
        ({**thumbs_body(), "kind": "stars"}, "kind", "allowed values"),
        ({**thumbs_body(), "colour": "red"}, "colour", "remove this field"),
        ({**thumbs_body(), "request_id": ""}, "request_id", "non-empty"),
        ({**thumbs_body(), "request_id": "x" * 200}, "request_id", "shorter"),
        ({**thumbs_body(), "kind": "rating", "value": 9, "scale": [1, 5]}, "(body)", "must lie on its scale"),
        ({**thumbs_body(), "kind": "preference", "value": None}, "(body)", "needs other_request_id"),
        ({**thumbs_body(), "created_at": -5}, "created_at", "see the message"),
        # one future-dated event would move the joiner's watermark and close every open window
        ({**thumbs_body(), "created_at": 1e12}, "created_at", "at most 60 s ahead: join.max_clock_skew_s"),
        ({**thumbs_body(), "created_at": 1000.0}, "created_at", "within join.retention_s"),
        ({**thumbs_body(), "comment": "x" * 9000}, "comment", "shorter"),
    ],
)
def test_invalid_bodies_get_422_naming_the_field_and_the_fix(
    api: Api, body: dict[str, Any], field: str, fix: str
) -> None:
    response = api.client.post("/v1/feedback", json=body, headers=api.auth())
    assert response.status_code == 422
    error = response.json()
    assert error["type"] == "validation_error"
    assert any(d["field"] == field and fix in d["fix"] for d in error["details"]), error
    assert api.feedback_on_bus() == []


def test_not_json_is_422(api: Api) -> None:
    response = api.client.post("/v1/feedback", content=b"{not json", headers={
        **api.auth(), "content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["details"][0]["fix"] == "send a valid JSON body"


def test_auth_is_required_and_scoped(api: Api) -> None:
    body = thumbs_body()
    assert api.client.post("/v1/feedback", json=body).status_code == 401
    bad = api.client.post("/v1/feedback", json=body, headers=api.auth("orl_wrong"))
    assert bad.status_code == 401 and "online-rl keys new" in bad.json()["details"][0]["fix"]
    assert api.client.post("/v1/feedback", json=body, headers={"X-API-Key": api.key}).status_code == 202
    forbidden = api.client.post("/v1/feedback", json=thumbs_body(), headers=api.auth(api.read_only_key))
    assert forbidden.status_code == 403
    # a key bound to a user speaks only for that user, one event or a batch (all or none)
    own = api.client.post("/v1/feedback", json=thumbs_body(user="alice"), headers=api.auth(api.alice_key))
    assert own.status_code == 202
    posing = api.client.post("/v1/feedback", json=thumbs_body(user="bob"), headers=api.auth(api.alice_key))
    assert posing.status_code == 403 and posing.json()["details"][0]["field"] == "user_id"
    assert "alice" in posing.json()["details"][0]["fix"]
    batch = {"events": [thumbs_body("r1", user="alice"), thumbs_body("r2", user="bob")]}
    posing = api.client.post("/v1/feedback/batch", json=batch, headers=api.auth(api.alice_key))
    assert posing.status_code == 403 and posing.json()["details"][0]["field"] == "events.1.user_id"
    assert [e.user_id for e in api.feedback_on_bus()] == ["u1", "alice"]


def test_body_and_batch_limits(make_api: Callable[..., Api]) -> None:
    api = make_api(max_body_bytes=4096, max_batch=3)
    huge = {**thumbs_body(), "corrected_completion": "x" * 10_000}
    assert api.client.post("/v1/feedback", json=huge, headers=api.auth()).status_code == 413
    events = [thumbs_body(f"r{i}") for i in range(4)]
    response = api.client.post("/v1/feedback/batch", json={"events": events}, headers=api.auth())
    assert response.status_code == 422
    assert "at most 3 events" in response.json()["details"][0]["fix"]
    assert api.client.post("/v1/feedback/batch", json={"events": []}, headers=api.auth()).status_code == 422
    dated = [thumbs_body("r0"), {**thumbs_body("r1"), "created_at": 4e9}]  # all or none: nothing written
    response = api.client.post("/v1/feedback/batch", json={"events": dated}, headers=api.auth())
    assert response.status_code == 422 and response.json()["details"][0]["field"] == "events.1.created_at"
    assert api.feedback_on_bus() == []


def test_rate_limit_and_user_cap(make_api: Callable[..., Api]) -> None:
    api = make_api(rate_limit_per_s=0.001, rate_burst=3, user_cap=2, user_cap_window_s=3600)
    assert api.client.post("/v1/feedback", json=thumbs_body(user="a"), headers=api.auth()).status_code == 202
    assert api.client.post("/v1/feedback", json=thumbs_body(user="a"), headers=api.auth()).status_code == 202
    capped = api.client.post("/v1/feedback", json=thumbs_body(user="a"), headers=api.auth())
    assert capped.status_code == 429 and "dominates training" in capped.json()["message"]
    assert int(capped.headers["Retry-After"]) >= 1
    assert api.client.post("/v1/feedback", json=thumbs_body(user="b"), headers=api.auth()).status_code == 202
    limited = api.client.post("/v1/feedback", json=thumbs_body(user="c"), headers=api.auth())
    assert limited.status_code == 429 and "rate limit" in limited.json()["message"]
    assert len(api.feedback_on_bus()) == 3


def test_health_readiness_and_metrics(api: Api) -> None:
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").status_code == 200
    api.client.post("/v1/feedback", json=thumbs_body(), headers=api.auth())
    metrics = api.client.get("/metrics").text
    assert 'orl_feedback_accepted_total{kind="thumbs"} 1.0' in metrics


def test_openapi_documents_the_kinds_with_examples(api: Api) -> None:
    schema = api.client.get("/openapi.json").json()
    assert "/v1/feedback" in schema["paths"] and "/v1/feedback/batch" in schema["paths"]
    examples = schema["components"]["schemas"]["FeedbackIn"]["examples"]
    assert {e["kind"] for e in examples} == {"thumbs", "rating", "preference", "implicit"}


def test_a_streamed_body_over_the_limit_is_413(make_api: Callable[..., Api]) -> None:
    api = make_api(max_body_bytes=4096)

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is enforced while reading
        body = json.dumps({**thumbs_body(), "comment": "x" * 6000}).encode()
        for start in range(0, len(body), 1000):
            yield body[start : start + 1000]

    response = api.client.post("/v1/feedback", content=chunks(),
                               headers={**api.auth(), "content-type": "application/json"})
    assert response.status_code == 413
    assert response.json()["type"] == "payload_too_large"
    assert api.feedback_on_bus() == []


def test_a_request_larger_than_a_limit_is_422_not_429(make_api: Callable[..., Api]) -> None:
    api = make_api(user_cap=2, max_batch=10)
    events = [thumbs_body(f"r{i}", user="same") for i in range(3)]
    response = api.client.post("/v1/feedback/batch", json={"events": events}, headers=api.auth())
    assert response.status_code == 422
    assert "exceed the cap of 2" in response.json()["message"]
    assert api.feedback_on_bus() == []


def test_the_same_event_posted_concurrently_is_written_once(api: Api) -> None:
    body = thumbs_body("req-c")
    with serve(api.app) as url, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda _: httpx.post(url + "/v1/feedback", json=body, headers=api.auth(), timeout=30),
            range(8)))
    assert [a.status_code for a in answers] == [202] * 8
    assert sum(not a.json()["duplicate"] for a in answers) == 1
    assert len(api.feedback_on_bus()) == 1
