"""Topic names (the contract in docs/architecture.md) and their creation."""

from __future__ import annotations

from online_rl.bus.base import Bus

__all__ = ["DLQ", "FEEDBACK", "INTERACTIONS", "JOIN_STATE", "SAMPLES", "ensure_topics"]

INTERACTIONS = "orl.interactions"
FEEDBACK = "orl.feedback"
SAMPLES = "orl.samples"
DLQ = "orl.dlq"
JOIN_STATE = "orl.join-state"  # the joiner's compacted changelog (internal)


def ensure_topics(bus: Bus, partitions: int = 4) -> None:
    """Create every topic of the contract; interactions and feedback share a partition count so
    that the same request id lands on the same partition of both (co-partitioning for the join)."""
    for name in (INTERACTIONS, FEEDBACK, SAMPLES):
        bus.create_topic(name, partitions)
    bus.create_topic(DLQ, 1)
    bus.create_topic(JOIN_STATE, partitions, compact=True)
