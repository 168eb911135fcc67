"""The one publish path: a training run's resolved config, hash and params, and the versions it
publishes with their complete lineage, against a real MLflow SQLite store."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus import TopicPartition
from online_rl.config import Settings
from online_rl.errors import ConfigError
from online_rl.events import Completion, Message, TrainingSample
from online_rl.hardware import PrecisionChoice
from online_rl.registry import (
    LINEAGE_NAME,
    LineageManifest,
    TrainingRun,
    VersionLineage,
    base_fingerprint,
    config_hash,
    new_signing_key,
    offset_ranges,
    resolved_config,
    run_params,
    served_by,
    verify_adapter_dir,
)
from tests.conftest import TINY_NAME
from tests.factories import lora_adapter

FP32 = PrecisionChoice(requested="auto", precision="fp32", reason="measured bf16 slower", machine="test cpu")
LORA = {"lora_rank": 4, "lora_alpha": 12, "lora_targets": ["q_proj", "v_proj"]}


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An unsealed PEFT adapter folder, as a driver's `save_adapter` writes it."""
    return lora_adapter(tiny_model, tmp_path_factory.mktemp("runs") / "adapter", TINY_NAME, seal=False)


def assert_complete_lineage(manifest: LineageManifest, tags: Mapping[str, str],
                            signer: str | None = None) -> None:
    """Every field the lineage contract asks of a published version (docs/architecture.md, Versions), in
    its lineage.json (`manifest`) and as its MLflow version tags; `signer`: the key that must have signed."""
    assert manifest.base_model and manifest.base_model_sha256 and len(manifest.base_model_sha256) == 64
    assert manifest.offsets and all(first < end for parts in manifest.offsets.values()
                                    for first, end in parts.values()), manifest.offsets
    assert manifest.behaviour_versions and manifest.reward_mapping_version, manifest
    assert manifest.config_hash and len(manifest.config_hash) == 16 and manifest.kl_anchor, manifest
    if signer is not None:
        assert manifest.signer == signer and manifest.signature
    expected = {"base_model": manifest.base_model, "base_model_sha256": manifest.base_model_sha256,
                "adapter_sha256": manifest.adapter_sha256, "config_hash": manifest.config_hash,
                "behaviour_versions": ",".join(manifest.behaviour_versions),
                "reward_mapping_version": manifest.reward_mapping_version,
                "parent_version": manifest.parent_version or "", "kl_anchor": manifest.kl_anchor,
                "signer": manifest.signer or "", "signature": manifest.signature or ""}
    assert {key: tags.get(key) for key in expected} == expected
    assert tags["offsets"] == ";".join(f"{topic}/{part}:{first}-{end}"
                                       for topic, parts in sorted(manifest.offsets.items())
                                       for part, (first, end) in sorted(parts.items()))


def _settings(tmp_path: Path, model: Path, **mlflow: Any) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        model={"name": TINY_NAME, "path": model},  # type: ignore[arg-type]
        mlflow={"registered_model": "policy", **mlflow},  # type: ignore[arg-type]
        trainer=LORA | {"seed": 3},  # type: ignore[arg-type]
    )


def _sample(behaviour: list[str | None], mapping: str = "map-v2") -> TrainingSample:
    completion = Completion(request_id="r", text="-", token_ids=[5], logprobs=[-1.0])
    return TrainingSample(sample_id="s", kind="single", model=TINY_NAME, user_id="u",
                          prompt=[Message(role="user", content="q")], prompt_token_ids=[1, 2],
                          completion=completion, reward=1.0, reward_mapping_version=mapping,
                          behaviour_versions=behaviour, created_at=1.0)


# -- pure parts ------------------------------------------------------------------------------------
def test_offset_ranges_cover_what_was_read_since_the_last_publish() -> None:
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    now = {a0: 10, a1: 4, b0: 7}
    published = {a0: 6, a1: 4}  # b0 is new since then: it starts at 0; a1 read nothing new
    assert offset_ranges(now, published) == {"a": {"0": [6, 10]}, "b": {"0": [0, 7]}}
    assert offset_ranges(published, published) == {}


def test_the_hybrid_config_carries_the_adapter_shape_so_its_hash_follows_it(tmp_path: Path) -> None:
    settings = _settings(tmp_path, tmp_path)
    config = resolved_config(settings, settings.hybrid, FP32)
    # the adapter the hybrid trains is configured under trainer.*: it is part of the hybrid's config
    assert {k: config[k] for k in LORA} == LORA and config["seed"] == 3
    assert config["base_model"] == TINY_NAME and config["precision_resolved"] == "fp32"
    assert config["rollout_batch"] == settings.hybrid.rollout_batch
    digest = config_hash(config)
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert config_hash(dict(reversed(list(config.items())))) == digest  # canonical: key order is not
    for change in ({"lora_rank": 8}, {"lora_alpha": 16}, {"lora_targets": ["q_proj"]}):
        other = settings.model_copy(update={"trainer": settings.trainer.model_copy(update=change)})
        assert config_hash(resolved_config(other, other.hybrid, FP32)) != digest, change
    assert config_hash(resolved_config(settings, settings.hybrid)) != digest  # precision unresolved


