"""The `online-rl` command line, run as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from online_rl.bus import Topics
from online_rl.bus.embedded import EmbeddedBus
from online_rl.events import TrainingSample, decode, encode
from tests.factories import interaction, thumbs


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


def test_hybrid_refuses_a_layout_that_cannot_work_before_starting_anything() -> None:
    result = _cli("hybrid", "--max-steps", "1", ORL_HYBRID__FSDP="3", ORL_HYBRID__TP="2")
    assert result.returncode == 2
    assert "hybrid.tp=2 must divide" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_config_is_a_message_not_a_traceback() -> None:
    result = _cli("config", ORL_RAY__NUM_CPUS="zero")
    assert result.returncode == 2
    assert "ray.num_cpus" in result.stderr
    assert "ORL_RAY__NUM_CPUS" in result.stderr
    assert "Traceback" not in result.stderr


def test_join_command_turns_feedback_into_samples_and_stops_cleanly(tmp_path: Path) -> None:
    env = {"ORL_CACHE_DIR": str(tmp_path), "ORL_KAFKA__BOOTSTRAP_SERVERS": ""}
    created = _cli("bus", "create-topics", "--partitions", "2", **env)
    assert created.returncode == 0, created.stderr
    assert "orl.samples: 2 partitions" in created.stdout

    bus = EmbeddedBus(tmp_path / "bus" / "bus.db")
    topics = Topics("orl")  # the default prefix
    INTERACTIONS, FEEDBACK, SAMPLES = topics.interactions, topics.feedback, topics.samples
    producer = bus.producer()
    now = time.time()
    producer.produce(INTERACTIONS, encode(interaction("req-1", created_at=now)), b"req-1")
    producer.produce(FEEDBACK, encode(thumbs("req-1", up=True, created_at=now + 0.1)), b"req-1")
    producer.flush()
    joiner = subprocess.Popen(
        [sys.executable, "-m", "online_rl.cli", "join", "--window", "0.5"],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        samples: list[TrainingSample] = []
        while not samples and time.monotonic() < deadline:
            samples = [decode(r.value, TrainingSample) for r in bus.read_all(SAMPLES, timeout=1.0)]
            time.sleep(0.2)
    finally:
        joiner.send_signal(signal.SIGTERM)
        out, err = joiner.communicate(timeout=60)
    assert joiner.returncode == 0, err[-2000:]
    assert "joiner stopped" in out
    assert [(s.sample_id, s.reward) for s in samples] == [("s-req-1", 1.0)]

    shown = _cli("bus", "tail", SAMPLES, **env)
    assert shown.returncode == 0 and '"sample_id":"s-req-1"' in shown.stdout


def test_keys_new_prints_a_key_and_its_hash() -> None:
    from online_rl.ingest import ApiKeyStore

    result = _cli("keys", "new", "--scopes", "feedback")
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(":", 1) for line in result.stdout.strip().splitlines())
    key, entry = lines["key"].strip(), lines["entry"].strip()
    info = ApiKeyStore([entry]).verify(key)
    assert info is not None and info.allows("feedback") and not info.allows("admin")
    assert key not in entry and info.subject is None
    bound = _cli("keys", "new", "--user", "alice@example.com")
    lines = dict(line.split(":", 1) for line in bound.stdout.strip().splitlines())
    info = ApiKeyStore([lines["entry"].strip()]).verify(lines["key"].strip())
    assert info is not None and info.subject == "alice@example.com" and info.allows("feedback")
    refused = _cli("keys", "new", "--user", "has spaces")
    assert refused.returncode == 2 and "not a user id" in refused.stderr and "Traceback" not in refused.stderr


def test_serve_feedback_refuses_to_start_without_keys(tmp_path: Path) -> None:
    result = _cli("serve", "feedback", ORL_CACHE_DIR=str(tmp_path), ORL_KAFKA__BOOTSTRAP_SERVERS="")
    assert result.returncode == 2
    assert "online-rl keys new" in result.stderr and "Traceback" not in result.stderr


def test_adapter_seal_then_verify_and_a_changed_file_is_named(tiny_model: Path, tmp_path: Path) -> None:
    from tests.factories import lora_adapter

    folder = lora_adapter(tiny_model, tmp_path / "hand-made", "tiny-llama", seal=False)
    unsealed = _cli("adapter", "verify", str(folder))
    assert unsealed.returncode == 2 and "no lineage.json" in unsealed.stderr
    sealed = _cli("adapter", "seal", str(folder), "--base", "tiny-llama")
    assert sealed.returncode == 0, sealed.stderr
    assert _cli("adapter", "verify", str(folder), "--base", "tiny-llama").returncode == 0
    made = _cli("keys", "signing", str(tmp_path / "signing.pem"))
    assert made.returncode == 0, made.stderr
    assert (tmp_path / "signing.pem").stat().st_mode & 0o077 == 0  # the private key: owner only
    public = dict(line.split(":", 1) for line in made.stdout.strip().splitlines())["public"].strip()
    again = _cli("keys", "signing", str(tmp_path / "signing.pem"))
    assert again.returncode == 2 and "exists" in again.stderr  # never overwritten
    unsigned = _cli("adapter", "verify", str(folder), "--signer", public)
    assert unsigned.returncode == 2 and "is not signed" in unsigned.stderr
    signed = _cli("adapter", "seal", str(folder), "--base", "tiny-llama",
                  "--sign", str(tmp_path / "signing.pem"))
    assert signed.returncode == 0 and public in signed.stdout, signed.stderr
    assert _cli("adapter", "verify", str(folder), "--signer", public).returncode == 0
    (folder / "adapter_config.json").write_text((folder / "adapter_config.json").read_text() + " ")
    changed = _cli("adapter", "verify", str(folder))
    assert changed.returncode == 2 and "adapter_config.json has sha256" in changed.stderr


def test_serve_inference_refuses_to_start_without_keys(tmp_path: Path) -> None:
    result = _cli("serve", "inference", ORL_CACHE_DIR=str(tmp_path), ORL_KAFKA__BOOTSTRAP_SERVERS="")
    assert result.returncode == 2
    assert "inference.api_keys is empty" in result.stderr and "Traceback" not in result.stderr
