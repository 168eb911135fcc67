"""Durability of the feedback API on a real broker that stops mid-load, and idempotent retries."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from online_rl.bus import Bus, Topics
from online_rl.bus.kafka import KafkaBus
from online_rl.client import FeedbackClient
from online_rl.events import TrainingSample, decode, encode
from online_rl.stream import JoinConfig, Joiner
from tests.conftest import Broker
from tests.factories import interaction
from tests.services.feedback.conftest import Api, serve, thumbs_body


@pytest.mark.slow
@pytest.mark.kafka
def test_broker_stopped_mid_load_gives_503_and_loses_nothing_that_got_202(
    broker: Broker, make_api: Callable[..., Api]
) -> None:
    api = make_api(bus=KafkaBus(broker.bootstrap), write_timeout_s=2.0, retry_after_s=1)
    acknowledged: list[str] = []
    for i in range(20):
        body = thumbs_body(f"before-{i}")
        assert api.client.post("/v1/feedback", json=body, headers=api.auth()).status_code == 202
        acknowledged.append(body["event_id"])

    broker.run("stop")
    for i in range(3):
        response = api.client.post("/v1/feedback", json=thumbs_body(f"down-{i}"), headers=api.auth())
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "1"
        assert response.json()["type"] == "bus_unavailable"
    assert api.client.get("/readyz").status_code == 503

    broker.run("start")
    # ready again with no traffic at all (an unready pod gets none), within 30 s of the bus coming back
    deadline = time.monotonic() + 30
    while api.client.get("/readyz").status_code != 200:
        assert time.monotonic() < deadline, api.client.get("/readyz").text
        time.sleep(0.5)
    with serve(api.app) as url, FeedbackClient(url, api.key, max_attempts=30) as client:
        # The client retries through the reconnection; each event keeps its event_id.
        events = [thumbs_body(f"after-{i}") for i in range(20)]
        assert client.send_many(events) == 20
        acknowledged += [e["event_id"] for e in events]
        ready = httpx.get(url + "/readyz", timeout=10)
        assert ready.status_code == 200, ready.text

    on_topic = {e.event_id for e in api.feedback_on_bus()}
    missing = set(acknowledged) - on_topic
    assert not missing, f"{len(missing)} events got a 202 but are not on the topic"


def test_retries_through_two_replicas_are_counted_once_after_the_join(
    make_bus: Callable[..., Bus], make_api: Callable[..., Api]
) -> None:
    bus = make_bus()
    first = make_api(bus=bus)
    # A second replica on the same topics does not know what the first one wrote.
    second = make_api(bus=bus)
    topics: Topics = first.topics
    second.app.state.service.topics = topics
    producer = bus.producer()
    producer.produce(topics.interactions, encode(interaction("req-9", created_at=time.time())), b"req-9")
    producer.flush()
    body = thumbs_body("req-9", up=True)
    assert first.client.post("/v1/feedback", json=body, headers=first.auth()).status_code == 202
    assert second.client.post("/v1/feedback", json=body, headers=second.auth()).status_code == 202
    assert len(first.feedback_on_bus()) == 2  # the retry reached the topic twice ...

    joiner = Joiner(bus, JoinConfig(window_s=5.0, aggregation="sum"), topics=topics,
                    transactional_id=f"j-{topics.prefix}", clock=lambda: time.time() + 60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if joiner.step(timeout=0.3).consumed == 0 and joiner.caught_up():
            joiner.step(timeout=0.1)
            break
    joiner.close()
    samples = [decode(r.value or b"", TrainingSample) for r in bus.read_all(topics.samples)]
    assert [(s.sample_id, s.reward) for s in samples] == [("s-req-9", 1.0)]  # ... and counted once
    assert joiner.stats["duplicate_feedback"] == 1


def test_client_gives_up_with_the_servers_reason(api: Api, tmp_path: Path) -> None:
    from online_rl.errors import FeedbackRejected

    with serve(api.app) as url, FeedbackClient(url, api.key) as client:
        with pytest.raises(FeedbackRejected, match="422") as err:
            client.send({"request_id": "r", "user_id": "u", "kind": "thumbs", "value": 0})
        assert err.value.status == 422
        assert client.thumbs("req-1", "u1", up=True)["duplicate"] is False
