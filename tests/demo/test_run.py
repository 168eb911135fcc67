"""What `run_demo` refuses before any traffic: feedback it cannot measure per version, and a loop that is
not up."""

from __future__ import annotations

from pathlib import Path

import pytest

from online_rl.config import Settings
from online_rl.demo import DemoError, DemoOptions, run_demo


def test_pairwise_feedback_is_refused_with_the_reason() -> None:
    with pytest.raises(DemoError, match=r"from thumbs or ratings, not 'pairwise'.*same version"):
        DemoOptions(kind="pairwise")
    assert DemoOptions(kind="rating").kind == "rating"


def test_without_a_running_loop_the_demo_says_how_to_start_it(tmp_path: Path) -> None:
    settings = Settings(launch={"run_dir": tmp_path / "run"})
    with pytest.raises(DemoError, match=r"the loop is not up .*start it with `online-rl up`"):
        run_demo(settings, tmp_path / "report", DemoOptions(), echo=lambda _: None)
    assert not (tmp_path / "report").exists()


def test_the_report_waits_only_for_a_version_the_gateway_has_not_acted_on() -> None:
    from online_rl.demo.run import settled

    idle = {"champion": {"version": None}, "rollout": None}
    assert settled(None, idle, [])  # nothing published
    assert not settled("3", idle, [])  # published as the traffic ended, no decision yet
    assert settled("3", idle, [{"version": "3", "action": "start"}])
    assert settled("3", idle, [{"version": "3", "action": "reject"}])  # a refusal is a decision too
    assert not settled("3", idle, [{"version": "2", "action": "start"}])
    assert settled("3", {"champion": {"version": "3"}, "rollout": None}, [])  # promoted already
    running = {"champion": {"version": "1"}, "rollout": {"status": "running", "challenger": "2"}}
    assert settled("3", running, [])  # waits for version 2's rollout, as it would with users
    ended = {"champion": {"version": "1"}, "rollout": {"status": "rolled_back", "challenger": "2"}}
    assert not settled("3", ended, [])
