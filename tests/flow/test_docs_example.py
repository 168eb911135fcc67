"""The example of docs/rewards.md, run as written: its Python file and its settings, taken from the
page, score three completions in a real Ray actor and combine with users' thumbs to the figures the
page states (1.5, 0, 1.5)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from online_rl.config import Settings
from online_rl.flow import FEEDBACK, RewardFunctions, combine

pytestmark = [pytest.mark.usefixtures("ray_runtime")]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"


def _example() -> tuple[str, str]:
    section = PAGE.read_text().split("## Example", 1)[1].split("\n## ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    settings = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert python and settings, "docs/rewards.md's example lost its python or yaml block"
    return python.group(1), settings.group(1)


def test_the_documented_example_runs_as_written(tmp_path: Path) -> None:
    code, settings_text = _example()
    assert len(code.strip().splitlines()) + len(settings_text.strip().splitlines()) <= 15
    (tmp_path / "my_rewards.py").write_text(code)
    settings = Settings(**yaml.safe_load(settings_text))
    path = os.pathsep.join([str(tmp_path), os.getcwd()])  # the page's file, as if in the working folder
    options = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}}
    completions = ["<answer>Paris</answer>", "Paris, I think.", "<answer>4</answer>"]
    with RewardFunctions(settings.rewards.functions, actor_options=options) as functions:
        scores = functions.score(["Capital of France?", "Capital of France?", "2 + 2?"], completions)
    assert scores.failures == []
    thumbs = [1.0, 1.0, None]  # thumbs up on the first two; no feedback on the third yet
    rewards = combine(settings.rewards.rule(), {FEEDBACK: thumbs, **scores.values})
    assert rewards == pytest.approx([1.5, 0.0, 1.5])  # what the page says each one gets
