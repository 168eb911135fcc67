"""The bus's exceptions, the same for every backend (Kafka, embedded): what a producer, a consumer or
the topic admin may raise. Knows nothing about any backend or about events."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["BusError", "BusUnavailable", "CommitFailed", "DeliveryError", "ProducerBroken", "ProducerFenced",
           "UnknownTopic"]


class BusError(OnlineRLError):
    """Base class of bus errors."""


class BusUnavailable(BusError):
    """The bus cannot be reached or did not confirm in time; the caller may retry."""


class DeliveryError(BusError):
    """Some produced records were not confirmed; none of them may be assumed written."""


class CommitFailed(BusError):
    """An offset commit was refused, usually because the partition moved to another consumer."""


class ProducerFenced(BusError):
    """A newer producer with the same transactional id exists; this one must stop."""


class ProducerBroken(BusError):
    """The transactional producer hit a fatal error that is not a fence (e.g. a sequence error after a
    broker lost its tail): this instance can do nothing more, and a new one with the same
    transactional id (which aborts whatever the old one left open) is the client's documented remedy."""


class UnknownTopic(BusError):
    """The topic does not exist; create it first (`online-rl bus create-topics`)."""
