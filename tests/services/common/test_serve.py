"""Starting a service: the start-up check of API keys, and `python -m services.<name>` doing what
`online-rl serve <name>` does (its health URL announced, logging set up)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.ingest import new_key
from services.common.serve import Section, require_api_keys
from tests.services.feedback.conftest import free_port


@pytest.mark.parametrize(("section", "refused"), [("feedback_api", "write"), ("inference", "request"),
                                                   ("gateway", "request")])
def test_an_app_without_a_key_refuses_to_start_and_says_how_to_make_one(section: Section,
                                                                         refused: str) -> None:
    digest = new_key()[1]
    sections = ("feedback_api", "inference", "gateway")
    others = {other: {"api_keys": [digest]} for other in sections if other != section}
    with pytest.raises(ConfigError) as error:  # the other services' keys are not this one's
        require_api_keys(Settings(**others), section)  # type: ignore[arg-type]
    assert str(error.value) == (
        f"{section}.api_keys is empty, so every {refused} would be refused; create a key with "
        f"`online-rl keys new` and set its hash in {section}.api_keys (or api_keys_file)")
    require_api_keys(Settings(**{section: {"api_keys": [digest]}}), section)  # type: ignore[arg-type]


def test_python_m_announces_its_health_url_and_sets_up_logging(tmp_path: Path) -> None:
    port, health = free_port(), tmp_path / "health"
    env = {**os.environ, "ORL_CACHE_DIR": str(tmp_path / "cache"), "ORL_KAFKA__BOOTSTRAP_SERVERS": "",
           "ORL_HEALTH_FILE": str(health), "ORL_FEEDBACK_API__PORT": str(port),
           "ORL_FEEDBACK_API__API_KEYS": f'["{new_key()[1]}"]'}
    refused = subprocess.run([sys.executable, "-m", "services.feedback"], env=env | {"ORL_LOG_FORMAT": "xml"},
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "ORL_LOG_FORMAT='xml': use one of text, json" in refused.stderr
    server = subprocess.Popen([sys.executable, "-m", "services.feedback"],
                              env=env | {"ORL_LOG_FORMAT": "json"})
    try:
        deadline = time.monotonic() + 60
        while not health.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert health.read_text() == f"http://127.0.0.1:{port}/healthz\n"
        while time.monotonic() < deadline:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/healthz")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert answer.status_code == 200 and answer.json() == {"status": "ok"}
    finally:
        server.terminate()
        server.wait(timeout=30)