def test_params_are_flat_strings_within_mlflows_limits() -> None:
    params = run_params({"lora_targets": ["q_proj", "v_proj"], "cold_start": None, "beta": 0.1,
                         "long": "x" * 7000}, FP32)
    assert params["lora_targets"] == '["q_proj", "v_proj"]' and params["cold_start"] == "None"
    assert params["beta"] == "0.1" and len(params["long"]) == 6000
    assert params["precision_reason"] == "measured bf16 slower" and params["machine"] == "test cpu"


def test_the_base_model_serves_as_base_in_the_lineage() -> None:
    assert served_by(_sample([None, "policy-v3"])) == {"base", "policy-v3"}


# -- a run against the real store -----------------------------------------------------------------
def test_a_published_version_carries_its_complete_signed_lineage(tiny_model: Path, adapter: Path,
                                                                 tmp_path: Path) -> None:
    pem, public = new_signing_key()
    (tmp_path / "signing.pem").write_bytes(pem)
    settings = _settings(tmp_path, tiny_model, signing_key_file=tmp_path / "signing.pem")
    run = TrainingRun.open(settings, "hybrid", FP32)
    client = run.client

    mlflow_run = client.get_run(run.run_id)
    assert mlflow_run.data.tags["component"] == "hybrid"
    assert mlflow_run.data.tags["config_hash"] == run.config_hash
    assert mlflow_run.data.tags["base_model"] == TINY_NAME
    params = mlflow_run.data.params
    assert params["lora_rank"] == "4" and params["lora_alpha"] == "12"
    assert json.loads(params["lora_targets"]) == ["q_proj", "v_proj"]
    assert params["base_model"] == TINY_NAME and params["precision_resolved"] == "fp32"
    assert params["precision"] == settings.hybrid.precision and params["machine"] == "test cpu"
    assert params["rollout_batch"] == str(settings.hybrid.rollout_batch)
    assert run.config_hash == config_hash(resolved_config(settings, settings.hybrid, FP32))

    run.log_metrics({"reward": 0.5, "kl": 1.25}, step=1, prefix="hybrid_")
    assert run.flush(30)
    assert [m.value for m in client.get_metric_history(run.run_id, "hybrid_kl")] == [1.25]

    samples = [_sample([None, "policy-v1"]), _sample(["policy-v1"], "map-v3")]
    lineage = VersionLineage(
        offsets=offset_ranges({TopicPartition("orl.samples", 0): 9, TopicPartition("orl.samples", 1): 4},
                              {TopicPartition("orl.samples", 0): 2}),
        behaviour_versions=set().union(*(served_by(s) for s in samples)),
        reward_mapping_versions={s.reward_mapping_version for s in samples},
        parent_version="policy-v1", eval={"train_reward": 0.5}, kl_anchor="base")
    sealed: list[dict[str, Any]] = []

    def save(folder: Path) -> None:
        shutil.copytree(adapter, folder)

    def then(folder: Path) -> None:
        sealed.append(json.loads((folder / LINEAGE_NAME).read_text()))

    published = run.publish(save, lineage, artifact_path="hybrid/step-000000001", then=then)
    run.close()
    assert client.get_run(run.run_id).info.status == "FINISHED"
    assert published.version == "1" and published.alias == "challenger"
    assert str(client.get_model_version_by_alias("policy", "challenger").version) == "1"

    # lineage.json, as the registry serves it: verified, signed by the run's key, every field there
    folder = Path(client.download_artifacts(run.run_id, "hybrid/step-000000001", str(tmp_path / "dl")))
    manifest = verify_adapter_dir(folder, TINY_NAME, [public])
    assert sealed and sealed[0]["signature"] == manifest.signature
    assert manifest.base_model == TINY_NAME
    assert manifest.base_model_sha256 == base_fingerprint(tiny_model)
    assert manifest.base_model_sha256 is not None and len(manifest.base_model_sha256) == 64
    assert manifest.offsets == {"orl.samples": {"0": [2, 9], "1": [0, 4]}}
    assert manifest.behaviour_versions == ["base", "policy-v1"]
    assert manifest.reward_mapping_version == "map-v2,map-v3"
    assert manifest.parent_version == "policy-v1" and manifest.kl_anchor == "base"
    assert manifest.config_hash == run.config_hash and manifest.eval == {"train_reward": 0.5}
    assert manifest.signer == public and manifest.signature

    # ... and the same fields as the version's tags (what the MLflow UI and the gateway read)
    tags = client.get_model_version("policy", "1").tags
    assert tags["base_model"] == TINY_NAME and tags["base_model_sha256"] == manifest.base_model_sha256
    assert tags["adapter_sha256"] == manifest.adapter_sha256
    assert tags["offsets"] == "orl.samples/0:2-9;orl.samples/1:0-4"
    assert tags["behaviour_versions"] == "base,policy-v1"
    assert tags["reward_mapping_version"] == "map-v2,map-v3"
    assert tags["parent_version"] == "policy-v1" and tags["config_hash"] == run.config_hash
    assert tags["kl_anchor"] == "base" and tags["eval.train_reward"] == "0.5"
    assert tags["signer"] == public and tags["signature"] == manifest.signature
    assert_complete_lineage(manifest, tags, public)


