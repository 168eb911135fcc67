"""Topic names (the contract in docs/architecture.md) and their creation.

The names are `<prefix>.<name>`, the prefix from `bus.topic_prefix` (`orl` by default; another lets
several deployments or test runs share one Kafka cluster without seeing each other's records). A
component takes its names from `settings.topics`; there are no prefix-less defaults, so a caller that
forgets to pass its topics fails rather than writing to another deployment's.
"""

from __future__ import annotations

from dataclasses import dataclass

from online_rl.bus.base import Bus

__all__ = ["Topics", "ensure_topics"]


@dataclass(frozen=True)
class Topics:
    """The topic names of one deployment."""

    prefix: str

    @property
    def interactions(self) -> str:
        return f"{self.prefix}.interactions"

    @property
    def feedback(self) -> str:
        return f"{self.prefix}.feedback"

    @property
    def samples(self) -> str:
        return f"{self.prefix}.samples"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def join_state(self) -> str:
        """The joiner's compacted changelog (internal)."""
        return f"{self.prefix}.join-state"

    @property
    def rollout(self) -> str:
        """The rollout controller's state, heartbeat and audit log (compacted; internal)."""
        return f"{self.prefix}.rollout"

    @property
    def gateway_health(self) -> str:
        """The gateway proxies' answer health (version, latency, success), for the controller (internal)."""
        return f"{self.prefix}.gateway-health"

    @property
    def join_pairs(self) -> str:
        """Preferences on their way to the joiner task of their other request (internal)."""
        return f"{self.prefix}.join-pairs"


def ensure_topics(bus: Bus, topics: Topics, partitions: int) -> None:
    """Create every topic of the contract that does not exist. Interactions and feedback share a
    partition count so that the same request id lands on the same partition of both (co-partitioning
    for the join); the joiner's internal topics take the count interactions actually has (an existing
    topic keeps its own, whatever `partitions` says now)."""
    for name in (topics.interactions, topics.feedback, topics.samples):
        bus.create_topic(name, partitions)
    bus.create_topic(topics.dlq, 1)
    count = bus.partitions(topics.interactions)
    bus.create_topic(topics.join_state, count, compact=True)
    bus.create_topic(topics.join_pairs, count)
    bus.create_topic(topics.rollout, 1, compact=True)
    bus.create_topic(topics.gateway_health, 1)
