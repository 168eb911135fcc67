"""Test harness: starts the real components the tests need, once per session.

- Kafka: `$ORL_TEST_KAFKA_BOOTSTRAP` if set, else a real broker started with
  deploy/local/kafka/kafka.sh on port `$ORL_TEST_KAFKA_PORT` (19092) and stopped at the end. With
  pytest-xdist (`-n N`) the controller starts it before the workers, which share it.
- The embedded model: prepared (or found valid) in the configured cache folder.
- Ray: a local runtime, shut down at the end.
- MLflow: a fresh SQLite store per test under tmp_path.
- Precision: float32 for every component unless a test asks for another. The tests compare served
  log-probabilities and trained adapters with float32 recomputations, and `precision: auto` picks
  bfloat16 on a CPU where it measures faster (an AMD EPYC with avx512_bf16 did): the choice itself is
  tested in tests/test_hardware.py, the bf16 paths by the tests that set it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus import Bus
from online_rl.bus.embedded import EmbeddedBus
from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings, load_settings
from online_rl.ports import free_port
from tests.factories import BusFactory, lora_adapter

ROOT = Path(__file__).resolve().parents[1]
for _section in ("TRAINER", "INFERENCE", "HYBRID"):  # inherited by the services the tests start, too
    os.environ.setdefault(f"ORL_{_section}__PRECISION", "fp32")
KAFKA_SCRIPT = ROOT / "deploy" / "local" / "kafka" / "kafka.sh"
TINY_NAME = "tiny-llama"  # the base model id the tiny model is served and trained as


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests (marked `anyio`) run on asyncio, like the services."""
    return "asyncio"


def _kafka_env() -> dict[str, str]:
    return {**os.environ, "ORL_KAFKA_PORT": os.environ.get("ORL_TEST_KAFKA_PORT", "19092")}


def _start_kafka() -> tuple[str, bool]:
    """Start the test broker (or find it running): its bootstrap, and whether it ran before."""
    env = _kafka_env()
    status = subprocess.run(["bash", str(KAFKA_SCRIPT), "status"], env=env, capture_output=True)
    started = subprocess.run(
        ["bash", str(KAFKA_SCRIPT), "start"], env=env, capture_output=True, text=True, timeout=300
    )
    if started.returncode != 0:
        raise RuntimeError(f"could not start the Kafka broker:\n{started.stderr}")
    return started.stdout.strip().splitlines()[-1], status.returncode == 0


def _stop_kafka() -> None:
    subprocess.run(["bash", str(KAFKA_SCRIPT), "stop"], env=_kafka_env(), capture_output=True, timeout=60)


