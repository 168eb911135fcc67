"""The feedback join: interactions ⋈ feedback on `request_id`, with a reward wait window.

Modelled on the Decision Service join: an interaction waits `window_s` (event time, from its
`created_at`) for feedback; when the window closes it becomes one `TrainingSample` whose reward
aggregates every feedback event received in time (sum | mean | earliest | latest), or the default
reward if none came (or nothing, when there is no default). Feedback may arrive before its
interaction; duplicates (same `event_id`) count once; feedback after the window is counted and
logged as late, never trained on. A preference ("this beat that") becomes a chosen/rejected pair
as soon as both interactions are known.

Several joiners share the work by partition: a `JoinState` is then one partition's task and
`is_local` says which request ids are its own. A preference whose other request belongs to another
task is forwarded (`drain_forwards`) with its own interaction to that task, which pairs it there
(`add_forwarded`) and keeps a stand-in entry for the forwarded interaction that is never closed as a
sample of its own.

`JoinState` is the pure logic (no bus). Time only moves through `advance(now)`: the runner passes
the largest event time seen, and the wall clock only when it has caught up with its inputs, so a
replay after a restart joins exactly as the first run did.
"""

from __future__ import annotations

import hashlib
import heapq
import logging
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from pydantic import ValidationError

from online_rl.errors import ConfigError, DecodeError
from online_rl.events import (
    Completion,
    Feedback,
    FeedbackKind,
    Interaction,
    TrainingSample,
    decode,
    encode,
)
from online_rl.rewards import RewardMapping

__all__ = ["JoinConfig", "JoinState", "decode_forward"]

logger = logging.getLogger(__name__)
Aggregation = Literal["sum", "mean", "earliest", "latest"]


@dataclass(frozen=True)
class JoinConfig:
    """How the join waits for and combines feedback."""

    window_s: float = field(default=60.0, metadata={"help": "Reward wait window after an interaction."})
    aggregation: Aggregation = field(default="mean", metadata={"help": "sum | mean | earliest | latest"})
    default_reward: float | None = field(
        default=None, metadata={"help": "Reward when no feedback came in the window; None drops it."}
    )
    retention_s: float = field(
        default=600.0,
        metadata={"help": "How long a joined interaction is remembered (late feedback, pairs)."},
    )
    mapping: RewardMapping = field(default_factory=RewardMapping)
    max_feedback_per_request: int = field(
        default=64,
        metadata={"help": "Feedback events kept per request id; later ones are counted and dropped, so "
                          "one request's join state stays small (free text is never kept in it)."},
    )
    max_clock_skew_s: float = field(
        default=60.0,
        metadata={"help": "An event dated further than this past the joiner's clock is taken as dated "
                          "then: no client's clock can move the watermark and close other users' windows."},
    )

    def __post_init__(self) -> None:
        if self.window_s <= 0:
            raise ConfigError(f"window_s={self.window_s} must be > 0 seconds")
        if self.aggregation not in ("sum", "mean", "earliest", "latest"):
            raise ConfigError(f"aggregation={self.aggregation!r}: use sum, mean, earliest or latest")
        if not 0 <= self.max_clock_skew_s < float("inf"):
            raise ConfigError(f"max_clock_skew_s={self.max_clock_skew_s} must be finite seconds >= 0")
        if self.max_feedback_per_request < 1:
            raise ConfigError(f"max_feedback_per_request={self.max_feedback_per_request} must be >= 1")
        if self.retention_s < self.window_s:
            raise ConfigError("retention_s must be at least window_s")
        if self.default_reward is not None and not 0.0 <= self.default_reward <= 1.0:
            raise ConfigError("default_reward must lie in [0, 1] (or be empty for none)")


@dataclass
class _Entry:
    """What the join knows about one request id."""

    interaction: Interaction | None = None
    feedback: list[Feedback] = field(default_factory=list)
    preferences: list[Feedback] = field(default_factory=list)
    event_ids: set[str] = field(default_factory=set)
    emitted: bool = False
    first_seen: float = 0.0

    def dump(self) -> bytes:
        return msgspec.msgpack.encode({
            "i": encode(self.interaction) if self.interaction else None,
            "f": [encode(f) for f in self.feedback],
            "p": [encode(f) for f in self.preferences],
            "e": sorted(self.event_ids),
            "x": self.emitted,
            "t": self.first_seen,
        })

    @classmethod
    def load(cls, data: bytes) -> _Entry:
        raw: dict[str, Any] = msgspec.msgpack.decode(data)
        return cls(
            interaction=decode(raw["i"], Interaction) if raw["i"] else None,
            feedback=[decode(f, Feedback) for f in raw["f"]],
            preferences=[decode(f, Feedback) for f in raw["p"]],
            event_ids=set(raw["e"]),
            emitted=raw["x"],
            first_seen=raw["t"],
        )


