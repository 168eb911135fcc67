"""Request bodies of the rollout control API."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ReasonIn", "RoutesIn", "StartIn", "WeightIn"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StartIn(_Strict):
    """POST /rollout/start."""

    version: str | None = Field(default=None, pattern=r"^\d+$", description="A registered version number; "
                                "empty: the version MLflow's `challenger` alias names.")


class WeightIn(_Strict):
    """PUT /rollout/weight."""

    weight: float = Field(ge=0.0, le=1.0, description="The challenger's share of traffic, e.g. 0.1 for 10%.")


class ReasonIn(_Strict):
    """POST /rollout/promote and /rollout/rollback."""

    reason: str | None = Field(default=None, max_length=500, description="Why, for the audit log.")


class RoutesIn(_Strict):
    """POST /rollout/routes."""

    users: list[str] = Field(min_length=1, max_length=10_000,
                             description="User ids (at most 10,000) whose arm to tell.")
