"""A sequential comparison of two versions' rewards that stays valid however often it is looked at.

Canary analysis is looked at continuously: a fixed-sample z-test checked after every batch of
feedback declares false winners far more often than its nominal level. This module keeps an
always-valid confidence sequence for the reward difference Δ = mean(challenger) - mean(champion):
the normal-mixture boundary (Robbins' mixture; the mSPRT of Johari, Pekelis & Walsh 2017, in its
asymptotic form of Waudby-Smith et al. 2023) with V = s²_ch/n_ch + s²_cp/n_cp, the variance of the
difference of means, and a N(0, τ²) mixture over Δ:

    |Δ̂ - Δ| <= sqrt( V (V + τ²) / τ² · (2 log(1/α) + log((V + τ²) / V)) )   for all n at once,

with probability at least 1 - α (asymptotically). Rewards are on a 0-1 scale. Pure numpy-free math.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ArmStats", "Comparison", "compare"]


@dataclass(frozen=True)
class ArmStats:
    """Sufficient statistics of one version's rewards."""

    n: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, reward: float) -> ArmStats:
        return ArmStats(self.n + 1, self.total + reward, self.total_sq + reward * reward)

    def merge(self, other: ArmStats) -> ArmStats:
        return ArmStats(self.n + other.n, self.total + other.total, self.total_sq + other.total_sq)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else float("nan")

    @property
    def variance(self) -> float:
        """Unbiased sample variance, floored so that a run of identical rewards is not certainty."""
        if self.n < 2:
            return 0.25  # the largest variance a 0-1 reward can have
        raw = (self.total_sq - self.total * self.total / self.n) / (self.n - 1)
        return max(raw, 1.0 / (4 * self.n))


@dataclass(frozen=True)
class Comparison:
    difference: float  # challenger mean - champion mean
    lower: float  # always-valid confidence sequence for the difference
    upper: float
    p_value: float  # always-valid p-value against "no difference" (1 / the mixture likelihood ratio)
    challenger_n: int
    champion_n: int


def compare(challenger: ArmStats, champion: ArmStats, alpha: float = 0.05, tau: float = 0.1) -> Comparison:
    """The confidence sequence and always-valid p-value for challenger - champion."""
    if not 0.0 < alpha < 1.0 or tau <= 0:
        raise ValueError(f"alpha={alpha} must lie in (0, 1) and tau={tau} must be > 0")
    if challenger.n == 0 or champion.n == 0:
        return Comparison(float("nan"), -1.0, 1.0, 1.0, challenger.n, champion.n)
    difference = challenger.mean - champion.mean
    v = challenger.variance / challenger.n + champion.variance / champion.n
    t2 = tau * tau
    radius = math.sqrt(v * (v + t2) / t2 * (2 * math.log(1 / alpha) + math.log((v + t2) / v)))
    log_lr = 0.5 * math.log(v / (v + t2)) + difference * difference * t2 / (2 * v * (v + t2))
    p_value = min(1.0, math.exp(-log_lr)) if log_lr < 700 else 0.0
    return Comparison(difference, max(-1.0, difference - radius), min(1.0, difference + radius), p_value,
                      challenger.n, champion.n)