def decode_forward(data: bytes) -> tuple[Interaction, Feedback]:
    """A forwarded preference (`JoinState.drain_forwards`): its request's interaction and itself.
    Raises `DecodeError` (or msgspec's) on bytes that are not one."""
    raw = msgspec.msgpack.decode(data)
    if not (isinstance(raw, dict) and isinstance(raw.get("i"), bytes) and isinstance(raw.get("p"), bytes)):
        raise DecodeError("a forwarded preference is a map of 'i' (an Interaction) and 'p' (a Feedback)")
    interaction, preference = decode(raw["i"], Interaction), decode(raw["p"], Feedback)
    if preference.kind is not FeedbackKind.preference or preference.request_id != interaction.request_id:
        raise DecodeError("a forwarded preference must be a preference on the forwarded interaction")
    return interaction, preference


def _completion(i: Interaction) -> Completion:
    return Completion(
        request_id=i.request_id,
        text=i.completion,
        token_ids=i.completion_token_ids,
        logprobs=i.completion_logprobs,
        adapter_version=i.adapter_version,
        finish_reason=i.finish_reason,
    )


class JoinState:
    """The join's state and logic; every mutation is recorded for the changelog."""

    def __init__(self, config: JoinConfig, is_local: Callable[[str], bool] | None = None) -> None:
        self.config = config
        self._is_local = is_local or (lambda _request_id: True)
        self._forwards: list[tuple[Interaction, Feedback]] = []
        self.entries: dict[str, _Entry] = {}
        self.stats: Counter[str] = Counter()
        self._changed: set[str] = set()
        # Min-heaps of (time, request_id): window deadlines and retention expiries. Stale items
        # (entry gone or already emitted) are skipped when popped.
        self._deadlines: list[tuple[float, str]] = []
        self._expiries: list[tuple[float, str]] = []
        self._waiting: dict[str, set[str]] = {}  # other request id -> requests whose preference waits

    # -- inputs -----------------------------------------------------------------------------
    def add_interaction(self, interaction: Interaction) -> list[TrainingSample]:
        entry = self._entry(interaction.request_id, interaction.created_at)
        if entry.interaction is not None:
            self.stats["duplicate_interactions"] += 1
            return []
        entry.interaction = interaction
        self._changed.add(interaction.request_id)
        if interaction.created_at > entry.first_seen:  # feedback came first, with an earlier clock
            entry.first_seen = interaction.created_at
            self._track(interaction.request_id, entry)
        deadline = interaction.created_at + self.config.window_s
        heapq.heappush(self._deadlines, (deadline, interaction.request_id))
        out: list[TrainingSample] = []
        # Preferences that named this request as the other side were waiting for it.
        for waiting_id in sorted(self._waiting.pop(interaction.request_id, set())):
            waiting = self.entries.get(waiting_id)
            for pref in list(waiting.preferences if waiting else []):
                if pref.other_request_id == interaction.request_id:
                    out.extend(self._try_pair(pref))
        for pref in list(entry.preferences):
            if self._is_local(pref.other_request_id or ""):
                out.extend(self._try_pair(pref))
            else:
                entry.preferences.remove(pref)
                self._forward(interaction, pref)
        return out

    def add_feedback(self, feedback: Feedback) -> list[TrainingSample]:
        entry = self._entry(feedback.request_id, feedback.created_at)
        if feedback.event_id in entry.event_ids:
            self.stats["duplicate_feedback"] += 1
            return []
        if entry.interaction is not None and feedback.user_id != entry.interaction.user_id:
            self.stats["wrong_user"] += 1  # kept out at once: it may not use up the request's slots
            return []
        if len(entry.event_ids) >= self.config.max_feedback_per_request:
            # bounded state: one request's changelog record must stay far below the broker's message size
            self.stats["feedback_over_cap"] += 1
            return []
        if feedback.comment is not None or feedback.corrected_completion is not None:
            # free text is for people reading the feedback topic, not for the join: kept out of its state
            feedback = feedback.model_copy(update={"comment": None, "corrected_completion": None})
        entry.event_ids.add(feedback.event_id)
        self._changed.add(feedback.request_id)
        deadline = self._deadline(entry)
        if entry.emitted or (deadline is not None and feedback.created_at > deadline):
            self.stats["late_feedback"] += 1
            logger.info("late feedback %s on %s: not trained on", feedback.event_id, feedback.request_id)
            return []
        if feedback.kind is FeedbackKind.preference:
            if not self._is_local(feedback.other_request_id or ""):
                if entry.interaction is not None:
                    self._forward(entry.interaction, feedback)
                else:  # forwarded when its own interaction arrives
                    entry.preferences.append(feedback)
                return []
            entry.preferences.append(feedback)
            paired = self._try_pair(feedback)
            if not paired and feedback in entry.preferences:
                self._waiting.setdefault(feedback.other_request_id or "", set()).add(feedback.request_id)
            return paired
        entry.feedback.append(feedback)
        return []

    def advance(self, now: float) -> list[TrainingSample]:
        """Close every window that ended before `now`; forget what is older than the retention."""
        out: list[TrainingSample] = []
        while self._deadlines and self._deadlines[0][0] < now:
            _, request_id = heapq.heappop(self._deadlines)
            entry = self.entries.get(request_id)
            if entry is not None and not entry.emitted and entry.interaction is not None:
                out.extend(self._close(entry))
                self._changed.add(request_id)
        while self._expiries and self._expiries[0][0] < now:
            _, request_id = heapq.heappop(self._expiries)
            expired = self.entries.get(request_id)
            if expired is None or now <= self._expiry(expired):
                continue  # gone already, or re-tracked with a later expiry
            del self.entries[request_id]
            if not expired.emitted:
                self.stats["orphan_feedback" if expired.interaction is None else "expired"] += 1
            for pref in expired.preferences:
                self.stats["pair_missing_other"] += 1
                self._waiting.get(pref.other_request_id or "", set()).discard(request_id)
            self._changed.add(request_id)
        return out

    def add_forwarded(self, interaction: Interaction, preference: Feedback) -> list[TrainingSample]:
        """A preference another task forwarded, with its own request's interaction: paired here, where
        its other request lives. The interaction is kept in a stand-in entry, marked emitted so that its
        window is never closed here (its own task does that); it is forgotten after the retention."""
        request_id = interaction.request_id
        if preference.request_id != request_id or not self._is_local(preference.other_request_id or ""):
            self.stats["forward_misrouted"] += 1
            return []
        entry = self._entry(request_id, interaction.created_at)
        if entry.interaction is None:
            entry.interaction = interaction
            entry.emitted = True
        if preference.event_id in entry.event_ids:
            self.stats["duplicate_feedback"] += 1
            return []
        entry.event_ids.add(preference.event_id)
        entry.preferences.append(preference)
        self._changed.add(request_id)
        self.stats["forwarded_in"] += 1
        paired = self._try_pair(preference)
        if not paired and preference in entry.preferences:
            self._waiting.setdefault(preference.other_request_id or "", set()).add(request_id)
        return paired

    def drain_forwards(self) -> list[tuple[str, bytes]]:
        """Preferences to send to the task of their other request, as (other request id, payload for
        `decode_forward`), since the last call."""
        out = [(pref.other_request_id or "", msgspec.msgpack.encode({"i": encode(i), "p": encode(pref)}))
               for i, pref in self._forwards]
        self._forwards.clear()
        return out

    def _forward(self, interaction: Interaction, preference: Feedback) -> None:
        self._forwards.append((interaction, preference))
        self._changed.add(preference.request_id)
        self.stats["forwarded_out"] += 1

    # -- changelog --------------------------------------------------------------------------
    def drain_changes(self) -> dict[str, bytes | None]:
        """Serialized state of every entry changed since the last call (None = deleted)."""
        out = {rid: (self.entries[rid].dump() if rid in self.entries else None) for rid in self._changed}
        self._changed.clear()
        return out

    def restore(self, changelog: dict[str, bytes | None]) -> None:
        """Rebuild the state from the changelog's latest value per request id."""
        for request_id, data in changelog.items():
            if data:
                self.entries[request_id] = _Entry.load(data)
            else:
                self.entries.pop(request_id, None)
        for request_id, entry in self.entries.items():
            self._track(request_id, entry)
            if entry.interaction is not None and not entry.emitted:
                deadline = entry.interaction.created_at + self.config.window_s
                heapq.heappush(self._deadlines, (deadline, request_id))
            for pref in entry.preferences:
                if self._is_local(pref.other_request_id or ""):  # (the others wait for their interaction)
                    self._waiting.setdefault(pref.other_request_id or "", set()).add(request_id)
        self._changed.clear()

    # -- internals --------------------------------------------------------------------------
    def _entry(self, request_id: str, seen: float) -> _Entry:
        entry = self.entries.get(request_id)
        if entry is None:
            entry = self.entries[request_id] = _Entry(first_seen=seen)
            self._track(request_id, entry)
        return entry

    def _expiry(self, entry: _Entry) -> float:
        return entry.first_seen + self.config.window_s + self.config.retention_s

    def _track(self, request_id: str, entry: _Entry) -> None:
        heapq.heappush(self._expiries, (self._expiry(entry), request_id))

    def _deadline(self, entry: _Entry) -> float | None:
        if entry.interaction is None:
            return None
        return entry.interaction.created_at + self.config.window_s

    def _reward(self, feedback: list[Feedback]) -> float:
        rewards = [(f.created_at, self.config.mapping.reward(f)) for f in feedback]
        rewards.sort(key=lambda item: item[0])
        values = [r for _, r in rewards]
        agg = self.config.aggregation
        if agg == "sum":
            return sum(values)
        if agg == "mean":
            return sum(values) / len(values)
        return values[0] if agg == "earliest" else values[-1]

    def _close(self, entry: _Entry) -> list[TrainingSample]:
        entry.emitted = True
        interaction = entry.interaction
        assert interaction is not None
        deadline = interaction.created_at + self.config.window_s
        # Only the user the answer was served to may judge it (a key speaks only for its own user;
        # the request id alone would let anyone who saw it rate the answer).
        own = [f for f in entry.feedback if f.user_id == interaction.user_id]
        if len(own) < len(entry.feedback):
            self.stats["wrong_user"] += len(entry.feedback) - len(own)
            logger.info("request %s: %d feedback events from users it was not served to; not trained on",
                        interaction.request_id, len(entry.feedback) - len(own))
        # Feedback read before its interaction could not be checked for lateness then.
        scored = [f for f in own if f.created_at <= deadline]
        self.stats["late_feedback"] += len(own) - len(scored)
        if scored:
            reward, defaulted = self._reward(scored), False
        elif self.config.default_reward is not None:
            reward, defaulted = self.config.default_reward, True
        else:
            self.stats["no_feedback"] += 1
            return []
        if not math.isfinite(reward):  # the events are checked; this is the last line against a crash loop
            self.stats["invalid_sample"] += 1
            logger.warning("request %s: reward %s is not a finite number; dropped", interaction.request_id,
                           reward)
            return []
        self.stats["defaulted" if defaulted else "joined"] += 1
        return self._valid(lambda: TrainingSample(
                sample_id=f"s-{interaction.request_id}",
                kind="single",
                model=interaction.model,
                user_id=interaction.user_id,
                prompt=interaction.prompt,
                prompt_token_ids=interaction.prompt_token_ids,
                completion=_completion(interaction),
                reward=reward,
                feedback_kind=scored[-1].kind if scored else None,
                label=self.config.mapping.is_desirable(reward),
                defaulted=defaulted,
                reward_mapping_version=self.config.mapping.version,
                behaviour_versions=[interaction.adapter_version],
                feedback_event_ids=sorted(f.event_id for f in scored),
                created_at=interaction.created_at,
            ), interaction.request_id)

    def _try_pair(self, pref: Feedback) -> list[TrainingSample]:
        this = self.entries.get(pref.request_id)
        other = self.entries.get(pref.other_request_id or "")
        if this is None or this.interaction is None or other is None or other.interaction is None:
            return []  # waits for the missing interaction
        this.preferences.remove(pref)
        self._changed.add(pref.request_id)
        a, b = this.interaction, other.interaction
        if pref.user_id != a.user_id or pref.user_id != b.user_id:
            self.stats["wrong_user"] += 1
            logger.info("preference %s compares answers not both served to its user: dropped", pref.event_id)
            return []
        if a.prompt_token_ids != b.prompt_token_ids:
            self.stats["pair_prompt_mismatch"] += 1
            logger.info("preference %s compares different prompts: dropped", pref.event_id)
            return []
        chosen, rejected = (a, b) if pref.winner == "this" else (b, a)
        self.stats["pairs"] += 1
        digest = hashlib.sha256(f"{pref.request_id}\0{pref.event_id}".encode()).hexdigest()[:24]
        return self._valid(lambda: TrainingSample(
                sample_id=f"p-{digest}",
                kind="pair",
                model=a.model,
                user_id=pref.user_id,
                prompt=a.prompt,
                prompt_token_ids=a.prompt_token_ids,
                chosen=_completion(chosen),
                rejected=_completion(rejected),
                feedback_kind=FeedbackKind.preference,
                reward_mapping_version=self.config.mapping.version,
                behaviour_versions=[chosen.adapter_version, rejected.adapter_version],
                feedback_event_ids=[pref.event_id],
                created_at=max(a.created_at, b.created_at),
            ), pref.request_id)

    def _valid(self, build: Callable[[], TrainingSample], request_id: str) -> list[TrainingSample]:
        """The sample `build` makes, or none (counted and logged) when it fails validation: one bad join
        result must never stop the joiner, which would then fail on the same records after a restart."""
        try:
            return [build()]
        except (ValidationError, ValueError) as exc:
            self.stats["invalid_sample"] += 1
            logger.warning("request %s: the joined sample is invalid (%s); dropped", request_id,
                           str(exc).splitlines()[0][:200])
            return []
