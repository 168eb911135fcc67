"""The always-valid comparison: its error rate stays at alpha however often it is looked at, where a
fixed-sample z-test checked after every batch does not; and it finds a real difference."""

from __future__ import annotations

import math
import random

import pytest

from online_rl.rollout import ArmStats, compare


def _stats(rewards: list[float]) -> ArmStats:
    stats = ArmStats()
    for reward in rewards:
        stats = stats.add(reward)
    return stats


def test_the_bound_is_the_normal_mixture_boundary() -> None:
    challenger, champion = _stats([1, 0, 1, 1] * 25), _stats([1, 0, 0, 1] * 50)
    out = compare(challenger, champion, alpha=0.05, tau=0.1)
    v = challenger.variance / 100 + champion.variance / 200
    radius = math.sqrt(v * (v + 0.01) / 0.01 * (2 * math.log(20) + math.log((v + 0.01) / v)))
    assert out.difference == pytest.approx(0.25)
    assert (out.lower, out.upper) == pytest.approx((0.25 - radius, 0.25 + radius))
    assert challenger.variance == pytest.approx(0.25 * 0.75 * 100 / 99)
    assert compare(ArmStats(), champion).p_value == 1.0  # nothing seen yet: nothing known


def _monitor(rng: random.Random, p_challenger: float, p_champion: float, share: float, total: int,
             every: int) -> tuple[bool, bool]:
    """(the sequence excluded 0 at some look, a z-test at 1.96 did at some look)."""
    challenger, champion = ArmStats(), ArmStats()
    sequential = naive = False
    for i in range(1, total + 1):
        if rng.random() < share:
            challenger = challenger.add(float(rng.random() < p_challenger))
        else:
            champion = champion.add(float(rng.random() < p_champion))
        if i % every == 0 and challenger.n > 1 and champion.n > 1:
            out = compare(challenger, champion)
            sequential = sequential or out.lower > 0 or out.upper < 0
            se = math.sqrt(challenger.variance / challenger.n + champion.variance / champion.n)
            naive = naive or abs(out.difference) / se > 1.96
    return sequential, naive


def test_continuous_monitoring_keeps_the_false_alarm_rate_at_alpha() -> None:
    rng = random.Random(0)
    runs = [_monitor(rng, 0.5, 0.5, share=0.25, total=3000, every=25) for _ in range(300)]
    sequential = sum(s for s, _ in runs) / len(runs)
    naive = sum(n for _, n in runs) / len(runs)
    assert sequential <= 0.05  # alpha, with 120 looks per experiment
    assert naive > 0.15  # peeking at a fixed-sample test: several times its nominal 5 %


def test_a_real_difference_is_found() -> None:
    rng = random.Random(1)
    found = [_monitor(rng, 0.65, 0.5, share=0.5, total=1500, every=25)[0] for _ in range(100)]
    assert sum(found) >= 90
