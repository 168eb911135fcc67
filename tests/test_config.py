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


def test_unset_consumer_groups_are_named_after_the_topic_prefix(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    assert load_settings().trainer.group_id == "orl-trainer"  # the default prefix keeps the names
    config = tmp_path / "c.yaml"
    config.write_text("bus:\n  topic_prefix: team-a\njoin:\n  group_id: joiners\n")
    monkeypatch.setenv("ORL_HYBRID__GROUP_ID", "hybrid-of-mine")
    settings = load_settings(config)
    assert settings.trainer.group_id == "team-a-trainer"
    assert (settings.join.group_id, settings.hybrid.group_id) == ("joiners", "hybrid-of-mine")  # set: kept
    monkeypatch.setenv("ORL_BUS__TOPIC_PREFIX", "team-b")
    assert load_settings().join.group_id == "team-b-joiner"


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
    ("trainer:\n  cold_start_kl_target: 0.02\n",
     r"trainer.cold_start_kl_target adapts .* set trainer.cold_start_loss=kl"),
    ("trainer:\n  cold_start_loss: kl\n  cold_start_kl_coef: 0\n  cold_start_kl_target: 0.02\n",
     r"a starting trainer.cold_start_kl_coef above 0"),
    ("trainer:\n  pair_thumbs: true\n  algorithm: kto\n",
     r"trainer.pair_thumbs makes DPO pairs .* trainer.algorithm=kto .* set trainer.algorithm=auto"),
    ("trainer:\n  ability_shrink: [0.25, 0.5]\n", r"trainer.ability_shrink=\[0.25, 0.5\] must be decreasing"),
    ("trainer:\n  ability_shrink: [1.0]\n", r"shares in \(0, 1\) of the change to keep, e.g. \[0.5, 0.25\]"),
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


@pytest.mark.parametrize(("yaml", "message"), [
    ("kafka:\n  security_protocol: SASL_SSL\n",
     r"kafka.sasl_mechanism is required with security_protocol SASL_SSL"),
    ("kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n  sasl_username: u\n",
     r"kafka.sasl_username and kafka.sasl_password are required .* ORL_KAFKA__SASL_PASSWORD"),
    ("kafka:\n  sasl_mechanism: PLAIN\n",
     r"security_protocol is PLAINTEXT; set security_protocol to SASL_SSL"),
    ("kafka:\n  ssl_ca_location: /ca.pem\n", r"kafka.ssl_\* is set but security_protocol is PLAINTEXT"),
    ("kafka:\n  security_protocol: SSL\n  ssl_key_location: /k.pem\n", r"go together"),
    ("kafka:\n  client:\n    sasl.password: x\n",
     r"kafka.client.sasl.password is set by .* use kafka.sasl_password"),
    ("kafka:\n  security_protocol: TLS\n", r"kafka.security_protocol"),
])
def test_kafka_security_settings_that_cannot_work_are_refused(tmp_path: Path, yaml: str,
                                                              message: str) -> None:
    config = tmp_path / "orl.yaml"
    config.write_text(yaml)
    with pytest.raises(ConfigError, match=message):
        load_settings(config)


def test_kafka_security_reaches_the_client_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    config = tmp_path / "orl.yaml"
    config.write_text("kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n"
                      f"  sasl_username: joiner\n  ssl_ca_location: {ca}\n"
                      "  client:\n    client.id: orl-joiner\n")
    monkeypatch.setenv("ORL_KAFKA__SASL_PASSWORD", "from-a-secret")
    settings = load_settings(config)
    assert "from-a-secret" not in repr(settings.kafka)  # a secret, never printed
    with pytest.raises(ConfigError, match=f"kafka.ssl_ca_location: {ca} is not a readable file"):
        settings.kafka.client_options()
    ca.write_text("a CA")
    assert settings.kafka.client_options() == {
        "security.protocol": "sasl_ssl", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "joiner",
        "sasl.password": "from-a-secret", "ssl.ca.location": str(ca), "client.id": "orl-joiner"}


def test_trusted_signers_come_as_a_json_list_or_separated_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = "A" * 43 + "=", "B" * 42 + "A="
    for text in (f'["{one}", "{two}"]', f"{one},{two}", f"{one} {two}\n"):
        monkeypatch.setenv("ORL_MLFLOW__TRUSTED_SIGNERS", text)
        assert load_settings().mlflow.trusted_signers == [one, two]
