"""Interaction logging when the broker goes away: answers keep flowing, nothing is lost."""

from __future__ import annotations

import os
import re
import signal
import threading
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
    on_topic = [i.request_id for i in server.interactions()]
    assert set(served) <= set(on_topic), set(served) - set(on_topic)
    # once each: the flush that timed out waited for its records instead of writing them again
    assert sorted(on_topic) == sorted(set(on_topic)), on_topic
    assert metric(server.url, "orl_interactions_dropped") == 0



@pytest.mark.slow
@pytest.mark.kafka
def test_an_answer_reaches_its_client_only_once_the_bus_has_its_interaction(
    make_server: ServerFactory, tiny_model: Path, tmp_path: Path
) -> None:
    # A replica SIGKILLed right after answering must have logged what it answered (bench/chaos.py kills
    # replicas under traffic). Here the broker is frozen (SIGSTOP) for a second around a request: the
    # default holds the answer until the broker is back and has the record; the control
    # (`log_confirm_s: 0`) answers while the record still waits in memory, where a SIGKILL would lose it.
    own = Broker(ORL_KAFKA_RUN=str(tmp_path / "kafka"))
    own.run("start")
    try:
        pid = int((tmp_path / "kafka" / "broker.pid").read_text())
        held = make_server(tiny_model, "tiny-llama", bus=KafkaBus(own.bootstrap))
        at_once = make_server(tiny_model, "tiny-llama", bus=KafkaBus(own.bootstrap), log_confirm_s=0.0)
        seen = {}
        for name, server in (("held", held), ("at_once", at_once)):
            client = server.openai(timeout=60)
            client.completions.create(model="tiny-llama", prompt="warm up", max_tokens=2)
            deadline = time.monotonic() + 30
            while metric(server.url, "orl_interactions_logged") < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            os.kill(pid, signal.SIGSTOP)
            thaw = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))
            thaw.start()
            try:
                client.completions.create(model="tiny-llama", prompt="while frozen", max_tokens=2)
                seen[name] = metric(server.url, "orl_interactions_logged")
            finally:
                thaw.join()
                os.kill(pid, signal.SIGCONT)
        assert seen == {"held": 2, "at_once": 1}, seen
        assert metric(held.url, "orl_interactions_answered_unconfirmed") == 0
    finally:
        own.run("reset")
