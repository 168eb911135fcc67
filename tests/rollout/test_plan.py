"""The plan's decisions: advance, promote, hold, roll back — each for the reason it gives."""

from __future__ import annotations

import math

import pytest

from online_rl.rollout import ArmHealth, ArmStats, Evidence, Guardrails, RolloutPlan, decide
from online_rl.rollout.plan import binomial_tail

PLAN = RolloutPlan(steps=(0.05, 0.25, 1.0), min_samples=100, margin=0.02, max_step_s=600)


def _arm(n: int, mean: float) -> ArmStats:
    ones = round(n * mean)
    return ArmStats(n=n, total=float(ones), total_sq=float(ones))


def test_a_challenger_as_good_advances_step_by_step_then_is_promoted() -> None:
    evidence = Evidence(_arm(2000, 0.62), _arm(2000, 0.5))
    first = decide(PLAN, 0, step_started=0, now=10, evidence=evidence)
    assert (first.action, first.step, first.weight, first.verdict) == ("advance", 1, 0.25, "passed")
    assert "no worse than -0.02" in first.reason
    last = decide(PLAN, 2, 0, 10, evidence)
    assert (last.action, last.weight) == ("promote", 1.0)


def test_too_little_feedback_holds_whatever_the_clock_says() -> None:
    """A quiet service: the challenger's arm has not gathered min_samples rewards. However long that takes,
    the step waits for evidence instead of rolling the version back unjudged."""
    evidence = Evidence(_arm(40, 0.7), _arm(900, 0.5))
    assert decide(PLAN, 0, 0, 10, evidence).action == "hold"
    later = decide(PLAN, 0, 0, 100_000, evidence)  # max_step_s (600) long past
    assert later.action == "hold" and "a step needs 100 on each arm" in later.reason
    assert decide(RolloutPlan(steps=(0.05, 1.0), min_samples=100), 0, 0, 10**7, evidence).action == "hold"


def test_a_step_without_a_verdict_ends_at_its_evidence_limit_as_inconclusive() -> None:
    plan = RolloutPlan(steps=(0.3, 0.6, 1.0), min_samples=30, margin=0.02)  # no time limit: 5 × 30 rewards
    unclear = lambda ch, cp: Evidence(_arm(ch, 0.5), _arm(cp, 0.5))  # noqa: E731 - as good, not provably
    assert decide(plan, 0, 0, 10**6, unclear(149, 450)).action == "hold"
    out = decide(plan, 0, 0, 10, unclear(150, 450))
    assert (out.action, out.verdict) == ("rollback", "inconclusive")
    assert "no verdict after 150 rewards per arm (max_step_samples 150)" in out.reason
    # at 60 % the champion's arm is the smaller one: the step waits until it has its share too
    assert decide(plan, 1, 0, 10, unclear(220, 149)).action == "hold"
    assert decide(plan, 1, 0, 10, unclear(225, 150)).verdict == "inconclusive"
    # at full weight the champion serves nobody: the challenger's rewards are what can still come, even
    # when the champion never gathered min_samples (a weight of 1 from the first step)
    assert decide(plan, 2, 0, 10, unclear(150, 40)).verdict == "inconclusive"
    assert decide(plan, 2, 0, 10, unclear(150, 0)).verdict == "inconclusive"
    lenient = RolloutPlan(steps=(0.3, 1.0), min_samples=30, max_step_samples=60, on_timeout="advance")
    out = decide(lenient, 0, 0, 10, unclear(60, 180))
    assert (out.action, out.weight, out.verdict) == ("advance", 1.0, "inconclusive")


def test_the_optional_time_limit_counts_only_once_min_samples_are_in() -> None:
    evidence = Evidence(_arm(120, 0.5), _arm(900, 0.5))  # enough rewards, no confidence yet
    assert decide(PLAN, 0, 0, 599, evidence).action == "hold"
    timed_out = decide(PLAN, 0, 0, 601, evidence)
    assert (timed_out.action, timed_out.verdict) == ("rollback", "inconclusive")
    assert "no verdict after 601s (max_step_s 600)" in timed_out.reason


def test_a_limit_below_min_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="max_step_samples=10 must be >= min_samples=30"):
        RolloutPlan(min_samples=30, max_step_samples=10)


def test_a_worse_challenger_is_rolled_back_with_its_evidence() -> None:
    out = decide(PLAN, 1, 0, 10, Evidence(_arm(800, 0.3), _arm(3000, 0.5)))
    assert (out.action, out.weight) == ("rollback", 0.0)
    assert out.comparison.upper < 0 and "challenger worse" in out.reason and out.verdict == "worse"


def test_guardrails_roll_back_whatever_the_reward_says() -> None:
    good = (_arm(2000, 0.7), _arm(2000, 0.5))
    errors = Evidence(*good, challenger_health=ArmHealth(1000, 50), champion_health=ArmHealth(1000, 5))
    assert "error rate 0.050" in decide(PLAN, 0, 0, 10, errors).reason
    slow = Evidence(*good, challenger_health=ArmHealth(60, 0, (2.0,) * 60),
                    champion_health=ArmHealth(60, 0, (1.0,) * 60))
    assert "p99 latency" in decide(PLAN, 0, 0, 10, slow).reason
    # Too few requests to judge latency or errors: a few slow or failed answers are noise.
    early = Evidence(*good, challenger_health=ArmHealth(10, 3, (2.0,) * 10),
                     champion_health=ArmHealth(10, 0, (1.0,) * 10))
    assert decide(PLAN, 0, 0, 10, early).action != "rollback"
    # Enough requests, but one pause on a busy host: the p99 of 60 answers is their slowest, and one
    # slow answer in 60 is no evidence that more than 1 % are slow. Nor is one error in 60.
    pause = Evidence(*good, challenger_health=ArmHealth(60, 1, (0.08,) * 59 + (0.7,)),
                     champion_health=ArmHealth(60, 0, (0.08,) * 60))
    assert decide(PLAN, 0, 0, 10, pause).action != "rollback"
    many = Evidence(*good, challenger_health=ArmHealth(60, 0, (0.08,) * 55 + (0.7,) * 5),
                    champion_health=ArmHealth(60, 0, (0.08,) * 60))
    assert "5 of 60 answers slower" in decide(PLAN, 0, 0, 10, many).reason
    kl_plan = RolloutPlan(steps=(0.1, 1.0), guardrails=Guardrails(max_kl=0.5))
    assert "KL to the champion" in decide(kl_plan, 0, 0, 10, Evidence(*good, kl=0.9)).reason


@pytest.mark.parametrize("steps", [(), (0.5, 0.25), (0.0, 1.0), (0.5, 1.5), (0.5, 0.5)])
def test_a_plan_with_bad_steps_is_refused(steps: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="must be increasing weights in"):
        RolloutPlan(steps=steps)


@pytest.mark.parametrize(("k", "n", "p"), [(0, 10, 0.3), (1, 60, 0.01), (3, 60, 0.01), (7, 20, 0.2),
                                           (20, 20, 0.5), (5, 4, 0.5)])
def test_the_binomial_tail_matches_the_exact_sum(k: int, n: int, p: float) -> None:
    exact = sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))
    assert binomial_tail(k, n, p) == pytest.approx(exact, rel=1e-9, abs=1e-15)
