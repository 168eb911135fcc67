"""The rollout plan and its decisions: advance, hold, promote or roll back, each with its evidence.

A plan is a list of challenger weights (e.g. 5% -> 25% -> 50% -> 100%). At each step the analysis
compares the versions' rewards with an always-valid confidence sequence (`sequential.compare`) and
checks guardrails (error rate, p99 latency, KL to the champion). Error rate and latency are tested, not
compared point for point: on a few dozen answers a p99 is the single slowest one, so one slow answer
(a pause on a busy host) would roll back a good version. A guardrail breaks when the challenger's
answers show, at significance `Guardrails.significance` (binomial test), an error rate above the
champion's plus the allowance, or more than 1 % of answers slower than the allowed multiple of the
champion's p99:

1. a guardrail broken, or the challenger confidently worse (the sequence's upper bound < 0): roll back;
2. enough feedback on both arms and the challenger confidently no worse than `margin` (lower bound
   > -margin): advance; after the last step, promote;
3. the step reached its limit without that confidence: `on_timeout` (roll back by default). The limit
   follows the evidence, not the clock: each arm gathered `max_step_samples` rewards in the step
   (default 5 × `min_samples`; at full weight, where the champion serves nobody, the challenger), or —
   only when a time limit `max_step_s` is set — that much time passed. Neither ends a step before both
   arms have `min_samples` rewards: on a quiet service a step waits for evidence instead of rolling a
   version back unjudged;
4. otherwise hold.

Each decision carries a verdict — `passed`, `worse`, `guardrail` or `inconclusive` (the limit came
first) — so that a rollback for lack of evidence is never mistaken for one on evidence.

`decide` is pure (state, evidence, clock in; decision out) so the controller, its tests and the
audit log see exactly the same reasoning. Knows nothing about HTTP, MLflow or the gateway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from online_rl.rollout.sequential import ArmStats, Comparison, compare

__all__ = ["ArmHealth", "Decision", "Evidence", "Guardrails", "RolloutPlan", "Verdict", "decide"]

Action = Literal["hold", "advance", "promote", "rollback"]
Verdict = Literal["pending", "passed", "worse", "guardrail", "inconclusive"]


@dataclass(frozen=True)
class Guardrails:
    max_error_rate_increase: float = 0.01  # challenger error rate minus champion's
    max_p99_latency_ratio: float = 1.5  # challenger p99 / champion p99
    max_kl: float | None = None  # KL(champion || challenger) per answer, as the off-policy gate measures it
    min_requests: int = 50  # per arm before error rate and latency are judged (few requests are noise)
    significance: float = 0.01  # of the binomial tests behind the error-rate and latency guardrails


@dataclass(frozen=True)
class RolloutPlan:
    steps: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    min_samples: int = 200  # rewards per arm before a step may pass (or end without a verdict)
    margin: float = 0.02  # "no worse than" tolerance on the 0-1 reward scale
    max_step_samples: int | None = None  # rewards per arm in a step without a verdict; None: 5 × min
    max_step_s: float | None = None  # an optional time limit of a step (once min_samples are in)
    on_timeout: Literal["rollback", "advance"] = "rollback"
    alpha: float = 0.05
    tau: float = 0.1
    guardrails: Guardrails = field(default_factory=Guardrails)

    def __post_init__(self) -> None:
        steps = list(self.steps)
        if not steps or any(not 0 < w <= 1 for w in steps) or steps != sorted(set(steps)):
            raise ValueError(f"rollout steps {self.steps} must be increasing weights in (0, 1], "
                             "e.g. 0.05, 0.25, 0.5, 1")
        if self.min_samples < 1 or self.margin < 0 or (self.max_step_s is not None and self.max_step_s <= 0):
            raise ValueError("rollout min_samples must be >= 1, margin >= 0 and max_step_s > 0")
        if self.max_step_samples is not None and self.max_step_samples < self.min_samples:
            raise ValueError(f"rollout max_step_samples={self.max_step_samples} must be >= min_samples="
                             f"{self.min_samples}: a step cannot end for lack of evidence before it may pass")

    @property
    def step_samples_limit(self) -> int:
        """Rewards per arm in one step after which it ends without a verdict."""
        return self.max_step_samples if self.max_step_samples is not None else 5 * self.min_samples


@dataclass(frozen=True)
class ArmHealth:
    requests: int = 0
    errors: int = 0
    latencies: tuple[float, ...] = field(default=(), repr=False)  # seconds, ascending

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def p99_latency_s(self) -> float | None:
        if not self.latencies:
            return None
        return self.latencies[min(len(self.latencies) - 1, int(0.99 * len(self.latencies)))]

    def slower_than(self, limit_s: float) -> int:
        return sum(1 for latency in self.latencies if latency > limit_s)


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how surprising k events in n trials are if their rate is p."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        term = math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                        + i * log_p + (n - i) * log_q)
        total += term
        if i > n * p and term < 1e-16 * total:
            break  # past the mode the terms only shrink
    return min(1.0, total)


@dataclass(frozen=True)
class Evidence:
    """What the analysis saw at one look (per arm since the step began)."""

    challenger: ArmStats
    champion: ArmStats
    challenger_health: ArmHealth = ArmHealth()
    champion_health: ArmHealth = ArmHealth()
    kl: float | None = None


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    step: int  # the step index the decision was taken at
    weight: float  # the challenger weight after the decision
    comparison: Comparison
    verdict: Verdict = "pending"


def _guardrail(plan: RolloutPlan, evidence: Evidence) -> str | None:
    g, ch, cp = plan.guardrails, evidence.challenger_health, evidence.champion_health
    if g.max_kl is not None and evidence.kl is not None and evidence.kl > g.max_kl:
        return f"KL to the champion {evidence.kl:.3f} above {g.max_kl}"
    if min(ch.requests, cp.requests) < g.min_requests:
        return None
    allowed_rate = min(1.0, cp.error_rate + g.max_error_rate_increase)
    if (ch.error_rate > allowed_rate
            and binomial_tail(ch.errors, ch.requests, allowed_rate) < g.significance):
        return (f"error rate {ch.error_rate:.3f} vs champion {cp.error_rate:.3f} "
                f"(allowed +{g.max_error_rate_increase})")
    if ch.p99_latency_s is None or not cp.p99_latency_s:
        return None
    limit = g.max_p99_latency_ratio * cp.p99_latency_s
    slow = ch.slower_than(limit)
    if ch.p99_latency_s > limit and binomial_tail(slow, len(ch.latencies), 0.01) < g.significance:
        return (f"p99 latency {ch.p99_latency_s:.3f}s vs champion {cp.p99_latency_s:.3f}s "
                f"(allowed x{g.max_p99_latency_ratio}; {slow} of {len(ch.latencies)} answers slower)")
    return None


def decide(plan: RolloutPlan, step: int, step_started: float, now: float, evidence: Evidence) -> Decision:
    """The decision at step `step` (an index into `plan.steps`) given the evidence since it began."""
    comparison = compare(evidence.challenger, evidence.champion, plan.alpha, plan.tau)
    weight = plan.steps[step]
    broken = _guardrail(plan, evidence)
    if broken:
        return Decision("rollback", f"guardrail: {broken}", step, 0.0, comparison, "guardrail")
    if comparison.upper < 0:
        return Decision("rollback", f"challenger worse: reward difference in [{comparison.lower:.3f}, "
                        f"{comparison.upper:.3f}] (always-valid {1 - plan.alpha:.0%})", step, 0.0, comparison,
                        "worse")
    n_ch, n_cp = evidence.challenger.n, evidence.champion.n
    interval = f"difference in [{comparison.lower:.3f}, {comparison.upper:.3f}] on {n_ch}/{n_cp} rewards"
    enough = min(n_ch, n_cp) >= plan.min_samples
    if enough and comparison.lower > -plan.margin:
        reason = f"challenger no worse than -{plan.margin}: {interval}"
        if step == len(plan.steps) - 1:
            return Decision("promote", reason, step, 1.0, comparison, "passed")
        return Decision("advance", reason, step + 1, plan.steps[step + 1], comparison, "passed")
    # the evidence one more look could add: at full weight only the challenger's arm still grows (the
    # champion's may never reach min_samples there, e.g. a weight set to 1 by hand at the first step)
    gathered = n_ch if weight >= 1.0 else min(n_ch, n_cp)
    limit = _limit(plan, gathered, now - step_started) if gathered >= plan.min_samples else None
    if limit is not None:
        reason = f"no verdict after {limit}: {interval}, not confidently no worse than -{plan.margin}"
        if plan.on_timeout == "advance" and step < len(plan.steps) - 1:
            return Decision("advance", f"{reason} (on_timeout: advance)", step + 1, plan.steps[step + 1],
                            comparison, "inconclusive")
        return Decision("rollback", f"{reason} (on_timeout: rollback)", step, 0.0, comparison, "inconclusive")
    waiting = "" if enough else f" (a step needs {plan.min_samples} on each arm)"
    return Decision("hold", f"waiting: {interval}{waiting}", step, weight, comparison)


def _limit(plan: RolloutPlan, gathered: int, elapsed_s: float) -> str | None:
    """The step's limit that was reached, in words (None: none yet)."""
    if gathered >= plan.step_samples_limit:
        return f"{gathered} rewards per arm (max_step_samples {plan.step_samples_limit})"
    if plan.max_step_s is not None and elapsed_s >= plan.max_step_s:
        return f"{elapsed_s:.0f}s (max_step_s {plan.max_step_s:.0f})"
    return None
