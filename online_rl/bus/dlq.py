"""The dead-letter topic: where a record that cannot be used goes, with why and where it came from.

The original key and bytes are kept as they were; headers carry the reason and the source
coordinates, so an operator can inspect, fix and replay it. Something that never was a record on the bus
(a rollout a reward function failed on) goes there as JSON (`send_json`), with the reason in the headers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from online_rl.bus.base import Producer, Record
from online_rl.errors import DecodeError
from online_rl.events import _Event, decode

__all__ = ["DeadLetters", "decode_or_dead_letter"]

logger = logging.getLogger(__name__)
E = TypeVar("E", bound=_Event)


class DeadLetters:
    """Sends rejected records to the dead-letter topic (`<prefix>.dlq`; confirmed on the producer's next
    flush)."""

    def __init__(self, producer: Producer, component: str, topic: str) -> None:
        self._producer = producer
        self._component = component
        self._topic = topic
        self.count = 0

    def send(self, record: Record, reason: str) -> None:
        logger.warning(
            "dead-lettering %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason
        )
        self._producer.produce(
            self._topic,
            record.value,
            record.key,
            headers=[
                ("reason", reason.encode()[:2000]),
                ("source.topic", record.topic.encode()),
                ("source.partition", str(record.partition).encode()),
                ("source.offset", str(record.offset).encode()),
                ("component", self._component.encode()),
            ],
        )
        self.count += 1

    def send_json(self, payload: Mapping[str, Any], reason: str, key: bytes | None = None) -> None:
        """Dead-letter something that was never read from the bus: `payload` as UTF-8 JSON (a value JSON
        cannot hold is written as its str()), with the reason and this component in the headers."""
        logger.debug("dead-lettering a %s payload: %s", self._component, reason)
        self._producer.produce(
            self._topic,
            json.dumps(payload, default=str, ensure_ascii=False).encode(),
            key,
            headers=[
                ("reason", reason.encode()[:2000]),
                ("component", self._component.encode()),
                ("content-type", b"application/json"),
            ],
        )
        self.count += 1

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every dead letter sent so far is confirmed."""
        self._producer.flush(timeout)


def decode_or_dead_letter(
    records: Iterable[Record], expected: type[E], dead: DeadLetters
) -> list[tuple[Record, E]]:
    """Decode each record; send the ones that fail to the dead-letter topic and carry on."""
    out: list[tuple[Record, E]] = []
    for record in records:
        if record.value is None:
            dead.send(record, "empty value (a tombstone where an event was expected)")
            continue
        try:
            out.append((record, decode(record.value, expected)))
        except DecodeError as exc:
            dead.send(record, f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a decoder bug must not crash-loop the consumer on one record
            logger.exception("decoding %s[%d]@%d raised %s", record.topic, record.partition, record.offset,
                             type(exc).__name__)
            dead.send(record, f"undecodable ({type(exc).__name__}: {str(exc)[:200]})")
    return out