def test_an_unsigned_run_publishes_unsigned_versions(tiny_model: Path, adapter: Path, tmp_path: Path) -> None:
    settings = _settings(tmp_path, tiny_model)
    run = TrainingRun.open(settings, "trainer", FP32)
    assert run.config["lora_targets"] == LORA["lora_targets"] and run.signing_key is None
    lineage = VersionLineage(offsets={"s": {"0": [0, 1]}}, behaviour_versions={"base"},
                             reward_mapping_versions={"m"}, parent_version=None)
    run.publish(lambda folder: shutil.copytree(adapter, folder), lineage, "adapters/step-000000001",
                alias=None)
    run.close(failed=True)
    run.close()  # a second close changes nothing
    assert run.client.get_run(run.run_id).info.status == "FAILED"
    version = run.client.get_model_version("policy", "1")
    assert version.tags["signer"] == "" and version.tags["signature"] == ""
    assert version.tags["parent_version"] == "" and version.tags["base_model_sha256"]
    stored = json.loads(Path(run.client.download_artifacts(
        run.run_id, f"adapters/step-000000001/{LINEAGE_NAME}", str(tmp_path / "dl"))).read_text())
    assert "signature" not in stored and stored["parent_version"] is None


def test_a_bad_signing_key_fails_the_start_before_any_run_exists(tiny_model: Path, tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a key")
    settings = _settings(tmp_path, tiny_model, signing_key_file=tmp_path / "bad.pem")
    with pytest.raises(ConfigError, match=r"mlflow.signing_key_file: cannot read .*online-rl keys signing"):
        TrainingRun.open(settings, "trainer", FP32)
    from online_rl.tracking import mlflow_client

    client = mlflow_client(settings)
    assert client.get_experiment_by_name(settings.trainer.experiment) is None  # nothing half-made


def test_metrics_wait_out_an_mlflow_outage_in_order_without_holding_up_the_step(
        tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tracking server stops answering (here: nothing listens at its address): logging a step's
    metrics neither raises nor waits; the rows wait, and reach the run in order once it answers."""
    import socket
    import time

    from mlflow import MlflowClient

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    run = TrainingRun.open(_settings(tmp_path, tiny_model), "hybrid", FP32)
    client = run.client
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    run.client = MlflowClient(tracking_uri=dead, registry_uri=dead)
    started = time.monotonic()
    for step in range(1, 6):
        run.log_metrics({"loss": float(step)}, step=step)
    assert time.monotonic() - started < 1.0  # the step never waits for MLflow
    assert not run.flush(3) and run.metrics_waiting == 5
    run.client = client  # the server answers again
    assert run.flush(60) and run.metrics_waiting == 0
    rows = sorted(client.get_metric_history(run.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in rows] == [(s, float(s)) for s in range(1, 6)]
    run.close()
    assert client.get_run(run.run_id).info.status == "FINISHED"


def test_a_metric_batch_mlflow_refuses_is_dropped_and_does_not_block_the_next(
        tiny_model: Path, tmp_path: Path) -> None:
    """A refusal is not an outage: retrying a batch MLflow refuses (a name it does not accept) would hold
    every later row behind it, so it is dropped and counted; the rows batched with it and after it arrive."""
    run = TrainingRun.open(_settings(tmp_path, tiny_model), "hybrid", FP32)
    # MLflow refuses metric names with these characters; one call puts both rows in the same batch
    run.log_metrics({"bad name!?": 1.0, "loss": 1.0}, step=1)
    run.log_metrics({"loss": 2.0}, step=2)
    assert run.flush(60)
    rows = sorted(run.client.get_metric_history(run.run_id, "loss"), key=lambda m: m.step)
    assert [(m.step, m.value) for m in rows] == [(1, 1.0), (2, 2.0)]
    assert run.metrics_dropped == 1
    run.close()
