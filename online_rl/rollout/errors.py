"""The rollout's exceptions: a request that does not fit the rollout's state, and the replicas failing
it (none to take a request, or one refusing a version). Pure: no HTTP client, no registry, no bus."""

from __future__ import annotations

from online_rl.errors import OnlineRLError

__all__ = ["ReplicaRefusedVersion", "ReplicaUnavailable", "RolloutConflict"]


class RolloutConflict(OnlineRLError):
    """The request does not fit the rollout's current state (e.g. starting a second one)."""


class ReplicaUnavailable(OnlineRLError):
    """No replica could take the request."""


class ReplicaRefusedVersion(OnlineRLError):
    """A replica refused to load adapter version `name` (the message says why).

    Not `online_rl.serving.AdapterLoadError`, which an engine raises in the replica's own process: this
    is the gateway's view, over HTTP, of a replica answering that it could not load the version."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
