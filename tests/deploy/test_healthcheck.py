"""`online-rl healthcheck`, the images' HEALTHCHECK, against a real HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from online_rl.cli.health import announce_health
from tests.test_cli import _cli


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_announced_url_is_checked(server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "health"
    monkeypatch.setenv("ORL_HEALTH_FILE", str(file))
    announce_health(f"{server}/healthz")  # what `serve ...` does at start in the image
    ok = _cli("healthcheck", ORL_HEALTH_FILE=str(file))
    assert ok.returncode == 0 and "healthy" in ok.stdout
    sick = _cli("healthcheck", f"{server}/readyz")
    assert sick.returncode == 1 and "answered 503" in sick.stderr
    gone = _cli("healthcheck", "http://127.0.0.1:9/healthz")
    assert gone.returncode == 1 and "unhealthy" in gone.stderr


def test_a_component_without_an_endpoint_is_healthy_while_it_runs(tmp_path: Path) -> None:
    result = _cli("healthcheck", ORL_HEALTH_FILE=str(tmp_path / "none"))
    assert result.returncode == 0 and "no health URL" in result.stdout


@pytest.mark.slow
def test_the_joiner_beats_while_it_runs_and_a_stale_heartbeat_is_unhealthy(tmp_path: Path) -> None:
    """The joiner's liveness probe (the chart's exec probe), against a real joiner on the embedded bus."""
    import os
    import signal
    import subprocess
    import sys
    import time

    beat = tmp_path / "heartbeat"
    env = {**os.environ, "ORL_CACHE_DIR": str(tmp_path / "cache"), "ORL_HEARTBEAT_FILE": str(beat)}
    env.pop("ORL_KAFKA__BOOTSTRAP_SERVERS", None)
    assert _cli("healthcheck", ORL_HEARTBEAT_FILE=str(beat)).returncode == 1  # no heartbeat yet
    joiner = subprocess.Popen([sys.executable, "-m", "online_rl.cli", "join"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not beat.exists():
            assert joiner.poll() is None and time.monotonic() < deadline, "the joiner never beat"
            time.sleep(0.5)
        first = beat.stat().st_mtime
        time.sleep(6)
        assert beat.stat().st_mtime > first  # it keeps beating while it runs
        alive = _cli("healthcheck", "--heartbeat-age", "120", ORL_HEARTBEAT_FILE=str(beat))
        assert alive.returncode == 0 and "heartbeat" in alive.stdout
    finally:
        joiner.send_signal(signal.SIGTERM)
        assert joiner.wait(timeout=60) == 0
    old = time.time() - 600
    os.utime(beat, (old, old))  # a loop stuck for ten minutes
    stuck = _cli("healthcheck", "--heartbeat-age", "120", ORL_HEARTBEAT_FILE=str(beat))
    assert stuck.returncode == 1 and "old" in stuck.stderr
