"""Dead letters that never were records on the bus (`DeadLetters.send_json`), on both backends."""

from __future__ import annotations

import json
from datetime import date

from online_rl.bus import Bus, DeadLetters


def test_a_json_payload_is_dead_lettered_with_its_reason(bus: Bus, topic: str) -> None:
    bus.create_topic(topic, 1)
    producer = bus.producer()
    dead = DeadLetters(producer, "test", topic)
    dead.send_json({"prompt": "p", "when": date(2026, 1, 2)}, "reward function 'f' timed out", key=b"f")
    dead.flush()
    letters = list(bus.read_all(topic))
    producer.close()
    assert len(letters) == 1 and dead.count == 1
    letter = letters[0]
    assert letter.key == b"f"
    assert json.loads(letter.value or b"") == {"prompt": "p", "when": "2026-01-02"}
    assert letter.header("reason") == b"reward function 'f' timed out"
    assert letter.header("component") == b"test"
    assert letter.header("content-type") == b"application/json"
