"""A reward function's failures land on the dead-letter topic of a real Kafka broker, as the rollouts
they were, with the function and the reason."""

from __future__ import annotations

import json
import uuid

import pytest

from online_rl.bus import DeadLetters
from online_rl.bus.kafka import KafkaBus
from online_rl.flow import RewardFunctions, RewardFunctionSpec, dead_letter_failures

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.usefixtures("ray_runtime")]


def test_failures_are_dead_lettered(kafka_bootstrap: str) -> None:
    bus = KafkaBus(kafka_bootstrap)
    dlq = f"t.{uuid.uuid4().hex[:10]}.dlq"
    bus.create_topic(dlq, 1)
    producer = bus.producer()
    dead = DeadLetters(producer, "hybrid", dlq)
    prompts, completions = ["q1", "q2", "q3"], ["ok", "bad", "fine"]
    metas = [{"request_id": f"r{i}"} for i in range(3)]
    try:
        spec = RewardFunctionSpec("strict", "tests.flow.reward_fns:fails_on_bad")
        with RewardFunctions([spec]) as functions:
            scores = functions.score(prompts, completions, metas)
        assert dead_letter_failures(dead, scores, prompts, completions, metas) == 1
        dead.flush()
        letters = list(bus.read_all(dlq))
    finally:
        producer.close()
        bus.close()
    assert len(letters) == 1 and dead.count == 1
    letter = letters[0]
    assert letter.key == b"strict"
    assert letter.header("component") == b"hybrid"
    assert letter.header("content-type") == b"application/json"
    reason = letter.header("reason") or b""
    assert reason.startswith(b"reward function 'strict' raised ValueError: cannot judge")
    body = json.loads(letter.value or b"")
    assert body.pop("reason").startswith("raised ValueError: cannot judge 'bad'")
    assert body == {"kind": "reward_function_failure", "function": "strict", "row": 1, "prompt": "q2",
                    "completion": "bad", "meta": {"request_id": "r1"}}
