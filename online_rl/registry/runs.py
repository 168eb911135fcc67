"""A training run in MLflow, and the one path by which its adapter versions reach the registry.

Every driver that trains an adapter (the long-running trainer, the colocated hybrid loop) opens a
`TrainingRun` once its workers have resolved their precision, logs its metrics through it and publishes
every version with `TrainingRun.publish`. The run knows:

- the resolved config: the component's section of the settings plus what its weights depend on (the
  base model, the adapter's LoRA shape and seed from `trainer.*`, the precision the workers resolved),
  its hash, and the same tree as MLflow params with the precision's reason and the machine;
- the base model's fingerprint, the signing key and the registered model;
- how to seal a version: the adapter saved by the driver, a complete lineage manifest (signed when a
  key is configured), then `publish_adapter` (log, register, alias).

The driver tells it what only the driver knows: the offsets it consumed, the versions that served the
samples, the reward mappings, the parent version, its evaluation. This module knows nothing about
training, Ray, the bus or the algorithms.
"""

from __future__ import annotations

import hashlib
import json
import logging
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from online_rl.registry.lineage import file_sha256, load_signing_key, write_lineage
from online_rl.registry.publish import PublishedVersion, publish_adapter

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from mlflow import MlflowClient
    from pydantic import BaseModel

    from online_rl.bus import TopicPartition
    from online_rl.config import Settings
    from online_rl.events import TrainingSample
    from online_rl.hardware import PrecisionChoice

__all__ = ["BASE_BEHAVIOUR", "Component", "TrainingRun", "VersionLineage", "adapter_config",
           "base_fingerprint", "config_hash", "mlflow_outage", "offset_ranges", "resolved_config",
           "run_params", "served_by"]

logger = logging.getLogger(__name__)

Component = Literal["trainer", "hybrid"]
BASE_BEHAVIOUR = "base"  # how lineage names the base model as a behaviour version
# MLflow's limits (mlflow.utils.validation): longer values are refused, not cut
_PARAM_KEY, _PARAM_VALUE, _PARAMS_PER_BATCH, _METRICS_PER_BATCH = 250, 6000, 100, 1000
# metric rows kept while MLflow is unreachable (about a day of steps); the oldest go first past it
OUTBOX_ROWS = 200_000
_RETRY_FIRST_S, _RETRY_MAX_S, _CLOSE_FLUSH_S = 1.0, 30.0, 15.0


# -- the resolved config ---------------------------------------------------------------------------
def adapter_config(settings: Settings) -> dict[str, Any]:
    """What every adapter the loop trains takes from `trainer.*`, whichever driver trains it: the LoRA
    shape and the seed of its initialisation."""
    trainer = settings.trainer
    return {"lora_rank": trainer.lora_rank, "lora_alpha": trainer.lora_alpha,
            "lora_targets": list(trainer.lora_targets), "seed": trainer.seed}


def resolved_config(settings: Settings, section: BaseModel,
                    precision: PrecisionChoice | None = None) -> dict[str, Any]:
    """A run's resolved config: its `section` of the settings, the adapter it trains
    (`adapter_config`), the base model's id and, once the workers have resolved it, their precision."""
    config = section.model_dump(mode="json") | adapter_config(settings) | {"base_model": settings.model.name}
    if precision is not None:
        config["precision_resolved"] = precision.precision
    return config


