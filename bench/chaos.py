"""Faults under load: a Kafka node, the joiner and the trainer SIGKILLed at their worst moments, and
MLflow down while the trainer publishes; what survived, as figures (docs/reliability.md).

    deploy/local/env.sh .venv/bin/python bench/chaos.py [--bootstrap HOST:PORT] [--schedule full|short]
        [--broker-cycles 5] [--joiner-kills 25] [--samples 64] [--outage-s 120]
        [--bus-outage-s 30] [--model DIR --model-name NAME] [--parts a,b,...] [--smoke]

Real components throughout: a three-node KRaft cluster (deploy/local/kafka/cluster.sh: replication 3,
min.insync.replicas 2) under `online-rl serve feedback`; `online-rl join` and `online-rl trainer`
processes (the trainer with its Ray runtime) on a Kafka broker (started for the run unless
`--bootstrap` names one); an `mlflow server` process (SQLite store, its artifacts served by the server,
as the chart deploys it) and, unless `--model` names one, a tiny random Llama with the embedded
tokenizer (what is measured is recovery, not learning). `--smoke` (CI's): 1 broker cycle (the
leader), 3 joiner kills, the short trainer schedule, 40 samples, a 10 s MLflow outage, a 30 s bus
outage (longer than a transaction's commit timeout).

**Broker loss.** Users post thumbs through the feedback API at up to 25/s with the project's client
(`online_rl.client.FeedbackClient`: a 503 or a dropped connection is retried with the same event id)
while a node is SIGKILLed, kept down 8 s and restarted, `--broker-cycles` times, every other time the
leader of the feedback topic's partition 0. Figures: `feedback_acked` (202s) and `feedback_on_topic`
(of those, how many the topic holds: equal), `feedback_duplicated_on_topic` (a retried event whose
first write landed after all; the joiner counts an event id once), `feedback_client_errors` (what
the client gave up on: 0), `feedback_longest_stall_s` (the longest gap between acknowledgements).

**Joiner.** Users chat and give thumbs (an interaction and its thumb, 40 requests/s, straight to the
topics) while `online-rl join` runs with `ORL_FAILPOINTS` at a random one of `joiner.mid_transaction`
and `joiner.after_commit`, at its 1st to 3rd step with records: `--joiner-kills` lifetimes, each
killed there, then one that joins the rest. Figures: `samples_duplicated`, `samples_missing` (a
request whose thumb produced no sample), both 0.

**Kill points.** Preference pairs are on the samples topic (2 partitions). Lifetime i of the trainer
runs with `ORL_FAILPOINTS=<point i>` (online_rl/faults.py) and is killed by SIGKILL there; lifetime
i + 1 starts without it, resumes, and runs into the next point; the last lifetime trains what is left
and exits once the stream is quiet. The full schedule kills at every point a step passes: mid-step,
mid-checkpoint, after the write-ahead checkpoint of a publish, between register and alias, between
publish and checkpoint, before the commit (`--schedule short`, CI's: the three publishing points).
Checked after the last lifetime, from the registry's own version tags and the newest checkpoint:

- `samples_trained` = `samples_produced` (the final checkpoint counts every sample once);
- `versions_with_overlapping_offsets`: versions whose offset range on some partition starts before
  the previous version's ended (a sample in two versions), `offset_gaps` (a sample in none);
- `orphan_versions`: registered versions that are neither the newest nor the parent of another;
- `challenger_is_newest`; `kills` (each point, and whether the process died there: `sigkill`);
  `restart_to_first_step_s` (median over restarts).

**MLflow outage.** A fresh trainer trains a stream produced at a fixed rate; after its first publish
the MLflow server is SIGKILLed for `--outage-s` seconds, then started again on the same store. Its
metric rows wait in the trainer's outbox and its publishes fail and are retried (`MLFLOW_HTTP_REQUEST_
MAX_RETRIES=1`: a practitioner's trainer gives up on a request in seconds, not after MLflow's default
four minutes, and tries again next step). Figures: `outage_steps` (steps trained while MLflow was
down), `outage_publish_failures`, `outage_trainer_exit` (0: it never stopped), `outage_first_publish_after_s`
(from the server's return to the next version), `outage_metric_rows_missing` (steps without their
`loss` row in MLflow at the end) and the same tiling checks as above (`outage_*`).

**Serving** (bench/chaos_serving.py has the schedule): users chat through `online-rl serve gateway`
and two `online-rl serve inference` replicas while a replica is SIGKILLed mid hot swap
(`serving.mid_load`), the gateway after saving a promotion (`rollout.after_state_write`) and mid
MLflow (`rollout.mid_mlflow`), a replica the instant after answering, and a replica is restarted on a
full adapter disk. Figures: `interactions_answered` = `interactions_logged`, `serving_client_errors`
0, `gateway_recovered`, `replica_reload_s`, `replica_restart_to_champion_s`, `disk_full`, ...

**Bus outage**: every node of a three-node cluster SIGKILLed at once for `--bus-outage-s` (smoke: 30 too)
under the whole loop (users chatting with a replica and posting thumbs, the joiner, the trainer);
`ready_after_broker_s`: per component, the seconds from the nodes' return to its work done again
(the feedback API acknowledges a thumb, the replica's interaction backlog is written, a joiner
transaction commits what it read, the trainer trains a step).

`--parts` runs some of brokers, joiner, trainer, outage, bus, serving (default: all). The last line is
one JSON object with those figures, `part_s` (each part's seconds), `seconds` and the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import queue
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaos_serving import serving_faults
from bench.common import ROOT, emit, kafka_broker, start_cli_service
from online_rl.ports import free_port

FULL = ("trainer.mid_step", "checkpoint.mid_write", "trainer.before_publish", "registry.after_register",
        "trainer.after_publish", "trainer.before_commit")
SHORT = ("trainer.before_publish", "registry.after_register", "trainer.after_publish")
FIELDS: tuple[str, ...] = (
    "samples_produced", "samples_trained", "versions", "versions_with_overlapping_offsets", "offset_gaps",
    "orphan_versions", "challenger_is_newest", "kills", "restart_to_first_step_s", "outage_s", "outage_steps",
    "outage_publish_failures", "outage_trainer_exit", "outage_first_publish_after_s",
    "outage_metric_rows_missing", "outage_samples_produced", "outage_samples_trained", "outage_versions",
    "outage_versions_with_overlapping_offsets", "outage_offset_gaps", "outage_orphan_versions", "seconds",
    "schedule", "joiner_kills", "joiner_sigkilled", "joiner_requests", "samples_duplicated",
    "samples_missing", "joiner_lifetime_s", "broker_cycles", "broker_leader_kills", "feedback_acked",
    "feedback_on_topic", "feedback_duplicated_on_topic", "feedback_client_errors", "feedback_longest_stall_s",
    "interactions_answered", "interactions_logged", "killed_right_after_answering_logged",
    "serving_requests", "serving_client_errors", "serving_retried", "serving_longest_stall_s",
    "replica_killed_mid_swap", "replica_copies_after_restart", "replica_reload_s", "gateway_kills",
    "gateway_recovered", "gateway_recovery", "gateway_down_s", "replica_restart_to_champion_s", "disk_full",
    "interval_s", "bus_outage_s", "ready_after_broker_s", "part_s",
)
PARTS = ("brokers", "joiner", "trainer", "outage", "serving", "bus")
BATCH, PUBLISH_EVERY = 4, 8
PREFERRED, AVOIDED = 1000, 2000


class MlflowServer:
    """`mlflow server` in its own process group on a fixed port and store: stopped with SIGKILL and
    started again on the same store, as a crashed pod would be."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 300.0) -> None:
        import httpx

        self.root.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--workers", "1", "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination", str(self.root / "artifacts")]
        log = open(self.root / "server.log", "ab")  # noqa: SIM115 (the server's, for its lifetime)
        self.process = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise SystemExit(f"mlflow server exited during start-up (see {self.root / 'server.log'})")
            time.sleep(0.5)
        raise SystemExit("mlflow server did not become ready")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None


