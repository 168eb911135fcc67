"""The event bus: one API over Kafka and over an embedded single-machine log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from online_rl.bus.base import (
    AssignCallback,
    Bus,
    Consumer,
    Producer,
    Record,
    RecordMetadata,
    TopicPartition,
    murmur2,
    partition_for,
)
from online_rl.bus.dlq import DeadLetters, decode_or_dead_letter
from online_rl.bus.errors import (
    BusError,
    BusUnavailable,
    CommitFailed,
    DeliveryError,
    ProducerBroken,
    ProducerFenced,
    UnknownTopic,
)
from online_rl.bus.topics import Topics, ensure_topics

if TYPE_CHECKING:
    from online_rl.config import Settings

__all__ = [
    "AssignCallback",
    "Bus",
    "BusError",
    "BusUnavailable",
    "CommitFailed",
    "Consumer",
    "DeadLetters",
    "DeliveryError",
    "Producer",
    "ProducerBroken",
    "ProducerFenced",
    "Record",
    "RecordMetadata",
    "TopicPartition",
    "Topics",
    "UnknownTopic",
    "decode_or_dead_letter",
    "ensure_topics",
    "murmur2",
    "open_bus",
    "partition_for",
]


def open_bus(settings: Settings) -> Bus:
    """Kafka when bootstrap servers are configured, else the embedded log under the cache folder."""
    if settings.kafka.bootstrap_servers:
        from online_rl.bus.kafka import KafkaBus

        return KafkaBus(settings.kafka.bootstrap_servers, extra=settings.kafka.client_options())
    from online_rl.bus.embedded import EmbeddedBus

    return EmbeddedBus(settings.bus_path)