def config_hash(config: Mapping[str, Any]) -> str:
    """16 hex characters of the sha256 of `config` as canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def run_params(config: Mapping[str, Any], precision: PrecisionChoice | None = None) -> dict[str, str]:
    """`config` as MLflow params: one per key, lists and dicts as JSON, cut to MLflow's limits; with
    `precision`, also why it was chosen and on which machine."""
    from online_rl.hardware import machine_line

    flat = {key: json.dumps(value, sort_keys=True) if isinstance(value, list | dict) else str(value)
            for key, value in config.items()}
    if precision is not None:
        flat |= {"precision_reason": precision.reason,
                 "machine": precision.machine or machine_line(precision.precision)}
    return {key[:_PARAM_KEY]: value[:_PARAM_VALUE] for key, value in flat.items()}


# -- what a version is made from ------------------------------------------------------------------
def base_fingerprint(model_dir: Path) -> str:
    """sha256 over the base model's weight files (name and hash of each)."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        digest.update(f"{path.name}:{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def offset_ranges(offsets: Mapping[TopicPartition, int],
                  published: Mapping[TopicPartition, int]) -> dict[str, dict[str, list[int]]]:
    """`{topic: {partition: [first, end)}}` read since the last publish: from `published` (the offsets
    then, 0 for a partition it did not know) to `offsets` (the next to read now); a partition with
    nothing new has no range."""
    ranges: dict[str, dict[str, list[int]]] = {}
    for tp, end in sorted(offsets.items()):
        first = published.get(tp, 0)
        if end > first:
            ranges.setdefault(tp.topic, {})[str(tp.partition)] = [first, end]
    return ranges


def served_by(sample: TrainingSample) -> set[str]:
    """The versions that served `sample`'s completions, as lineage names them (the base: "base")."""
    return {version or BASE_BEHAVIOUR for version in sample.behaviour_versions}


@dataclass(frozen=True)
class VersionLineage:
    """What only the driver knows about a version: what it learned from since its parent. The run adds
    the base model, its fingerprint, the config hash and the signature."""

    offsets: dict[str, dict[str, list[int]]]
    behaviour_versions: Collection[str]
    reward_mapping_versions: Collection[str]
    parent_version: str | None
    eval: dict[str, float] = field(default_factory=dict)
    cold_start: dict[str, str | float | int] | None = None
    kl_anchor: str | None = None

    def manifest_fields(self) -> dict[str, Any]:
        """The `write_lineage` keyword arguments these fields become."""
        return {"offsets": self.offsets, "behaviour_versions": sorted(set(self.behaviour_versions)),
                "reward_mapping_version": ",".join(sorted(set(self.reward_mapping_versions))) or None,
                "parent_version": self.parent_version, "eval": self.eval, "cold_start": self.cold_start,
                "kl_anchor": self.kl_anchor}


def mlflow_outage(error: BaseException) -> bool:
    """Whether `error` says MLflow (its server, its database, its artifact store) did not answer or
    could not take the write, as opposed to refusing it: an outage is waited out; a refusal (a bad
    request, a permission) is a bug or a misconfiguration and is not retried (the trainer ends with
    its message; a refused metric batch is dropped)."""
    import requests
    from mlflow.exceptions import MlflowException

    if isinstance(error, PermissionError):  # a misconfigured store, not an outage
        return False
    if isinstance(error, requests.RequestException | OSError):  # OSError: connection, timeout, disk
        return True
    return isinstance(error, MlflowException) and error.error_code in (
        "INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED")


