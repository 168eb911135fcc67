from pathlib import Path

import pytest

from online_rl.config import load_settings
from online_rl.errors import ConfigError


def test_defaults_use_the_cache_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ORL_CONFIG", raising=False)
    monkeypatch.setenv("ORL_CACHE_DIR", str(tmp_path))
    settings = load_settings()
    assert settings.model_dir == tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert settings.mlflow_tracking_uri == f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    assert settings.kafka.bootstrap_servers is None


def test_environment_overrides_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text("kafka:\n  bootstrap_servers: 10.0.0.1:9092\nray:\n  num_cpus: 4\n")
    monkeypatch.setenv("ORL_RAY__NUM_CPUS", "8")
    settings = load_settings(config)
    assert settings.kafka.bootstrap_servers == "10.0.0.1:9092"
    assert settings.ray.num_cpus == 8


def test_bad_value_names_the_field_and_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORL_KAFKA__BOOTSTRAP_SERVERS", "localhost")
    with pytest.raises(ConfigError) as err:
        load_settings()
    message = str(err.value)
    assert "kafka.bootstrap_servers" in message
    assert "ORL_KAFKA__BOOTSTRAP_SERVERS" in message
    assert "host:port" in message


def test_unknown_yaml_key_is_rejected(tmp_path: Path) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text("kafak:\n  bootstrap_servers: x:1\n")
    with pytest.raises(ConfigError, match="kafak"):
        load_settings(config)


def test_missing_config_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.yaml")


def test_explicit_arguments_beat_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from online_rl.config import Settings

    monkeypatch.setenv("ORL_CACHE_DIR", "/elsewhere")
    assert Settings(cache_dir=tmp_path).cache_dir == tmp_path


@pytest.mark.parametrize(("yaml", "message"), [
    ("trainer:\n  gpus_per_worker: 1\n  critic_placement: shared\n",
     r"trainer.critic_placement=shared cannot share a GPU bundle .* set trainer.critic_placement=separate"),
    ("trainer:\n  workers: 2\n  gpus_per_worker: 0.5\n", r"trainer.gpus_per_worker=0.5 would put two ranks"),
    ("trainer:\n  kl_target: 1.0\n  kl_coef: 0\n", r"trainer.kl_coef=0 cannot adapt towards"),
    ("trainer:\n  eval_holdout: 0.7\n", r"trainer.eval_holdout"),
    ("trainer:\n  algorithm: grpo\n", r"trainer.algorithm"),
    ("hybrid:\n  fsdp: 3\n  tp: 2\n", r"hybrid.tp=2 must divide hybrid.dp × hybrid.fsdp = 3"),
    ("hybrid:\n  fsdp: 4\n  rollout_batch: 2\n", r"hybrid.rollout_batch=2 must be >= dp × fsdp = 4"),
])
def test_trainer_settings_that_cannot_work_are_refused(tmp_path: Path, yaml: str, message: str) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text(yaml)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)
