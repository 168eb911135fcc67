"""The `rewards` section of the settings: reward functions and weights, checked at start-up."""

from __future__ import annotations

from pathlib import Path

import pytest

from online_rl.config import load_settings
from online_rl.errors import ConfigError
from online_rl.flow import REWARD_MODEL, RewardFunctionSpec, RewardRule


def test_the_default_is_the_reward_model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ORL_CONFIG", raising=False)
    rewards = load_settings().rewards
    assert rewards.functions == []
    assert rewards.rule() == RewardRule({REWARD_MODEL: 1.0})


def test_functions_and_weights_from_yaml(tmp_path: Path) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text("rewards:\n"
                      "  functions:\n"
                      "    - {name: format, target: 'my_rewards:has_answer', weight: 0.5, gate: 1}\n"
                      "    - {name: judge, target: 'my_rewards:judge', batched: true, timeout_s: 30}\n"
                      "  weights: {feedback: 1.0}\n"
                      "  gate_failed: -1\n")
    rewards = load_settings(config).rewards
    assert rewards.functions == [RewardFunctionSpec("format", "my_rewards:has_answer", 0.5, gate=1.0),
                                 RewardFunctionSpec("judge", "my_rewards:judge", batched=True, timeout_s=30)]
    assert rewards.rule() == RewardRule({"feedback": 1.0, "format": 0.5, "judge": 1.0}, {"format": 1.0}, -1.0)


@pytest.mark.parametrize(("yaml", "message"), [
    ("functions: [{name: format, target: has_answer}]",
     "rewards.functions.0.target: Value error, 'has_answer' is not 'package.module:function'; write e.g."),
    ("functions: [{name: reward_model, target: 'm:f'}]",
     "rewards.functions.0.name: Value error, 'reward_model' is the name of a built-in source"),
    ("functions: [{name: f, target: 'm:f', timeout: 3}]", "rewards.functions.0.timeout: Unexpected keyword"),
    ("functions: [{name: f, target: 'm:f'}, {name: f, target: 'm:g'}]",
     "rewards: Value error, rewards.functions[1].name 'f' is also functions[0]'s; give each function"),
    ("weights: {format: 1}", "rewards.weights.format: only feedback and reward_model are weighted here"),
    ("weights: {feedback: 0}", "rewards.weights: no source has a weight above 0"),
])
def test_a_mistake_names_the_field_and_the_fix(tmp_path: Path, yaml: str, message: str) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text(f"rewards: {{{yaml}}}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(config)
    assert message in str(err.value)
