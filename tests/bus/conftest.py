"""Both bus backends behind one fixture, so every contract test runs against each."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus import Bus
from online_rl.bus.embedded import EmbeddedBus
from online_rl.bus.kafka import KafkaBus

BusFactory = Callable[..., Bus]


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def make_bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BusFactory]:
    """A factory of buses over one backend; every bus it makes sees the same data."""
    made: list[Bus] = []

    def make(**options: Any) -> Bus:
        if request.param == "embedded":
            bus: Bus = EmbeddedBus(tmp_path / "bus.db", session_timeout=options.get("session_timeout", 10.0))
        else:
            extra = {}
            if "session_timeout" in options:
                ms = int(options["session_timeout"] * 1000)
                extra = {"session.timeout.ms": ms, "max.poll.interval.ms": ms, "heartbeat.interval.ms": 500}
            bus = KafkaBus(request.getfixturevalue("kafka_bootstrap"), consumer_extra=extra)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()


@pytest.fixture
def bus(make_bus: BusFactory) -> Bus:
    return make_bus()


@pytest.fixture
def topic() -> str:
    return f"t.{uuid.uuid4().hex[:10]}"


def drain(consumer: Any, count: int, timeout: float = 30.0) -> list[Any]:
    """Poll until `count` records arrived or `timeout` passed."""
    import time

    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(consumer.poll(500, 0.5))
    return out