class TrainerProcess:
    """One lifetime of `online-rl trainer`, its JSON log events read as they come (with the time)."""

    def __init__(self, env: dict[str, str], args: list[str], log: Path) -> None:
        self.events: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.started = time.monotonic()
        self.log = log
        argv = [sys.executable, "-m", "online_rl.cli", "trainer", "--metrics-port", "0", *args]
        self.process = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                        text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        with open(self.log, "a") as out:
            for line in self.process.stderr:
                out.write(line)
                if line.startswith("{"):
                    with contextlib.suppress(json.JSONDecodeError):
                        self.events.put((time.monotonic(), json.loads(line)))
        self.events.put((time.monotonic(), {"event": "exited"}))

    def next_event(self, timeout: float) -> tuple[float, dict[str, Any]] | None:
        try:
            return self.events.get(timeout=timeout)
        except queue.Empty:
            return None

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise SystemExit(f"the trainer did not exit in {timeout:.0f}s (log: {self.log})") from None


def _pairs(start: int, count: int, seed: int, model: str) -> list[Any]:
    """Preference pairs for a learnable taste: end with PREFERRED rather than AVOIDED."""
    from online_rl.events import Completion, FeedbackKind, Message, TrainingSample

    rng = random.Random(seed)

    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(rng.randint(low, high))]

    out = []
    for i in range(start, start + count):
        prompt, stem = ids(2, 6), ids(1, 3)
        chosen, rejected = [*stem, PREFERRED], [*stem, AVOIDED]
        out.append(TrainingSample(
            sample_id=f"s{i}", kind="pair", model=model, user_id=f"u{i % 5}",
            prompt=[Message(role="user", content=f"q{i}")], prompt_token_ids=prompt,
            chosen=Completion(request_id=f"c{i}", text="-", token_ids=chosen, logprobs=[-1.0] * len(chosen)),
            rejected=Completion(request_id=f"r{i}", text="-", token_ids=rejected,
                                logprobs=[-1.0] * len(rejected)),
            feedback_kind=FeedbackKind.preference, reward_mapping_version="chaos", behaviour_versions=[None],
            created_at=time.time()))
    return out


