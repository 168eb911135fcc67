"""Rewards as code, the pure part: specs, loading a target, and the rule that combines the sources."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from online_rl.errors import ConfigError
from online_rl.flow import (
    FEEDBACK,
    REWARD_MODEL,
    FlowError,
    RewardFunctionError,
    RewardFunctionSpec,
    RewardRule,
    RewardRuleError,
    combine,
    load_reward_function,
)
from tests.flow import reward_fns

# -- loading ------------------------------------------------------------------------------------------


def test_a_target_loads_the_function() -> None:
    assert load_reward_function("tests.flow.reward_fns:has_answer") is reward_fns.has_answer
    method = load_reward_function("tests.flow.reward_fns:has_answer.__call__")
    assert method("", "<answer>4</answer>", {}) == 1.0


@pytest.mark.parametrize(("target", "message"), [
    ("tests.flow.no_such_module:f", "rewards.functions[0].target: no module named 'tests.flow.no_such_"
                                    "module' (from 'tests.flow.no_such_module:f'); install it, or put"),
    ("tests.flow.reward_fns:missing", "rewards.functions[0].target: module 'tests.flow.reward_fns' has no "
                                      "attribute 'missing'; check the name after the colon"),
    ("tests.flow.reward_fns:NOT_CALLABLE", "'tests.flow.reward_fns:NOT_CALLABLE' is a int, not a function; "
                                           "point it at a function (prompt, completion, meta) -> float"),
    ("tests.flow.reward_fns.has_answer", "is not 'package.module:function'; write e.g."),
])
def test_a_bad_target_is_a_config_error_naming_the_field_and_the_fix(target: str, message: str) -> None:
    with pytest.raises(RewardFunctionError) as err:
        load_reward_function(target, "rewards.functions[0].target")
    assert isinstance(err.value, ConfigError)
    assert message in str(err.value)


def test_a_module_that_raises_on_import_is_named() -> None:
    with pytest.raises(RewardFunctionError, match=r"t: importing 'tests.flow.broken_on_import' raised "
                                                  r"RuntimeError: broken on purpose; fix the module"):
        load_reward_function("tests.flow.broken_on_import:f", "t")


def test_a_spec_checks_its_fields() -> None:
    spec = RewardFunctionSpec("format", "my.rewards:fmt", weight=0.5, gate=1.0)
    assert (spec.weight, spec.batched, spec.timeout_s, spec.gate) == (0.5, False, 10.0, 1.0)
    for bad, field in [({"name": "feedback"}, "built-in source"), ({"target": "fmt"}, "package.module"),
                       ({"weight": -1.0}, "greater than or equal to 0"), ({"timeout_s": 0}, "greater than 0"),
                       ({"gate": math.nan}, "finite number")]:
        with pytest.raises(ValidationError, match=field):
            RewardFunctionSpec(**{"name": "format", "target": "my.rewards:fmt", **bad})


# -- the rule -----------------------------------------------------------------------------------------


def test_a_weighted_sum_of_the_sources() -> None:
    rule = RewardRule({FEEDBACK: 1.0, "format": 0.5})
    assert combine(rule, {FEEDBACK: [1.0, 0.0], "format": [1.0, 1.0], "unused": [9.0]}) == [1.5, 0.5]


def test_a_missing_score_leaves_the_others_renormalised_and_none_when_all_are_missing() -> None:
    rule = RewardRule({FEEDBACK: 2.0, REWARD_MODEL: 1.0, "format": 1.0})
    scores = {FEEDBACK: [None, 1.0, None, math.nan], REWARD_MODEL: [0.5, 0.5, None, None],
              "format": [1.0, 1.0, None, 1.0]}
    # row 0: (0.5 + 1) scaled from weight 2 to 4; row 1: all there; row 2: nothing; row 3: NaN is no score
    assert combine(rule, scores) == [3.0, 3.5, None, 4.0]


def test_gates_come_first() -> None:
    rule = RewardRule({REWARD_MODEL: 1.0, "format": 0.0}, {"format": 1.0, "length": 0.0}, gate_failed=-1.0)
    scores = {REWARD_MODEL: [0.7, 0.7, 0.7, 0.7, None], "format": [1.0, 0.0, None, 0.0, 1.0],
              "length": [5.0, 5.0, 5.0, None, 5.0]}
    # passes both; fails format; format unknown: cannot judge; fails format, length unknown: still fails;
    # passes, but no weighted score
    assert combine(rule, scores) == [0.7, -1.0, None, -1.0, None]


def test_combine_needs_every_source_of_the_rule_with_one_score_per_row() -> None:
    rule = RewardRule({FEEDBACK: 1.0}, gates={"format": 1.0})
    with pytest.raises(FlowError, match=r"no scores for \['format'\]; pass every source"):
        combine(rule, {FEEDBACK: [1.0]})
    with pytest.raises(FlowError, match="different numbers of rows"):
        combine(rule, {FEEDBACK: [1.0], "format": [1.0, 1.0]})
    assert combine(rule, {FEEDBACK: [], "format": []}) == []


def test_a_rule_from_specs_and_its_mistakes() -> None:
    specs = [RewardFunctionSpec("format", "m:f", weight=0.0, gate=1.0), RewardFunctionSpec("length", "m:g")]
    rule = RewardRule.from_specs(specs, {FEEDBACK: 1.0}, gate_failed=-1.0)
    assert rule == RewardRule({FEEDBACK: 1.0, "format": 0.0, "length": 1.0}, {"format": 1.0}, -1.0)
    assert rule.sources == (FEEDBACK, "format", "length")
    assert RewardRule.from_specs([]).weights == {REWARD_MODEL: 1.0}
    with pytest.raises(RewardRuleError, match=r"functions\[1\].name 'format' is also functions\[0\]'s"):
        RewardRule.from_specs([specs[0], specs[0]])
    with pytest.raises(RewardRuleError, match=r"weights\.format: only feedback and reward_model"):
        RewardRule.from_specs(specs, {"format": 1.0})
    with pytest.raises(RewardRuleError, match="no source has a weight above 0"):
        RewardRule.from_specs(specs[:1], {})
    with pytest.raises(RewardRuleError, match="a weight is >= 0"):
        RewardRule({FEEDBACK: -1.0, REWARD_MODEL: 1.0})
    with pytest.raises(RewardRuleError, match=r"gates\['format'\] = nan: write a finite number"):
        RewardRule({FEEDBACK: 1.0}, {"format": math.nan})
