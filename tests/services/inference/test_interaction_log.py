"""Interaction logging when the broker goes away: answers keep flowing, nothing is lost."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from online_rl.bus.kafka import KafkaBus
from tests.conftest import Broker
from tests.services.inference.conftest import ServerFactory


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


@pytest.mark.slow
@pytest.mark.kafka
def test_answers_continue_while_the_broker_is_down_and_every_interaction_arrives_later(
    make_server: ServerFactory, tiny_model: Path, broker: Broker
) -> None:
    server = make_server(tiny_model, "tiny-llama", bus=KafkaBus(broker.bootstrap))
    client = server.openai(timeout=60)

    def ask(n: int) -> list[str]:
        return [client.completions.create(model="tiny-llama", prompt=f"p{i}", max_tokens=3).id
                for i in range(n)]

    served = ask(3)
    deadline = time.monotonic() + 30
    while metric(server.url, "orl_interactions_logged") < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    broker.run("stop")
    served += ask(5)  # every request is still answered
    deadline = time.monotonic() + 30
    while metric(server.url, "orl_interaction_log_failures") < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert metric(server.url, "orl_interaction_log_failures") >= 1
    assert metric(server.url, "orl_interaction_log_buffered") >= 1
    assert httpx.get(server.url + "/readyz").json()["interaction_log_error"]

    broker.run("start")
    deadline = time.monotonic() + 90
    while metric(server.url, "orl_interaction_log_buffered") > 0 and time.monotonic() < deadline:
        time.sleep(0.5)
    on_topic = {i.request_id for i in server.interactions()}
    assert set(served) <= on_topic, set(served) - on_topic
    assert metric(server.url, "orl_interactions_dropped") == 0


@pytest.mark.kafka
def test_an_answer_reaches_its_client_only_once_the_bus_has_its_interaction(
    make_server: ServerFactory, tiny_model: Path, kafka_bootstrap: str
) -> None:
    # A replica SIGKILLed right after answering must have logged what it answered (bench/chaos.py
    # kills replicas under load and counts); here, each answer arrives after its record is confirmed.
    server = make_server(tiny_model, "tiny-llama", bus=KafkaBus(kafka_bootstrap))
    client = server.openai(timeout=60)
    served = []
    for i in range(6):
        if i % 2:
            served.append(client.completions.create(model="tiny-llama", prompt=f"q{i}", max_tokens=3).id)
        else:  # streamed: the last chunk waits for the record too
            stream = client.completions.create(model="tiny-llama", prompt=f"q{i}", max_tokens=3, stream=True)
            served.append([chunk.id for chunk in stream][-1])
        assert metric(server.url, "orl_interactions_logged") == i + 1  # no waiting here
    assert metric(server.url, "orl_interactions_answered_unconfirmed") == 0
    assert {i.request_id for i in server.interactions()} >= set(served)

