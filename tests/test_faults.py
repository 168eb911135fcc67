"""Failpoints (online_rl/faults.py): inert unless armed; armed, they SIGKILL at the named hit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from online_rl.faults import ENV, POINTS, failpoint


def test_an_unarmed_failpoint_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    for point in POINTS:
        failpoint(point)
    monkeypatch.setenv(ENV, "trainer.before_commit")
    failpoint("trainer.mid_step")  # another point is armed: nothing here


def test_a_misspelt_point_is_named_with_the_points_there_are(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, "trainer.mid_stepp")
    with pytest.raises(ValueError, match=r"'trainer.mid_stepp'.*trainer.mid_step"):
        failpoint("trainer.mid_step")
    monkeypatch.setenv(ENV, "trainer.mid_step@x")
    with pytest.raises(ValueError, match=r"POINT@N"):
        failpoint("trainer.mid_step")


def test_an_armed_point_kills_the_process_at_its_nth_hit() -> None:
    code = ("import sys\nfrom online_rl.faults import failpoint\n"
            "for i in range(5):\n    print(i, flush=True)\n    failpoint('trainer.mid_step')\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, ENV: "trainer.mid_step@3"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]  # died at the third hit, before the fourth line