_STARTED_KAFKA = pytest.StashKey[bool]()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist the workers would each start the broker on the same port: the controller
    starts it once, before the workers exist, and they inherit its address."""
    distributed = getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput")
    if distributed and not os.environ.get("ORL_TEST_KAFKA_BOOTSTRAP"):
        bootstrap, already_running = _start_kafka()
        os.environ["ORL_TEST_KAFKA_BOOTSTRAP"] = bootstrap
        config.stash[_STARTED_KAFKA] = not already_running


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_STARTED_KAFKA, False):
        _stop_kafka()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap servers of a real Kafka broker."""
    configured = os.environ.get("ORL_TEST_KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    try:
        bootstrap, already_running = _start_kafka()
    except RuntimeError as error:
        pytest.fail(str(error))
    yield bootstrap
    if not already_running:
        _stop_kafka()


class Broker:
    """A broker of this test's own, which the test stops and restarts (same data)."""

    def __init__(self, **env: str) -> None:
        port = free_port()
        self.env = {**os.environ, "ORL_KAFKA_PORT": str(port), "ORL_KAFKA_CONTROLLER_PORT": str(free_port()),
                    **env}
        self.bootstrap = f"127.0.0.1:{port}"

    def run(self, action: str) -> None:
        result = subprocess.run(["bash", str(KAFKA_SCRIPT), action], env=self.env, capture_output=True,
                                text=True, timeout=180)
        if result.returncode != 0:
            log = Path(result.stderr.rsplit("see ", 1)[-1].strip().rstrip(";"))
            tail = "\n".join(log.read_text().splitlines()[-40:]) if log.is_file() else ""
            raise AssertionError(f"{result.stderr}\n{tail}")


@pytest.fixture
def broker() -> Iterator[Broker]:
    own = Broker()
    own.run("start")
    yield own
    own.run("reset")


class SecuredBroker(Broker):
    """A broker whose only client listener asks for TLS and SASL SCRAM-SHA-512."""

    user, password = "orl-test", "orl-test-password"

    def __init__(self, tls: Path) -> None:
        super().__init__(ORL_KAFKA_SCRAM_USERS=f"{self.user}:{self.password}", ORL_KAFKA_TLS_DIR=str(tls))
        self.ca = tls / "ca.pem"

    def kafka_settings(self, password: str | None = None) -> dict[str, str]:
        """The `kafka:` section of a config that reaches this broker."""
        return {"bootstrap_servers": self.bootstrap, "security_protocol": "SASL_SSL",
                "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": self.user,
                "sasl_password": password or self.password, "ssl_ca_location": str(self.ca)}


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    from tests.factories import tls_folder

    own = SecuredBroker(tls_folder(tmp_path_factory.mktemp("kafka-tls")))
    own.run("start")
    yield own
    own.run("reset")


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    """The settings the suite runs with (environment and $ORL_CONFIG honoured)."""
    return load_settings()


@pytest.fixture(scope="session")
def embedded_model(base_settings: Settings) -> Path:
    """The prepared embedded model folder (SmolLM2-135M-Instruct)."""
    from online_rl.models import prepare_embedded_model

    return prepare_embedded_model(base_settings.model_dir).path


@pytest.fixture(scope="session")
def tiny_model(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random 2-layer Llama with the embedded tokenizer."""
    from online_rl.models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), embedded_model, seed=0)


@pytest.fixture(scope="session")
def adapters(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two different sealed adapters for the tiny model."""
    root = tmp_path_factory.mktemp("adapters")
    return [lora_adapter(tiny_model, root / f"a{i}", TINY_NAME, seed=i + 1, scale=20.0) for i in range(2)]


@pytest.fixture(scope="session")
def ray_runtime(base_settings: Settings) -> Iterator[None]:
    """A real local Ray runtime for the session."""
    import ray

    from online_rl.ray_runtime import init_ray

    init_ray(base_settings)
    yield
    ray.shutdown()


@pytest.fixture
def local_settings(tmp_path: Path) -> Settings:
    """Settings whose cache (and so the MLflow SQLite store) is a fresh temporary folder."""
    return Settings(cache_dir=tmp_path / "cache")


@pytest.fixture(params=["embedded", pytest.param("kafka", marks=pytest.mark.kafka)])
def make_bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BusFactory]:
    """A factory of buses over one backend; every bus it makes sees the same data."""
    made: list[Bus] = []

    def make(**options: Any) -> Bus:
        if request.param == "embedded":
            bus: Bus = EmbeddedBus(tmp_path / "bus.db", session_timeout=options.get("session_timeout", 10.0))
        else:
            extra = {}
            if "session_timeout" in options:
                ms = int(options["session_timeout"] * 1000)
                extra = {"session.timeout.ms": ms, "max.poll.interval.ms": ms, "heartbeat.interval.ms": 500}
            bus = KafkaBus(request.getfixturevalue("kafka_bootstrap"), consumer_extra=extra)
        made.append(bus)
        return bus

    yield make
    for bus in made:
        bus.close()


@pytest.fixture
def bus(make_bus: BusFactory) -> Bus:
    return make_bus()


@pytest.fixture
def topic() -> str:
    return f"t.{uuid.uuid4().hex[:10]}"