def _produce(producer: Any, topic: str, samples: list[Any]) -> None:
    from online_rl.events import encode

    for sample in samples:
        producer.produce(topic, encode(sample), sample.sample_id.encode())
    producer.flush()


def _trainer_env(bootstrap: str, model: tuple[Path, str], work: Path, prefix: str, mlflow_url: str,
                 registered: str) -> dict[str, str]:
    return {**os.environ, "ORL_CACHE_DIR": str(work), "ORL_MODEL__NAME": model[1],
            "ORL_MODEL__PATH": str(model[0]), "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
            "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_BUS__PARTITIONS": "2",
            "ORL_TRAINER__BATCH_SIZE": str(BATCH), "ORL_TRAINER__BATCH_TIMEOUT_S": "0.5",
            "ORL_TRAINER__PUBLISH_EVERY_SAMPLES": str(PUBLISH_EVERY), "ORL_TRAINER__LEARNING_RATE": "1e-3",
            "ORL_TRAINER__EVAL_HOLDOUT": "0", "ORL_MLFLOW__TRACKING_URI": mlflow_url,
            "ORL_MLFLOW__REGISTERED_MODEL": registered, "ORL_LOG_FORMAT": "json",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
            "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def registry_figures(mlflow_url: str, registered: str, topic: str, ends: dict[int, int]) -> dict[str, Any]:
    """What the registry says about the versions of `registered`: overlaps, gaps, orphans, the alias."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_url, registry_uri=mlflow_url)
    versions = sorted(client.search_model_versions(f"name='{registered}'"), key=lambda v: int(v.version))
    windows: dict[int, list[tuple[int, int, str]]] = {}
    for v in versions:
        for item in filter(None, v.tags.get("offsets", "").split(";")):
            where, span = item.rsplit(":", 1)
            name, part = where.rsplit("/", 1)
            if name == topic:
                low, high = span.split("-")
                windows.setdefault(int(part), []).append((int(low), int(high), str(v.version)))
    overlapping: set[str] = set()
    gaps = 0
    for partition, end in ends.items():
        position = 0
        for first, stop, version in sorted(windows.get(partition, [])):
            if first < position:
                overlapping.add(version)
            elif first > position:
                gaps += first - position
            position = max(position, stop)
        gaps += max(0, end - position)
    names = {f"{registered}-v{v.version}" for v in versions}
    parents = {v.tags.get("parent_version") for v in versions}
    newest = f"{registered}-v{versions[-1].version}" if versions else None
    orphans = sorted(n for n in names if n != newest and n not in parents)
    try:
        challenger = str(client.get_model_version_by_alias(registered, "challenger").version)
    except Exception:
        challenger = None
    return {"versions": len(versions), "versions_with_overlapping_offsets": len(overlapping),
            "offset_gaps": gaps, "orphan_versions": len(orphans), "orphans": orphans,
            "challenger_is_newest": bool(versions) and challenger == str(versions[-1].version)}


def _topics(bootstrap: str, prefix: str) -> tuple[Any, Any]:
    """The contract's topics under `prefix` (2 partitions), and the bus."""
    from online_rl.bus import ensure_topics
    from online_rl.bus.kafka import KafkaBus
    from online_rl.bus.topics import Topics

    topics, bus = Topics(prefix), KafkaBus(bootstrap)
    ensure_topics(bus, topics, 2)
    return topics, bus


def _trained(work: Path) -> tuple[int, int]:
    """The newest checkpoint's samples and steps."""
    from online_rl.config import Settings
    from online_rl.trainer import CheckpointStore

    latest = CheckpointStore(Settings(cache_dir=work).checkpoint_dir).load_latest()
    return (latest.samples, latest.step) if latest is not None else (0, 0)


def kill_points(bootstrap: str, model: tuple[Path, str], root: Path, server: MlflowServer,
                points: tuple[str, ...], samples: int) -> dict[str, Any]:
    """Lifetimes of the trainer killed at `points` in turn, then one that finishes; the figures."""

    prefix, registered, work = f"c{uuid.uuid4().hex[:8]}", "chaos-kill", root / "kill"
    topics, bus = _topics(bootstrap, prefix)
    producer = bus.producer()
    _produce(producer, topics.samples, _pairs(0, samples, seed=5, model=model[1]))
    env = _trainer_env(bootstrap, model, work, prefix, server.url, registered)
    kills: list[dict[str, Any]] = []
    to_first_step: list[float] = []
    for i, point in enumerate(points):
        # (--idle-exit: a point the stream ran out before reaching ends the lifetime, and shows as such)
        trainer = TrainerProcess(env | {"ORL_FAILPOINTS": point}, ["--idle-exit", "20"],
                                 root / f"kill-{i}.log")
        first_step, died_there = None, False
        while (got := trainer.next_event(300)) is not None:
            at, event = got
            if event.get("event") == "step" and first_step is None:
                first_step = at - trainer.started
            died_there = died_there or (event.get("event") == "failpoint" and event.get("point") == point)
            if event.get("event") == "exited":
                break
        code = trainer.wait(60)
        kills.append({"point": point, "sigkill": code == -signal.SIGKILL and died_there, "exit": code})
        if i > 0 and first_step is not None:
            to_first_step.append(first_step)
        print(f"lifetime {i + 1}: {point}: exit {code}{' (killed there)' if died_there else ''}", flush=True)
    last = TrainerProcess(env | {"ORL_TRAINER__PUBLISH_EVERY_S": "2"}, ["--idle-exit", "6"],
                          root / "kill-last.log")
    while (got := last.next_event(600)) is not None and got[1].get("event") != "exited":
        if got[1].get("event") == "step" and len(to_first_step) < len(points):
            to_first_step.append(got[0] - last.started)
    code = last.wait(60)
    if code != 0:
        raise SystemExit(f"the last lifetime exited {code} (log: {root / 'kill-last.log'})")
    trained, _ = _trained(work)
    ends = {tp.partition: o for tp, o in bus.end_offsets(topics.samples).items()}
    bus.close()
    figures = registry_figures(server.url, registered, topics.samples, ends)
    return {"samples_produced": samples, "samples_trained": trained, "kills": kills,
            "restart_to_first_step_s": round(statistics.median(to_first_step), 1) if to_first_step else None,
            **figures}


def mlflow_outage(bootstrap: str, model: tuple[Path, str], root: Path, server: MlflowServer,
                  outage_s: float, rate: float = 2.0) -> dict[str, Any]:
    """A trainer on a stream at `rate` samples/s while the MLflow server is down for `outage_s`."""
    from mlflow import MlflowClient


    prefix, registered, work = f"o{uuid.uuid4().hex[:8]}", "chaos-outage", root / "outage"
    topics, bus = _topics(bootstrap, prefix)
    producer = bus.producer()
    produced, stop = [0], threading.Event()

    def produce() -> None:  # a fixed rate, as users would send it
        while not stop.is_set():
            _produce(producer, topics.samples, _pairs(produced[0], 1, seed=produced[0], model=model[1]))
            produced[0] += 1
            stop.wait(1.0 / rate)

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    env = _trainer_env(bootstrap, model, work, prefix, server.url, registered)
    trainer = TrainerProcess(env | {"ORL_TRAINER__PUBLISH_EVERY_S": "3"}, ["--idle-exit", "20"],
                             root / "outage.log")
    down_at = up_at = first_after = None
    steps_down = failures = 0
    run_id = None
    deadline = time.monotonic() + 600 + outage_s
    try:
        while time.monotonic() < deadline:
            if down_at is not None and up_at is None and time.monotonic() - down_at >= outage_s:
                server.start()
                up_at = time.monotonic()
                print(f"mlflow server back after {up_at - down_at:.0f}s", flush=True)
            got = trainer.next_event(1.0)
            if got is None:
                continue
            at, event = got
            kind = event.get("event")
            run_id = run_id or event.get("run_id")
            if kind == "exited":
                break
            if kind == "published" and down_at is None:
                server.kill()  # the first version is in: MLflow goes away
                down_at = time.monotonic()
                print(f"mlflow server killed; down for {outage_s:.0f}s", flush=True)
            elif kind == "step" and down_at is not None and up_at is None:
                steps_down += 1
            elif kind == "publish_failed":
                failures += 1
            elif kind == "published" and up_at is not None and first_after is None:
                first_after = at - up_at
                stop.set()  # a version after the outage: let the stream run dry, the trainer exit
    finally:
        stop.set()
        feeder.join(timeout=10)
    code = trainer.wait(120)
    trained, steps = _trained(work)
    ends = {tp.partition: o for tp, o in bus.end_offsets(topics.samples).items()}
    bus.close()
    figures = registry_figures(server.url, registered, topics.samples, ends)
    client = MlflowClient(tracking_uri=server.url)
    rows = len({m.step for m in client.get_metric_history(run_id, "loss")}) if run_id else 0
    return {"outage_s": round(up_at - down_at, 1) if up_at and down_at else None, "outage_steps": steps_down,
            "outage_publish_failures": failures, "outage_trainer_exit": code,
            "outage_first_publish_after_s": round(first_after, 1) if first_after is not None else None,
            "outage_metric_rows_missing": steps - rows, "outage_samples_produced": produced[0],
            "outage_samples_trained": trained, **{f"outage_{k}": v for k, v in figures.items()}}


JOINER_POINTS = ("joiner.mid_transaction", "joiner.after_commit")


def joiner_kills(bootstrap: str, root: Path, kills: int, rate: float = 40.0, seed: int = 7) -> dict[str, Any]:
    """`online-rl join` SIGKILLed `kills` times inside or right after its transaction while users
    chat and give thumbs at `rate` requests/s; then one lifetime joins the rest. Every request's
    thumb must become exactly one sample."""
    from online_rl.events import Feedback, FeedbackKind, Interaction, Message, TrainingSample, decode, encode

    prefix = f"j{uuid.uuid4().hex[:8]}"
    topics, bus = _topics(bootstrap, prefix)
    producer = bus.producer()
    produced, stop = [0], threading.Event()

    def users() -> None:  # an interaction, then its thumb, keyed by request id as the services do
        while not stop.is_set():
            i, now = produced[0], time.time()
            rid = f"r{i}"
            producer.produce(topics.interactions, encode(Interaction(
                request_id=rid, user_id=f"u{i % 50}", created_at=now, model="m",
                prompt=[Message(role="user", content="hi")], prompt_token_ids=[1, 2], completion="ok",
                completion_token_ids=[3], completion_logprobs=[-0.5])), rid.encode())
            producer.produce(topics.feedback, encode(Feedback(
                event_id=f"e{i}", request_id=rid, user_id=f"u{i % 50}", created_at=now + 0.01,
                kind=FeedbackKind.thumbs, value=1.0 if i % 3 else -1.0)), rid.encode())
            produced[0] += 1
            if produced[0] % 20 == 0:
                producer.flush()
            stop.wait(1.0 / rate)
        producer.flush()

    env = {**os.environ, "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "ORL_BUS__TOPIC_PREFIX": prefix,
           "ORL_LOG_FORMAT": "json", "ORL_JOIN__WINDOW_S": "1"}
    argv = [sys.executable, "-m", "online_rl.cli", "join"]
    rng = random.Random(seed)
    feeder = threading.Thread(target=users, daemon=True)
    feeder.start()
    killed = 0
    restarts: list[float] = []
    try:
        for i in range(kills):
            point = f"{rng.choice(JOINER_POINTS)}@{rng.randint(1, 3)}"
            started = time.monotonic()
            with open(root / f"joiner-{i}.log", "w") as log:
                code = subprocess.run(argv, env=env | {"ORL_FAILPOINTS": point}, stdout=log, stderr=log,
                                      timeout=300).returncode
            killed += code == -signal.SIGKILL
            restarts.append(time.monotonic() - started)
    finally:
        stop.set()
        feeder.join(timeout=30)
    total = produced[0]
    with open(root / "joiner-last.log", "w") as log:  # joins what is left, then is stopped
        last = subprocess.Popen(argv, env=env, stdout=log, stderr=log)
        seen, quiet_since, count = 0, time.monotonic(), 0
        while time.monotonic() - quiet_since < 20:
            time.sleep(2)
            count = sum(1 for _ in bus.read_all(topics.samples))
            if count != seen:
                seen, quiet_since = count, time.monotonic()
            if count >= total:
                break
        last.send_signal(signal.SIGTERM)
        last.wait(timeout=60)
    per_request: dict[str, int] = {}
    for record in bus.read_all(topics.samples):
        sample = decode(record.value or b"", TrainingSample)
        rid = sample.completion.request_id if sample.completion else sample.sample_id
        per_request[rid] = per_request.get(rid, 0) + 1
    bus.close()
    return {"joiner_kills": kills, "joiner_sigkilled": killed, "joiner_requests": total,
            "samples_duplicated": sum(c - 1 for c in per_request.values()),
            "samples_missing": sum(1 for i in range(total) if f"r{i}" not in per_request),
            "joiner_lifetime_s": round(statistics.median(restarts), 1) if restarts else None}


CLUSTER = ROOT / "deploy" / "local" / "kafka" / "cluster.sh"


def _cluster(folder: Path) -> Any:
    """`cluster.sh <args>` (its stdout) for a three-node cluster of its own: free ports, `folder`."""
    env = {**os.environ, "ORL_KAFKA_CLUSTER_PORT": str(_free_port_block()),
           "ORL_KAFKA_CLUSTER_RUN": str(folder)}

    def cluster(*args: str) -> str:
        return subprocess.run(["bash", str(CLUSTER), *args], env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    return cluster


def broker_kills(root: Path, cycles: int, rate: float = 25.0, down_s: float = 8.0,
                 port: int | None = None, seed: int = 3) -> dict[str, Any]:
    """Users post thumbs through the real feedback API (`online-rl serve feedback`) at `rate`/s to a
    three-node cluster (replication 3, min ISR 2) while a node is SIGKILLed and restarted `cycles`
    times, every other time the leader of the feedback topic's partition 0. Every event the API
    acknowledged (202) must be on the topic, once."""


    cluster = _cluster(root / "cluster")
    bootstrap = cluster("start").splitlines()[-1]
    try:
        return _broker_traffic(bootstrap, cluster, root, cycles, rate, down_s, port, seed)
    finally:
        cluster("stop")


def _broker_traffic(bootstrap: str, cluster: Any, root: Path, cycles: int, rate: float, down_s: float,
                    port: int | None, seed: int) -> dict[str, Any]:
    """`broker_kills` on a started cluster."""
    import httpx

    from online_rl.bus.kafka import KafkaBus
    from online_rl.bus.topics import Topics
    from online_rl.client import FeedbackClient, FeedbackRejected
    from online_rl.events import Feedback, decode
    from online_rl.ingest import new_key

    key, digest = new_key()
    prefix = f"b{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    service_env = {"ORL_CACHE_DIR": str(root / "feedback"), "ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap,
                   "ORL_BUS__TOPIC_PREFIX": prefix, "ORL_BUS__PARTITIONS": "2",
                   "ORL_FEEDBACK_API__API_KEYS": f'["{digest}"]', "ORL_FEEDBACK_API__RATE_LIMIT_PER_S": "1e9",
                   "ORL_FEEDBACK_API__RATE_BURST": "1e9", "ORL_FEEDBACK_API__USER_CAP": "1000000000"}
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    acked: list[str] = []
    errors: list[str] = []
    acks_at: list[float] = []
    stop = threading.Event()

    def users() -> None:  # the project's client: a 503 or a dropped connection is retried, same event id
        with FeedbackClient(url, key, timeout=30) as client:
            i = 0
            while not stop.is_set():
                event_id = f"ev{i}"
                try:
                    client.thumbs(f"req-{i}", user_id=f"user-{i % 500}", up=bool(i % 3), event_id=event_id)
                    acked.append(event_id)
                    acks_at.append(time.monotonic())
                except (FeedbackRejected, httpx.HTTPError) as error:
                    errors.append(type(error).__name__)
                i += 1
                stop.wait(1.0 / rate)

    rng = random.Random(seed)
    kills: list[dict[str, Any]] = []
    server = start_cli_service(["serve", "feedback", "--port", str(port)], service_env, url,
                               "feedback service", timeout_s=120)
    bus = KafkaBus(bootstrap)
    feeder = threading.Thread(target=users, daemon=True)
    try:
        feeder.start()
        time.sleep(3)
        for c in range(cycles):
            meta = bus._metadata(topics.feedback).topics[topics.feedback].partitions
            leader = int(meta[0].leader)
            node = leader if c % 2 == 0 else rng.choice([n for n in (1, 2, 3) if n != leader])
            cluster("kill", str(node))
            killed_at = time.monotonic()
            time.sleep(down_s)
            cluster("restart", str(node))
            back = time.monotonic()
            time.sleep(3)
            kills.append({"node": node, "leader": node == leader, "down_s": round(back - killed_at, 1)})
            print(f"broker cycle {c + 1}: node {node}{' (leader of partition 0)' if node == leader else ''} "
                  f"down {back - killed_at:.1f}s", flush=True)
        time.sleep(2)
    finally:
        stop.set()
        if feeder.ident is not None:  # started (a SIGTERM may come before)
            feeder.join(timeout=60)
        server.terminate()
        server.wait(30)
    on_topic: dict[str, int] = {}
    for record in bus.read_all(topics.feedback):
        event = decode(record.value or b"", Feedback)
        on_topic[event.event_id] = on_topic.get(event.event_id, 0) + 1
    bus.close()
    gaps = [b - a for a, b in itertools.pairwise(acks_at)]
    return {"broker_cycles": cycles, "broker_leader_kills": sum(k["leader"] for k in kills),
            "feedback_acked": len(acked), "feedback_on_topic": sum(1 for e in acked if e in on_topic),
            "feedback_duplicated_on_topic": sum(c - 1 for c in on_topic.values()),
            "feedback_client_errors": len(errors), "feedback_error_kinds": sorted(set(errors)),
            "feedback_longest_stall_s": round(max(gaps), 2) if gaps else None}


def bus_outage(root: Path, model: tuple[Path, str], mlflow_url: str, outage_s: float, rate: float = 4.0,
               seed: int = 5) -> dict[str, Any]:
    """Every node of a three-node cluster SIGKILLed at once for `outage_s` while the whole loop runs on
    it (users chatting with an inference replica and posting thumbs through the feedback API, the
    joiner, the trainer); then all restarted. The seconds each component takes, from the cluster's
    return, to do its work again: `ready_after_broker_s` (target 30 s each)."""
    import httpx

    from bench.chaos_serving import Service
    from online_rl.bus import TopicPartition
    from online_rl.client import FeedbackClient, FeedbackRejected
    from online_rl.ingest import new_key

    cluster = _cluster(root / "bus-cluster")
    bootstrap = cluster("start").splitlines()[-1]
    prefix, work = f"u{uuid.uuid4().hex[:8]}", root / "bus"
    topics, bus = _topics(bootstrap, prefix)
    (up_key, up_digest), (fb_key, fb_digest) = new_key(), new_key()
    common = {"ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "ORL_BUS__TOPIC_PREFIX": prefix,
              "ORL_BUS__PARTITIONS": "2", "ORL_MODEL__PATH": str(model[0]), "ORL_MODEL__NAME": model[1],
              "ORL_LOG_FORMAT": "json"}
    replica = Service("inference", common | {
        "ORL_CACHE_DIR": str(work / "replica"), "ORL_INFERENCE__ENGINE": "transformers",
        "ORL_INFERENCE__MAX_MODEL_LEN": "512",
        "ORL_INFERENCE__API_KEYS": json.dumps([f"{up_digest} inference"])},
        root / "bus-replica.log")
    feedback = Service("feedback", common | {
        "ORL_CACHE_DIR": str(work / "feedback"), "ORL_FEEDBACK_API__API_KEYS": json.dumps([fb_digest])},
        root / "bus-feedback.log")
    joiner_log = open(root / "bus-joiner.log", "ab")  # noqa: SIM115 (the joiner's, for its lifetime)
    joiner = subprocess.Popen([sys.executable, "-m", "online_rl.cli", "join"], stdout=joiner_log,
                              stderr=joiner_log, env={**os.environ, **common, "ORL_JOIN__WINDOW_S": "1",
                                                      "ORL_CACHE_DIR": str(work / "joiner")})
    trainer_env = _trainer_env(bootstrap, model, work / "trainer", prefix, mlflow_url, "chaos-bus")
    trainer = TrainerProcess(trainer_env | {"ORL_TRAINER__PUBLISH_EVERY_SAMPLES": "1000000"}, [],
                             root / "bus-trainer.log")
    accepted: list[float] = []  # when each thumb was acknowledged
    stop = threading.Event()
    rng = random.Random(seed)

    def users() -> None:  # chat with the replica, then a thumb through the feedback API on the answer
        with (httpx.Client(timeout=60, headers={"Authorization": f"Bearer {up_key}"}) as chat,
              FeedbackClient(feedback.url, fb_key, timeout=30, max_attempts=50) as thumbs):
            i = 0
            while not stop.is_set():
                user = f"user-{i % 20}"
                body = {"model": model[1], "max_tokens": 4, "user": user,
                        "messages": [{"role": "user", "content": f"question {i}"}]}
                with contextlib.suppress(httpx.HTTPError, FeedbackRejected, KeyError):
                    answer = chat.post(replica.url + "/v1/chat/completions", json=body).json()
                    thumbs.thumbs(answer["request_id"], user_id=user, up=rng.random() < 0.5)
                    accepted.append(time.monotonic())
                i += 1
                stop.wait(rng.expovariate(rate))

    feeder = threading.Thread(target=users, daemon=True)
    steps: list[float] = []

    def watch_trainer() -> None:
        while (got := trainer.next_event(3600)) is not None and got[1].get("event") != "exited":
            if got[1].get("event") == "step":
                steps.append(got[0])

    watcher = threading.Thread(target=watch_trainer, daemon=True)
    watcher.start()

    inputs = [TopicPartition(t, p) for t in (topics.interactions, topics.feedback)
              for p in range(bus.partitions(t))]
    watcher_of_joiner = bus.consumer(f"{prefix}-joiner")  # the joiner's group (named after its topics):
    # it reads the group's commits; it never subscribes

    def joiner_committed() -> int:  # the input records the joiner has joined and committed, in all
        return sum(o or 0 for o in watcher_of_joiner.committed(inputs).values())

    def log_healthy() -> bool:
        body = httpx.get(replica.url + "/readyz", timeout=5).json()
        return body.get("interaction_log_error") is None and body.get("interaction_log_buffered") == 0

    ready: dict[str, float | None] = {}
    try:
        replica.start()
        feedback.start()
        feeder.start()
        deadline = time.monotonic() + 600
        while not steps and time.monotonic() < deadline:  # the whole loop runs: a trained step
            time.sleep(1)
        if not steps:
            raise SystemExit(f"bus outage: the trainer trained no step (log: {root / 'bus-trainer.log'})")
        committed_before = joiner_committed()
        for node in (1, 2, 3):
            cluster("kill", str(node))
        down_at = time.monotonic()
        time.sleep(outage_s)
        cluster("restart", "1", "2", "3")
        back = time.monotonic()
        print(f"bus outage: all nodes down {back - down_at:.1f}s", flush=True)
        checks = {"feedback_api": lambda: any(a > back for a in accepted),
                  "inference": log_healthy,
                  # the joiner works again when a transaction of its commits what it read (the end
                  # offset of the samples topic is no sign: the coordinator's abort marker for the
                  # transaction the outage cut moves it too)
                  "joiner": lambda: joiner_committed() > committed_before,
                  "trainer": lambda: any(t > back for t in steps)}
        deadline = back + 180
        while len(ready) < len(checks) and time.monotonic() < deadline:
            for name, check in checks.items():
                if name not in ready:
                    with contextlib.suppress(Exception):
                        if check():
                            ready[name] = round(time.monotonic() - back, 1)
            time.sleep(0.25)
        ready |= {name: None for name in checks if name not in ready}  # not ready within 180 s
        for name, log, pid in (("trainer", "bus-trainer.log", trainer.process.pid),
                               ("joiner", "bus-joiner.log", joiner.pid)):
            took = ready[name]
            if took is None or took > 30:  # over the target: what it was doing, for the reader
                if took is None:  # where it is stuck: its threads' stacks (SIGUSR1, online_rl.cli)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGUSR1)
                        time.sleep(1)
                tail = (root / log).read_text(errors="replace").splitlines()[-80:]
                said = "did not work again within 180 s" if took is None else f"took {took} s"
                print(f"bus outage: the {name} {said}; its log ends:", *tail, sep="\n", flush=True)
    finally:
        stop.set()
        if feeder.ident is not None:  # started (a SIGTERM may come before)
            feeder.join(timeout=60)
        trainer.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(SystemExit):
            trainer.wait(120)
        joiner.send_signal(signal.SIGTERM)
        try:
            joiner.wait(60)
        except subprocess.TimeoutExpired:
            joiner.kill()
        joiner_log.close()
        replica.stop()
        feedback.stop()
        watcher_of_joiner.close()
        bus.close()
        cluster("stop")
    return {"bus_outage_s": round(back - down_at, 1), "ready_after_broker_s": ready}


def _free_port_block() -> int:
    """A first port p such that p..p+2 and p+100..p+102 are free (a cluster's ports)."""
    for _ in range(50):
        first = random.randint(30000, 40000)
        ports = [first + i for i in (0, 1, 2, 100, 101, 102)]
        try:
            for p in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return first
    raise SystemExit("no free block of ports for the three-node cluster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", help="a Kafka broker (default: a local one started for the run)")
    parser.add_argument("--schedule", choices=("full", "short"), default="full")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--outage-s", type=float, default=120.0)
    parser.add_argument("--joiner-kills", type=int, default=25)
    parser.add_argument("--bus-outage-s", type=float, default=30.0,
                        help="how long every Kafka node stays down in the bus part")
    parser.add_argument("--broker-cycles", type=int, default=5)
    parser.add_argument("--model", type=Path, help="the model (default: a tiny random Llama)")
    parser.add_argument("--model-name", default="tiny-llama")
    parser.add_argument("--smoke", action="store_true", help="the short schedule, 40 samples, a 10 s outage")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"which parts run, comma-separated (default: all of {', '.join(PARTS)})")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if unknown := set(parts) - set(PARTS):
        parser.error(f"--parts: {', '.join(sorted(unknown))} is not a part; the parts are {', '.join(PARTS)}")
    def stopped(signum: int, _: Any) -> None:  # SIGTERM runs the parts' clean-up (they started processes
        raise SystemExit(128 + signum)         # of their own: a cluster, an MLflow server, the services)

    signal.signal(signal.SIGTERM, stopped)
    if args.smoke:
        args.schedule, args.samples, args.outage_s = "short", 40, 10.0
        args.joiner_kills, args.broker_cycles, args.bus_outage_s = 3, 1, 30.0
    started = time.monotonic()
    with (tempfile.TemporaryDirectory(prefix="orl-bench-chaos-") as tmp,
          kafka_broker(args.bootstrap) as bootstrap):
        root = Path(tmp)
        if args.model is None:
            from online_rl.config import load_settings
            from online_rl.models import build_tiny_llama, prepare_embedded_model

            tokenizer = prepare_embedded_model(load_settings().model_dir).path
            args.model = build_tiny_llama(root / "model", tokenizer, seed=0, hidden_size=64, num_layers=1)
        model = (args.model, args.model_name)
        server = MlflowServer(root / "mlflow")
        server.start()
        try:
            result: dict[str, Any] = {}
            part_s: dict[str, float] = {}
            runs: dict[str, Callable[[], dict[str, Any]]] = {
                "brokers": lambda: broker_kills(root, args.broker_cycles),
                "joiner": lambda: joiner_kills(bootstrap, root, args.joiner_kills),
                "trainer": lambda: kill_points(bootstrap, model, root, server,
                                               FULL if args.schedule == "full" else SHORT, args.samples),
                "outage": lambda: mlflow_outage(bootstrap, model, root, server, args.outage_s),
                "bus": lambda: bus_outage(root, model, server.url, args.bus_outage_s),
                "serving": lambda: serving_faults(bootstrap, model, root / "serving", server.url),
            }
            for name in PARTS:
                if name in parts:
                    began = time.monotonic()
                    figures = runs[name]()
                    part_s[name] = round(time.monotonic() - began, 1)
                    result |= figures
                    print(f"{name} ({part_s[name]} s): {figures}", flush=True)
            result["part_s"] = part_s
        finally:
            server.kill()
    result |= {"seconds": round(time.monotonic() - started, 1), "schedule": args.schedule, "parts": parts}
    emit(result)


if __name__ == "__main__":
    main()
