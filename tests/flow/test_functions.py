"""Reward functions run in a real Ray actor: good ones score, bad rows fail alone, a hang or a crash
costs one call and the actor, which is replaced before the next batch.

The functions live in tests/flow/reward_fns.py; the actor imports them from the working folder, so run
pytest from the repository root.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from online_rl.flow import (
    FEEDBACK,
    Failure,
    RewardFunctionError,
    RewardFunctions,
    RewardFunctionSpec,
    RewardRule,
    combine,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_runtime")]
FNS = "tests.flow.reward_fns"


def _spec(name: str, function: str, **options: Any) -> RewardFunctionSpec:
    return RewardFunctionSpec(name, f"{FNS}:{function}", **options)


@pytest.fixture
def functions(request: pytest.FixtureRequest) -> Iterator[RewardFunctions]:
    with RewardFunctions(request.param) as made:
        yield made


def _reasons(failures: list[Failure]) -> dict[tuple[str, int], str]:
    return {(f.name, f.row): f.reason for f in failures}


@pytest.mark.parametrize("functions", [[
    _spec("format", "has_answer"), _spec("length", "lengths", batched=True),
    _spec("async_length", "async_lengths", batched=True), _spec("bonus", "async_echo_bonus"),
]], indirect=True)
def test_good_functions_score_a_batch(functions: RewardFunctions) -> None:
    completions = ["<answer>4</answer>", "four", ""]
    scores = functions.score(["2+2?"] * 3, completions, [{"bonus": 1.0}, {"bonus": 2.0}, {"bonus": 3.0}])
    assert scores.failures == []
    assert scores.values == {"format": [1.0, 0.0, 0.0], "length": [18.0, 4.0, 0.0],
                             "async_length": [19.0, 6.0, 3.0], "bonus": [1.0, 2.0, 3.0]}
    rule = RewardRule.from_specs(functions.specs[:1], {FEEDBACK: 1.0})
    assert combine(rule, {FEEDBACK: [1.0, None, 0.0], **scores.values}) == [2.0, 0.0, 0.0]
    assert functions.score([], [], []).values == {"format": [], "length": [], "async_length": [], "bonus": []}


@pytest.mark.parametrize("functions", [[
    _spec("row", "fails_on_bad"), _spec("batch", "batched_fails_on_bad", batched=True),
]], indirect=True)
def test_rows_that_raise_fail_alone(functions: RewardFunctions) -> None:
    scores = functions.score(["p"] * 4, ["ok", "bad", "fine", "bad too"])
    assert scores.values == {"row": [1.0, None, 1.0, None], "batch": [2.0, None, 2.0, None]}
    reasons = _reasons(scores.failures)
    assert sorted(reasons) == [("batch", 1), ("batch", 3), ("row", 1), ("row", 3)]
    assert reasons["row", 1].startswith("raised ValueError: cannot judge 'bad' (at reward_fns.py:")
    assert reasons["batch", 3].startswith("raised ValueError: a bad row in the batch (at reward_fns.py:")
    assert functions.restarts == 0


@pytest.mark.parametrize("functions", [[
    _spec("junk", "junk"), _spec("count", "one_score", batched=True),
]], indirect=True)
def test_what_is_not_one_finite_number_per_row_fails(functions: RewardFunctions) -> None:
    scores = functions.score(["p"] * 5, ["nan", "inf", "str", "none", "fine"])
    assert scores.values["junk"] == [None, None, None, None, 0.5]
    reasons = _reasons(scores.failures)
    assert [reasons["junk", row] for row in range(4)] == [
        "returned nan, not a finite number", "returned inf, not a finite number",
        "returned str 'high', not a number", "returned NoneType None, not a number"]
    assert scores.values["count"] == [None] * 5
    assert reasons["count", 0] == "returned 1 scores for 5 rows; return one per row"


@pytest.mark.parametrize("functions", [[
    _spec("pid", "pid"), _spec("slow", "hangs_on_slow", timeout_s=1.0),
]], indirect=True)
def test_a_hang_times_out_and_a_fresh_actor_scores_the_next_batch(functions: RewardFunctions) -> None:
    first_pid = functions.score(["p"], ["x"]).values["pid"][0]
    start = time.monotonic()
    scores = functions.score(["p"] * 3, ["a", "slow", "b"])
    assert time.monotonic() - start < 10  # about 1 s: the deadline, not the 1000 s the function sleeps
    assert scores.values["slow"] == [1.0, None, None]
    assert _reasons(scores.failures) == {
        ("slow", 1): "timed out after 1 s",
        ("slow", 2): "not called: slow timed out after 1 s on row 1 of this batch"}
    assert functions.restarts == 1
    again = functions.score(["p"] * 2, ["c", "d"])
    assert again.failures == [] and again.values["slow"] == [1.0, 1.0]
    assert again.values["pid"][0] != first_pid  # scored by a new process


@pytest.mark.parametrize("functions", [[_spec("crash", "crashes_on_crash")]], indirect=True)
def test_a_function_that_kills_its_process_costs_its_row_and_the_actor(functions: RewardFunctions) -> None:
    scores = functions.score(["p"] * 3, ["a", "crash", "b"])
    assert scores.values["crash"] == [1.0, None, None]
    assert _reasons(scores.failures)["crash", 1].startswith("crashed the process it ran in (")
    assert functions.restarts == 1
    assert functions.score(["p"] * 2, ["c", "d"]).values["crash"] == [1.0, 1.0]
    assert os.getpid()  # and this process is still here


def test_a_target_that_cannot_be_loaded_stops_the_start() -> None:
    specs = [_spec("format", "has_answer"), _spec("typo", "has_answr")]
    with pytest.raises(RewardFunctionError, match=r"rewards.functions\[1\].target: module 'tests.flow"
                                                  r".reward_fns' has no attribute 'has_answr'; .* "
                                                  r"\(function 'typo'\)"):
        RewardFunctions(specs)
