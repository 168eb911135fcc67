"""The `online-rl` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "online_rl.cli", *args],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=120,
    )


def test_version_lists_the_components() -> None:
    result = _cli("version", "--json")
    assert result.returncode == 0, result.stderr
    versions = json.loads(result.stdout)
    assert versions["online-rl"] == "0.1.0"
    assert versions["torch"] == "2.13.0"
    assert "ray" in versions and "mlflow" in versions


def test_bad_config_is_a_message_not_a_traceback() -> None:
    result = _cli("config", ORL_RAY__NUM_CPUS="zero")
    assert result.returncode == 2
    assert "ray.num_cpus" in result.stderr
    assert "ORL_RAY__NUM_CPUS" in result.stderr
    assert "Traceback" not in result.stderr