# -- the run ---------------------------------------------------------------------------------------
@dataclass
class TrainingRun:
    """One MLflow run of a training driver (open it with `TrainingRun.open`)."""

    client: MlflowClient
    run_id: str
    component: Component
    config: dict[str, Any]
    config_hash: str
    base_model: str
    base_sha256: str
    registered_model: str
    signing_key: Ed25519PrivateKey | None = None
    finished: bool = False
    metrics_dropped: int = 0  # rows the outbox let go during a long outage (oldest first)
    _outbox: deque[Any] = field(default_factory=deque, repr=False)
    _outbox_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _outbox_wake: threading.Condition | None = field(default=None, repr=False)
    _sender: threading.Thread | None = field(default=None, repr=False)
    _unreachable_since: float | None = field(default=None, repr=False)

    @classmethod
    def open(cls, settings: Settings, component: Component,
             precision: PrecisionChoice | None = None) -> TrainingRun:
        """Start a run in the component's experiment, tagged with the component, the config hash and
        the base model, its resolved config logged as params. The signing key is read first: a bad key
        fails the start, not a publish."""
        from online_rl.tracking import ensure_experiment, mlflow_client

        key_file = settings.mlflow.signing_key_file
        signing_key = load_signing_key(key_file) if key_file is not None else None
        section = settings.trainer if component == "trainer" else settings.hybrid
        config = resolved_config(settings, section, precision)
        digest = config_hash(config)
        base_sha256 = base_fingerprint(settings.model_dir)
        client = mlflow_client(settings)
        experiment = ensure_experiment(client, section.experiment, settings)
        run_id = client.create_run(experiment, tags={"component": component, "config_hash": digest,
                                                     "base_model": settings.model.name}).info.run_id
        run = cls(client, run_id, component, config, digest, settings.model.name, base_sha256,
                  settings.mlflow.registered_model, signing_key)
        try:
            run._log_params(run_params(config, precision))
        except BaseException:
            run.close(failed=True)
            raise
        logger.info("%s run %s: config %s, base %s (%s…)", component, run_id, digest, run.base_model,
                    base_sha256[:12], extra={"event": "run_opened", "run_id": run_id, "config_hash": digest})
        return run

    def _log_params(self, params: Mapping[str, str]) -> None:
        from mlflow.entities import Param

        rows = [Param(key, value) for key, value in sorted(params.items())]
        for start in range(0, len(rows), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=rows[start:start + _PARAMS_PER_BATCH])

    def log_metrics(self, values: Mapping[str, float], step: int, prefix: str = "") -> None:
        """One row of metrics at `step`, each named `prefix + name`. The rows go to MLflow from a
        background thread, so a tracking server that is down or slow never holds up (or ends) the
        training step: they wait in an outbox (up to `OUTBOX_ROWS`, the oldest dropped and counted in
        `metrics_dropped` past it) and are sent, in order, once it answers. `flush` waits for them."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(f"{prefix}{name}", float(value), now, step) for name, value in values.items()]
        with self._outbox_lock:
            self._outbox.extend(rows)
            overflow = len(self._outbox) - OUTBOX_ROWS
            for _ in range(max(0, overflow)):
                self._outbox.popleft()
            self.metrics_dropped += max(0, overflow)
            if self._outbox_wake is None:
                self._outbox_wake = threading.Condition(self._outbox_lock)
            self._outbox_wake.notify_all()
            if self._sender is None or not self._sender.is_alive():
                self._sender = threading.Thread(target=self._send_metrics, daemon=True,
                                                name=f"mlflow-metrics-{self.run_id[:8]}")
                self._sender.start()

    @property
    def metrics_waiting(self) -> int:
        """Metric rows logged but not yet accepted by MLflow."""
        with self._outbox_lock:
            return len(self._outbox)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every metric row logged so far is in MLflow (True), or `timeout` seconds (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._outbox_lock:
            while self._outbox:
                if self._outbox_wake is None:
                    return False
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._outbox_wake.wait(left if left is not None else 1.0)
        return True

    def _send_metrics(self) -> None:
        """The outbox's sender: batches of rows in order; on a failure, the rows stay and it retries
        with a growing pause (MLflow's client has already retried the request itself)."""
        pause = _RETRY_FIRST_S
        one_by_one = 0  # after a refused batch, its rows go singly so only the refused ones are dropped
        while True:
            with self._outbox_lock:
                assert self._outbox_wake is not None
                while not self._outbox:
                    if self.finished:
                        return
                    self._outbox_wake.wait(5.0)
                size = 1 if one_by_one else _METRICS_PER_BATCH
                batch = [self._outbox[i] for i in range(min(len(self._outbox), size))]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as error:
                refused = not mlflow_outage(error)
                if refused and len(batch) > 1:  # find the refused rows among the batch
                    one_by_one = len(batch)
                    continue
                if refused:  # retrying cannot help, and it would block the rest
                    one_by_one = max(0, one_by_one - 1)
                    with self._outbox_lock:
                        for _ in range(min(len(batch), len(self._outbox))):
                            self._outbox.popleft()
                        self.metrics_dropped += len(batch)
                        assert self._outbox_wake is not None
                        self._outbox_wake.notify_all()
                    logger.error("MLflow refused %d metric rows of run %s (%s); they are dropped",
                                 len(batch), self.run_id, error,
                                 extra={"event": "metrics_refused", "run_id": self.run_id})
                    continue
                if self._unreachable_since is None:  # an outage: keep the rows, say so once, retry later
                    self._unreachable_since = time.monotonic()
                    logger.warning("MLflow did not take %d metric rows of run %s (%s); they wait in the "
                                   "outbox and are retried", len(batch), self.run_id, error,
                                   extra={"event": "mlflow_unreachable", "run_id": self.run_id})
                time.sleep(pause)
                pause = min(_RETRY_MAX_S, pause * 2)
                continue
            pause = _RETRY_FIRST_S
            one_by_one = max(0, one_by_one - len(batch))
            with self._outbox_lock:
                for _ in range(min(len(batch), len(self._outbox))):
                    self._outbox.popleft()
                assert self._outbox_wake is not None
                self._outbox_wake.notify_all()
            if self._unreachable_since is not None:
                logger.warning("MLflow takes run %s's metrics again after %.0f s", self.run_id,
                               time.monotonic() - self._unreachable_since,
                               extra={"event": "mlflow_reachable", "run_id": self.run_id})
                self._unreachable_since = None

    def publish(self, save_adapter: Callable[[Path], None], lineage: VersionLineage, artifact_path: str,
                alias: str | None = "challenger",
                then: Callable[[Path], None] | None = None,
                publish_key: str | None = None) -> PublishedVersion:
        """Seal and register a version: `save_adapter(folder)` writes the PEFT adapter into a fresh
        folder, the complete lineage manifest is written (and signed) beside it, then `publish_adapter`
        logs it under `artifact_path`, registers it (tagged with `publish_key` when given) and points
        `alias` at it. `then(folder)` runs on the sealed folder before it is removed."""
        with tempfile.TemporaryDirectory(prefix=f"orl-{self.component}-") as tmp:
            folder = Path(tmp) / "adapter"
            save_adapter(folder)
            write_lineage(folder, self.base_model, self.signing_key, base_model_sha256=self.base_sha256,
                          config_hash=self.config_hash, **lineage.manifest_fields())
            published = publish_adapter(self.client, self.run_id, folder, self.registered_model,
                                        artifact_path=artifact_path, alias=alias, publish_key=publish_key)
            if then is not None:
                then(folder)
        return published

    def close(self, failed: bool = False) -> None:
        """Send the waiting metric rows (for up to 15 s), then end the run (FAILED or FINISHED); closing
        twice does nothing. With MLflow unreachable, the rows that did not go are counted in the log and
        the run is left RUNNING (nothing here may hold up a shutdown)."""
        if self.finished:
            return
        sent = self.flush(_CLOSE_FLUSH_S)
        self.finished = True
        if self._outbox_wake is not None:
            with self._outbox_lock:
                self._outbox_wake.notify_all()
        if not sent:
            logger.error("MLflow is unreachable: %d metric rows of run %s were not logged, and the run stays "
                         "RUNNING", self.metrics_waiting, self.run_id,
                         extra={"event": "metrics_lost", "run_id": self.run_id, "rows": self.metrics_waiting})
            return
        if self.metrics_dropped:
            logger.error("run %s: %d metric rows were dropped during an MLflow outage (the outbox keeps %d)",
                         self.run_id, self.metrics_dropped, OUTBOX_ROWS,
                         extra={"event": "metrics_dropped", "run_id": self.run_id,
                                "rows": self.metrics_dropped})
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")
