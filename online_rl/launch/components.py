"""What `online-rl up` starts: every component of the loop as a local process, in dependency order.

`plan(settings, ...)` turns the settings into a list of `Component`s — the command, the environment
that wires it to the others (bus, MLflow server and each component's MLflow user, API keys, folders inside
the run folder), the ports it will listen on and how to tell it is ready. Pure: nothing is started here.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from online_rl.config import Settings
from online_rl.launch.mlflow_auth import component_credentials, read_registry_auth, server_env
from online_rl.registry.access import RegistryAuth

__all__ = ["KAFKA_SCRIPT", "SIGNING_KEY", "Component", "Wiring", "bus_kind", "plan", "threads"]

SIGNING_KEY = "signing.pem"  # in the run folder: the trainer's version-signing key (signing.pub beside it)
KAFKA_SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "local" / "kafka" / "kafka.sh"


@dataclass(frozen=True)
class Component:
    """One process of the loop."""

    name: str
    argv: list[str]
    ports: dict[int, str]  # port -> the setting that moves it (for a clear message when it is taken)
    ready_url: str | None = None  # answers 200 once the component is ready; None: alive is ready
    url: str | None = None  # what `status` shows
    env: dict[str, str] = field(default_factory=dict)
    settle_s: float = 2.0  # without a ready URL: alive this long counts as started


@dataclass(frozen=True)
class Wiring:
    """How the components find each other, written to the run folder for `status` and the demo."""

    run_dir: Path
    bus: str  # "kafka" or "embedded"
    bootstrap: str | None
    start_broker: bool
    mlflow_url: str
    inference_url: str
    feedback_url: str
    gateway_url: str
    trainer_metrics_url: str
    env: dict[str, str]

    def as_dict(self) -> dict[str, object]:
        return {
            "run_dir": str(self.run_dir),
            "bus": self.bus,
            "bootstrap": self.bootstrap,
            "start_broker": self.start_broker,
            "mlflow_url": self.mlflow_url,
            "inference_url": self.inference_url,
            "feedback_url": self.feedback_url,
            "gateway_url": self.gateway_url,
            "trainer_metrics_url": self.trainer_metrics_url,
        }


def bus_kind(settings: Settings) -> tuple[str, bool]:
    """("kafka" | "embedded", whether `up` starts the local broker)."""
    if settings.kafka.bootstrap_servers:
        return "kafka", False
    choice = settings.launch.bus
    if choice == "auto":
        choice = "kafka" if KAFKA_SCRIPT.exists() and shutil.which("java") else "embedded"
    return choice, choice == "kafka"


def threads(settings: Settings) -> tuple[int, float]:
    """(the inference replica's threads, the trainer's CPUs) on this machine: half the cores each unless
    configured (`launch.inference_threads`, `trainer.cpus_per_worker`), so the two never fight for one."""
    cores = os.cpu_count() or 2
    inference = settings.launch.inference_threads or max(1, cores // 2)
    return inference, settings.trainer.cpus_per_worker or max(1, cores - inference)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "online_rl.cli", *args]


def _wiring(settings: Settings, config_file: Path | None, keys_file: Path, upstream_key: str) -> Wiring:
    """The URLs and the environment every component shares (the bus, MLflow, API keys, run folders)."""
    launch, run = settings.launch, settings.run_dir
    bus, start_broker = bus_kind(settings)
    local = f"127.0.0.1:{launch.kafka_port}" if bus == "kafka" else None
    bootstrap = settings.kafka.bootstrap_servers or local
    mlflow_url = f"http://127.0.0.1:{launch.mlflow_port}"
    inference_url = f"http://127.0.0.1:{settings.inference.port}"
    env = {
        "PYTHONUNBUFFERED": "1",
        "ORL_MLFLOW__TRACKING_URI": mlflow_url,
        "ORL_TRAINER__CHECKPOINT_DIR": str(run / "trainer" / "checkpoints"),
        "ORL_GATEWAY__ROLLOUT__STATE_DIR": str(run / "rollout"),
        "ORL_INFERENCE__ADAPTERS_DIR": str(run / "adapters"),
        "ORL_FEEDBACK_API__API_KEYS_FILE": str(keys_file),
        "ORL_INFERENCE__API_KEYS_FILE": str(keys_file),
        "ORL_GATEWAY__API_KEYS_FILE": str(keys_file),
        "ORL_GATEWAY__UPSTREAM_API_KEY": upstream_key,
        "ORL_GATEWAY__REPLICAS": json.dumps([inference_url]),
    }
    if config_file is not None:
        env["ORL_CONFIG"] = str(config_file)
    if bootstrap:
        env["ORL_KAFKA__BOOTSTRAP_SERVERS"] = bootstrap
    else:
        env["ORL_BUS__EMBEDDED_PATH"] = str(run / "bus" / "bus.db")
    env["OMP_NUM_THREADS"] = "1"  # the light components; the two heavy ones get their own (see plan)
    return Wiring(
        run,
        bus,
        bootstrap,
        start_broker,
        mlflow_url,
        inference_url,
        feedback_url=f"http://127.0.0.1:{settings.feedback_api.port}",
        gateway_url=f"http://127.0.0.1:{settings.gateway.port}",
        trainer_metrics_url=f"http://127.0.0.1:{launch.trainer_metrics_port}",
        env=env,
    )


def _inference_env(settings: Settings, registry: RegistryAuth | None, cpu_threads: int) -> dict[str, str]:
    """The replica's threads and MLflow user, and whose signatures it trusts."""
    env = {"OMP_NUM_THREADS": str(cpu_threads), **component_credentials(registry, "inference")}
    public = settings.run_dir / SIGNING_KEY.replace(".pem", ".pub")
    if public.is_file() and not settings.mlflow.signing_key_file and not settings.mlflow.trusted_signers:
        # the run's own signing key (`up` makes it): serving loads only versions this trainer signed
        env["ORL_MLFLOW__TRUSTED_SIGNERS"] = json.dumps([public.read_text().strip()])
    return env


