"""Reward mapping: from a feedback event to a number on a 0-1 scale, versioned.

Thumbs up is 1 and down is 0; a rating is placed on its scale; a scalar is clipped to a declared
range and rescaled; an implicit signal maps by a per-signal rule. The mapping's version (its name
plus a hash of its rules) is written into every training sample, so a change of rules is visible
in lineage. Pure functions: no bus, no model.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from online_rl.errors import ConfigError, UnmappedFeedback  # UnmappedFeedback: exported here too
from online_rl.events import Feedback, FeedbackKind

__all__ = ["RewardMapping", "UnmappedFeedback"]


@dataclass(frozen=True)
class RewardMapping:
    """Rules that turn feedback into rewards in [0, 1]."""

    name: str = field(default="default", metadata={"help": "Name of this rule set."})
    scalar_range: tuple[float, float] = field(
        default=(0.0, 1.0), metadata={"help": "Scalar rewards are clipped to this range and rescaled."}
    )
    implicit_constant: dict[str, float] = field(
        default_factory=lambda: {"copied": 1.0, "shared": 1.0, "regenerated": 0.0, "abandoned": 0.0},
        metadata={"help": "Implicit signals with a fixed reward."},
    )
    implicit_linear: dict[str, float] = field(
        default_factory=lambda: {"dwell_time": 60.0},
        metadata={"help": "Implicit signals whose value v maps to min(v / full, 1)."},
    )
    desirable_threshold: float = field(
        default=0.5, metadata={"help": "A reward at or above this is 'desirable' (the KTO label)."}
    )

    def __post_init__(self) -> None:
        low, high = self.scalar_range
        if not low < high:
            raise ConfigError(f"scalar_range {self.scalar_range} needs min < max, e.g. (0, 1)")
        for signal, full in self.implicit_linear.items():
            if full <= 0:
                raise ConfigError(f"implicit_linear[{signal!r}] must be > 0 (the value worth reward 1)")
        for signal, reward in self.implicit_constant.items():
            if not 0.0 <= reward <= 1.0:
                raise ConfigError(f"implicit_constant[{signal!r}]={reward} must lie in [0, 1]")
        if not 0.0 < self.desirable_threshold <= 1.0:
            raise ConfigError("desirable_threshold must lie in (0, 1]")

    @property
    def version(self) -> str:
        """`<name>-<hash of the rules>`: changes whenever a rule changes."""
        rules = json.dumps(asdict(self), sort_keys=True).encode()
        return f"{self.name}-{hashlib.sha256(rules).hexdigest()[:10]}"

    def reward(self, feedback: Feedback) -> float:
        """The reward in [0, 1] for one non-preference feedback event."""
        kind, value = feedback.kind, feedback.value
        if kind is FeedbackKind.thumbs:
            return 1.0 if value == 1.0 else 0.0
        if kind is FeedbackKind.rating:
            assert feedback.scale is not None and value is not None  # validated by Feedback
            low, high = feedback.scale
            return (value - low) / (high - low)
        if kind is FeedbackKind.scalar:
            assert value is not None
            low, high = self.scalar_range
            return (min(max(value, low), high) - low) / (high - low)
        if kind is FeedbackKind.implicit:
            signal = feedback.signal or ""
            if signal in self.implicit_constant:
                return self.implicit_constant[signal]
            if signal in self.implicit_linear:
                return min(max((value or 0.0) / self.implicit_linear[signal], 0.0), 1.0)
            raise UnmappedFeedback(
                f"no reward rule for implicit signal {signal!r}; add it to implicit_constant or "
                "implicit_linear"
            )
        raise UnmappedFeedback("preference feedback has no scalar reward; it becomes a chosen/rejected pair")

    def is_desirable(self, reward: float) -> bool:
        return reward >= self.desirable_threshold
