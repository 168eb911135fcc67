"""A population of simulated users: who they are, who never answers, and the feedback each gives.

Users have stable ids (`sim-user-<n>`). A share of them never gives feedback (chosen by a hash of
the id, so the same users stay silent in every run); the others judge each answer with the
preference and answer in the configured kind, with noise:
- thumbs: up when the preference scores at least 0.5; each thumb flipped with probability `noise`;
- rating: 1-5 stars from the score, plus Gaussian noise of `noise` x 4 stars, rounded and clipped;
- pairwise: the user asks twice and prefers the answer that scores higher (no feedback on a tie);
  the choice flipped with probability `noise`.
Pure: the caller sends the requests and posts the events.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Literal

from online_rl.simulate.preferences import Preference

__all__ = ["FeedbackKind", "Population"]

FeedbackKind = Literal["thumbs", "rating", "pairwise"]


@dataclass(frozen=True)
class Population:
    preference: Preference
    users: int = 50
    silent: float = 0.2  # share of users who never give feedback
    noise: float = 0.1
    kind: FeedbackKind = "thumbs"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.users < 1 or not 0 <= self.silent < 1 or not 0 <= self.noise <= 0.5:
            raise ValueError("simulate: users must be >= 1, silent in [0, 1) and noise in [0, 0.5], "
                             "e.g. --users 50 --silent 0.2 --noise 0.1")

    @property
    def ids(self) -> list[str]:
        return [f"sim-user-{n}" for n in range(self.users)]

    def is_silent(self, user: str) -> bool:
        digest = hashlib.blake2b(f"{self.seed}\x00{user}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2**64 < self.silent

    def judge(self, user: str, prompt: str, answers: list[tuple[str, str]],
              rng: random.Random) -> list[dict[str, Any]]:
        """Feedback events (without event ids) from `user` on `answers` = [(request_id, text)]:
        one answer for thumbs and ratings, two for pairwise. Empty when the user stays silent."""
        if self.is_silent(user):
            return []
        scores = [self.preference.score(prompt, text) for _, text in answers]
        if self.kind == "thumbs":
            up = (scores[0] >= 0.5) != (rng.random() < self.noise)
            return [{"request_id": answers[0][0], "user_id": user, "kind": "thumbs",
                     "value": 1 if up else -1}]
        if self.kind == "rating":
            stars = round(1 + 4 * scores[0] + rng.gauss(0.0, 4 * self.noise))
            return [{"request_id": answers[0][0], "user_id": user, "kind": "rating",
                     "value": float(min(5, max(1, stars))), "scale": [1, 5]}]
        if len(answers) != 2:
            raise ValueError("pairwise feedback needs two answers to the same prompt")
        if scores[0] == scores[1]:
            return []
        first_wins = (scores[0] > scores[1]) != (rng.random() < self.noise)
        return [{"request_id": answers[0][0], "other_request_id": answers[1][0], "user_id": user,
                 "kind": "preference", "winner": "this" if first_wins else "other"}]