def _trainer_env(
    settings: Settings, registry: RegistryAuth | None, trainer_threads: float, signs: bool
) -> dict[str, str]:
    """The trainer's CPUs (and its local Ray runtime's), its MLflow user and, when serving checks
    signatures (`signs`), the run's signing key."""
    env = {"OMP_NUM_THREADS": str(max(1, int(trainer_threads))),
           "ORL_TRAINER__CPUS_PER_WORKER": str(trainer_threads),
           **component_credentials(registry, "trainer")}
    if not settings.ray.address:  # the trainer's local Ray runtime must hold every worker's CPUs
        needed = math.ceil(trainer_threads * settings.trainer.workers)
        env["ORL_RAY__NUM_CPUS"] = str(max(settings.ray.num_cpus, needed))
    if signs:
        env["ORL_MLFLOW__SIGNING_KEY_FILE"] = str(settings.run_dir / SIGNING_KEY)
    return env


def _mlflow_server(settings: Settings, wiring: Wiring, registry: RegistryAuth | None) -> Component:
    """MLflow's tracking server with its basic-auth app, its store in the run folder."""
    port, mlflow_dir = settings.launch.mlflow_port, wiring.run_dir / "mlflow"
    argv = [
        sys.executable, "-m", "mlflow", "server",
        "--app-name", "basic-auth",  # every request signs in; each component's user may do only its part
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
        "--backend-store-uri", f"sqlite:///{mlflow_dir / 'mlflow.db'}",
        "--artifacts-destination", str(mlflow_dir / "artifacts"),
    ]
    return Component("mlflow", argv, {port: "launch.mlflow_port"}, f"{wiring.mlflow_url}/health",
                     wiring.mlflow_url, server_env(wiring.run_dir, registry))


def plan(
    settings: Settings, config_file: Path | None, keys_file: Path, upstream_key: str
) -> tuple[Wiring, list[Component]]:
    """The wiring and the components, in start order (`down` stops them in reverse)."""
    launch = settings.launch
    wiring = _wiring(settings, config_file, keys_file, upstream_key)
    inference_threads, trainer_threads = threads(settings)
    # each component that talks to MLflow signs in as its own user
    registry = read_registry_auth(wiring.run_dir)
    inference_env = _inference_env(settings, registry, inference_threads)
    signs = "ORL_MLFLOW__TRUSTED_SIGNERS" in inference_env
    inference_url, feedback_url = wiring.inference_url, wiring.feedback_url
    gateway_url, metrics_url = wiring.gateway_url, wiring.trainer_metrics_url
    joiner_metrics_url = f"http://127.0.0.1:{launch.joiner_metrics_port}"
    components = [
        _mlflow_server(settings, wiring, registry),
        Component(
            "inference",
            _cli("serve", "inference"),
            {settings.inference.port: "inference.port"},
            f"{inference_url}/readyz",
            f"{inference_url}/v1",
            inference_env,
        ),
        Component(
            "feedback",
            _cli("serve", "feedback"),
            {settings.feedback_api.port: "feedback_api.port"},
            f"{feedback_url}/readyz",
            f"{feedback_url}/v1/feedback",
        ),
        Component(
            "joiner",
            _cli("join", "--metrics-port", str(launch.joiner_metrics_port)),
            {launch.joiner_metrics_port: "launch.joiner_metrics_port"},
            f"{joiner_metrics_url}/metrics",
            f"{joiner_metrics_url}/metrics",
        ),
        Component(
            "trainer",
            _cli("trainer", "--metrics-port", str(launch.trainer_metrics_port)),
            {launch.trainer_metrics_port: "launch.trainer_metrics_port"},
            f"{metrics_url}/metrics",
            f"{metrics_url}/metrics",
            _trainer_env(settings, registry, trainer_threads, signs),
        ),
        Component(
            "gateway",
            _cli("serve", "gateway"),
            {settings.gateway.port: "gateway.port"},
            f"{gateway_url}/readyz",
            f"{gateway_url}/rollout/ui",
            component_credentials(registry, "gateway"),
        ),
    ]
    return wiring, components
