"""The interaction log's retry policy (pure logic: a scripted producer stands in for the client; the
real broker's outage is tests/services/inference/test_interaction_log.py)."""

from __future__ import annotations

import time
from typing import Any, cast

from online_rl.bus import BusUnavailable, DeliveryError, Producer, RecordMetadata
from online_rl.serving.interaction_log import InteractionLogger
from tests.factories import interaction


class ScriptedProducer(Producer):
    """Each flush takes the next outcome of `script` (an exception to raise, or None: confirmed)."""

    def __init__(self, script: list[Exception | None]) -> None:
        self.script = script
        self.produced: list[bytes] = []  # every record handed to the client, copies included

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, headers: Any = None,
                partition: int | None = None) -> None:
        assert key is not None
        self.produced.append(key)

    def flush(self, timeout: float = 30.0) -> list[RecordMetadata]:
        outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise outcome
        return []

    def close(self) -> None:
        pass


class OneProducerBus:
    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def producer(self, transactional_id: str | None = None) -> Producer:
        return self._producer


def _logged(script: list[Exception | None], n: int = 3) -> tuple[InteractionLogger, ScriptedProducer]:
    producer = ScriptedProducer(script)
    log = InteractionLogger(cast(Any, OneProducerBus(producer)), "t.interactions", max_backoff_s=0.2)
    for i in range(n):
        assert log.log(interaction(f"req-{i}"))
    deadline = time.monotonic() + 10
    while log.stats.logged < n and time.monotonic() < deadline:
        time.sleep(0.01)
    log.close(5)
    return log, producer


def test_records_whose_confirmation_timed_out_are_waited_for_not_written_again() -> None:
    # the bus is away for two flushes, then its confirmations arrive: each record was sent once
    log, producer = _logged([BusUnavailable("not confirmed in 5s"), BusUnavailable("not confirmed in 5s")])
    assert log.stats.logged == 3 and log.stats.failed_flushes == 2
    assert producer.produced == [b"req-0", b"req-1", b"req-2"]
    assert log.last_error is None  # the last flush was confirmed


def test_records_the_bus_refused_are_written_again_after_the_back_off() -> None:
    # a delivery error (refused, or the client's message timeout ran out): the records are sent again
    log, producer = _logged([BusUnavailable("not confirmed in 5s"), DeliveryError("3 were not written")])
    assert log.stats.logged == 3 and log.stats.failed_flushes == 2
    assert producer.produced == [b"req-0", b"req-1", b"req-2"] * 2
