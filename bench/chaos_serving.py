"""The serving half of bench/chaos.py: users chat through the gateway while an inference replica is
SIGKILLed in the middle of a hot swap, the gateway is SIGKILLed after saving a promotion and again in
the middle of telling MLflow, a replica is SIGKILLed while serving, and a replica's adapter disk is
full. Real processes throughout: two `online-rl serve inference` replicas (transformers engine), one
`online-rl serve gateway`, an `mlflow server`, the Kafka broker.

The schedule (`interval_s` is the rollout controller's interval):

1. Replica A runs with `ORL_FAILPOINTS=serving.mid_load`: version 1 is published, the controller hot-
   swaps it into both replicas, and A dies with the version's files on its disk and the engine not
   yet loaded. A is restarted: it deletes the dead process's copy and the controller loads the
   version again (`replica_reload_s`, from ready to serving it).
2. Version 1 is promoted by hand. Version 2 is published; its rollout starts; it is promoted by hand,
   and the gateway (`rollout.after_state_write@4`) dies with the promotion in its state file and
   neither its audit line nor MLflow written. The next gateway (`rollout.mid_mlflow`) dies after
   moving MLflow's `champion` alias, before dropping `challenger` and tagging. The third finishes:
   `gateway_recovered` checks MLflow's aliases and tags and the audit log (each decision once).
3. Replica B is SIGKILLed the instant after it answered a request of its own
   (`killed_right_after_answering_logged`: that answer's record is on the topic), and restarted:
   `replica_restart_to_champion_s`.
4. Replica A is restarted with its adapter folder on a full tmpfs (a mount namespace of its own,
   `unshare -Urm`; skipped where the machine refuses one): it must refuse the champion's load with a
   clear error, leave nothing on the disk and keep serving (the gateway fails over); once the disk
   is freed it loads the champion (`disk_freed_to_champion_s`).

Users send chats at `rate` per second with a client that retries a refused or dropped request for up
to `budget_s` (a practitioner's client: the gateway is one process, so its restart is a gap to wait
out). Figures: `interactions_answered` (answers received) and `interactions_logged` (of those, how
many are on the interactions topic: equal, because a replica holds an answer's last bytes until its
record is confirmed), `serving_client_errors` (requests that failed beyond the budget: 0),
`serving_retried`, `serving_longest_stall_s`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import ROOT
from online_rl.ports import free_port

__all__ = ["Service", "serving_faults"]

REGISTERED = "policy"


class Service:
    """One `online-rl serve ...` process: started, waited for, SIGKILLed, restarted."""

    def __init__(self, kind: str, env: dict[str, str], log: Path, wrap: list[str] | None = None) -> None:
        self.kind, self.env, self.log, self.wrap = kind, env, log, wrap
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, failpoints: str = "", wait: bool = True, wrap: list[str] | None = None) -> float:
        """Start it (with `failpoints` armed); returns when /readyz answers 200 (the time), unless
        `wait` is False."""
        env = {**os.environ, **self.env, "ORL_FAILPOINTS": failpoints}
        if not failpoints:
            env.pop("ORL_FAILPOINTS")
        argv = [sys.executable, "-m", "online_rl.cli", "serve", self.kind, "--port", str(self.port)]
        wrap = wrap if wrap is not None else self.wrap
        if wrap:  # a shell command that ends with `exec `: the service is its last word
            argv = [*wrap[:-1], wrap[-1] + " ".join(shlex.quote(a) for a in argv)]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=ROOT)
        return self.wait_ready() if wait else time.monotonic()

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        import httpx

        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"the {self.kind} service exited during start-up (see {self.log})")
            time.sleep(0.2)
        raise RuntimeError(f"the {self.kind} service did not become ready (see {self.log})")

    def wait_exit(self, timeout_s: float) -> int | None:
        assert self.process is not None
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def _make_adapter(model_dir: Path, model_name: str, out: Path, seed: int) -> Path:
    """A random (non-identity) LoRA on the model, sealed with its lineage manifest."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from online_rl.registry import write_lineage

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir))
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    model.save_pretrained(str(out))
    config = json.loads((out / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = model_name
    (out / "adapter_config.json").write_text(json.dumps(config))
    write_lineage(out, model_name)
    return out


class Users:
    """Chats through the gateway at `rate` per second; a refused or dropped request is retried for up to
    `budget_s` (then counted as a client error)."""

    def __init__(self, url: str, key: str, rate: float, budget_s: float, seed: int) -> None:
        self.url, self.key, self.rate, self.budget_s = url, key, rate, budget_s
        self.rng = random.Random(seed)
        self.answered: list[tuple[str, str | None]] = []  # (request id, version)
        self.errors: list[str] = []
        self.retried = 0
        self.requests = 0
        self.done_at: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.budget_s + 60)

    def _one(self, client: Any, i: int) -> None:
        import httpx

        body = {"model": "anything", "messages": [{"role": "user", "content": f"tell me about {i % 17}"}],
                "max_tokens": 4, "temperature": 0.7, "user": f"user-{i % 40}"}
        started, attempt, why = time.monotonic(), 0, ""
        while time.monotonic() - started < self.budget_s:
            attempt += 1
            try:
                response = client.post(self.url + "/v1/chat/completions", json=body)
                if response.status_code == 200:
                    version = response.headers.get("x-orl-version")
                    self.answered.append((response.json()["request_id"], version))
                    self.done_at.append(time.monotonic())
                    self.retried += attempt > 1
                    return
                why = f"HTTP {response.status_code}"
                if response.status_code not in (429, 502, 503, 504):
                    break
            except httpx.HTTPError as error:
                why = type(error).__name__
            time.sleep(min(0.2 * 2 ** min(attempt, 4), 2.0))
        self.errors.append(why)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {self.key}"}) as client:
            i = 0
            while not self._stop.is_set():
                self.requests += 1
                self._one(client, i)
                i += 1
                self._stop.wait(self.rng.expovariate(self.rate))


def _adapters(replica: Service, upstream_key: str) -> set[str]:
    import httpx

    response = httpx.get(replica.url + "/admin/adapters", timeout=10,
                         headers={"Authorization": f"Bearer {upstream_key}"})
    response.raise_for_status()
    return {a["name"] for a in response.json()["adapters"]}


def _until(what: str, predicate: Any, timeout_s: float, every: float = 0.1) -> float:
    """Poll `predicate` until true; the time it became true (RuntimeError naming `what` otherwise)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return time.monotonic()
        except Exception:  # a service restarting: ask again
            pass
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _copies(adapters_dir: Path) -> list[str]:
    """The per-load folders on a replica's adapter disk (the owner files' folders)."""
    return sorted(str(p.relative_to(adapters_dir)) for p in adapters_dir.glob("*/*.owner"))


def serving_faults(bootstrap: str, model: tuple[Path, str], root: Path, tracking_uri: str,
                   interval_s: float = 1.0, rate: float = 5.0, budget_s: float = 90.0,
                   seed: int = 11) -> dict[str, Any]:
    import httpx

    from online_rl.bus.kafka import KafkaBus
    from online_rl.bus.topics import Topics
    from online_rl.events import Interaction, decode
    from online_rl.ingest import new_key
    from online_rl.registry import alias_version, publish_adapter
    from online_rl.rollout.state import RolloutStore

    model_dir, model_name = model
    root.mkdir(parents=True, exist_ok=True)
    prefix = f"s{uuid.uuid4().hex[:8]}"
    topics = Topics(prefix)
    (client_key, client_digest), (admin_key, admin_digest), (up_key, up_digest) = (
        new_key() for _ in range(3))
    common = {"ORL_KAFKA__BOOTSTRAP_SERVERS": bootstrap, "ORL_BUS__TOPIC_PREFIX": prefix,
              "ORL_BUS__PARTITIONS": "2", "ORL_MODEL__PATH": str(model_dir), "ORL_MODEL__NAME": model_name,
              "ORL_MLFLOW__TRACKING_URI": tracking_uri, "ORL_MLFLOW__REGISTERED_MODEL": REGISTERED,
              "ORL_LOG_FORMAT": "json", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
    replica_env = common | {"ORL_INFERENCE__ENGINE": "transformers", "ORL_INFERENCE__MAX_MODEL_LEN": "512",
                            "ORL_INFERENCE__API_KEYS": json.dumps([f"{up_digest} inference,admin"])}
    replicas = {}
    for name in ("a", "b"):
        replicas[name] = Service("inference", replica_env | {"ORL_CACHE_DIR": str(root / f"replica-{name}")},
                                 root / f"replica-{name}.log")
    a, b = replicas["a"], replicas["b"]
    gateway_dir = root / "gateway"
    gateway = Service("gateway", common | {
        "ORL_CACHE_DIR": str(gateway_dir),
        "ORL_GATEWAY__REPLICAS": json.dumps([a.url, b.url]), "ORL_GATEWAY__UPSTREAM_API_KEY": up_key,
        "ORL_GATEWAY__API_KEYS": json.dumps([f"{client_digest} inference", f"{admin_digest} admin"]),
        "ORL_GATEWAY__REPLICA_COOLDOWN_S": "1",
        "ORL_GATEWAY__ROLLOUT__INTERVAL_S": str(interval_s),
        # the verdicts are a person's here: the plan holds (no automatic promotion or rollback)
        "ORL_GATEWAY__ROLLOUT__STEPS": "[0.5]", "ORL_GATEWAY__ROLLOUT__MIN_SAMPLES": "1000000",
        "ORL_GATEWAY__ROLLOUT__MAX_P99_LATENCY_RATIO": "1000",
        "ORL_GATEWAY__ROLLOUT__MAX_ERROR_RATE_INCREASE": "1",
    }, root / "gateway.log")
    admin = {"Authorization": f"Bearer {admin_key}"}

    from mlflow import MlflowClient

    mlflow = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    experiment = mlflow.create_experiment(f"chaos-serving-{prefix}")

    def publish(n: int) -> str:
        folder = _make_adapter(model_dir, model_name, root / f"adapter-{n}", seed + n)
        run = mlflow.create_run(experiment)
        version = publish_adapter(mlflow, run.info.run_id, folder, REGISTERED, f"v{n}").version
        mlflow.set_terminated(run.info.run_id)
        return str(version)

    def rollout() -> dict[str, Any]:
        return dict(httpx.get(gateway.url + "/rollout", headers=admin, timeout=10).json()["rollout"] or {})

    def running(version: str) -> bool:
        state = rollout()
        return state.get("challenger") == version and state.get("status") == "running"

    result: dict[str, Any] = {"interval_s": interval_s}
    users = Users(gateway.url, client_key, rate, budget_s, seed)
    kills: list[dict[str, Any]] = []
    last_words = ""
    try:
        # 1. a replica SIGKILLed in the middle of a hot swap
        a.start("serving.mid_load")
        b.start()
        gateway.start("rollout.after_state_write@4")
        users.start()
        time.sleep(2)
        v1 = publish(1)
        code = a.wait_exit(120)
        result["replica_killed_mid_swap"] = code == -signal.SIGKILL
        left = _copies(root / "replica-a" / "adapters")
        print(f"serving: replica A died mid-swap ({code}); left on its disk: {left}", flush=True)
        ready = a.start()
        loaded = _until("replica A to serve v1 again", lambda: f"{REGISTERED}-v{v1}" in _adapters(a, up_key),
                        60 * interval_s + 60)
        result["replica_reload_s"] = round(loaded - ready, 2)
        result["replica_copies_after_restart"] = {"before": len(left),
                                                  "after": len(_copies(root / "replica-a" / "adapters"))}
        _until("the rollout of v1", lambda: running(v1), 120)

        # 2. the gateway SIGKILLed after saving a promotion, then in the middle of telling MLflow
        promoted = httpx.post(gateway.url + "/rollout/promote", headers=admin, timeout=60)
        assert promoted.status_code == 200, promoted.text
        _until("MLflow to name v1 champion", lambda: alias_version(mlflow, REGISTERED, "champion") == v1, 60)
        v2 = publish(2)
        _until("the rollout of v2", lambda: running(v2), 120)
        killed_at = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):  # the gateway dies answering it
            httpx.post(gateway.url + "/rollout/promote", headers=admin, timeout=60)
        died = gateway.wait_exit(60) == -signal.SIGKILL
        kills.append({"point": "rollout.after_state_write", "sigkill": died})
        state = RolloutStore(gateway_dir / "rollout").load()
        kills[-1]["state"] = {"status": state.status if state else None,
                              "mlflow_pending": state.mlflow_pending if state else None,
                              "champion_in_mlflow": alias_version(mlflow, REGISTERED, "champion")}
        gateway.start("rollout.mid_mlflow", wait=False)
        kills.append({"point": "rollout.mid_mlflow", "sigkill": gateway.wait_exit(180) == -signal.SIGKILL,
                      "state": {"champion_in_mlflow": alias_version(mlflow, REGISTERED, "champion"),
                                "challenger_in_mlflow": alias_version(mlflow, REGISTERED, "challenger")}})
        gateway.start()
        _until("the gateway to finish the promotion", lambda: rollout().get("mlflow_pending") is None
               and rollout().get("status") == "promoted", 60)
        result["gateway_down_s"] = round(time.monotonic() - killed_at, 1)
        tags = {v: mlflow.get_model_version(REGISTERED, v).tags for v in (v1, v2)}
        audit = [(e["version"], e["action"]) for e in RolloutStore(gateway_dir / "rollout").entries()]
        recovery = {
            "champion": alias_version(mlflow, REGISTERED, "champion"),
            "challenger": alias_version(mlflow, REGISTERED, "challenger"),
            "v2_status": tags[v2].get("rollout.status"), "v2_replaced": tags[v2].get("rollout.replaced"),
            "v1_superseded_by": tags[v1].get("rollout.superseded_by"), "audit": audit,
        }
        result["gateway_kills"] = kills
        result["gateway_recovery"] = recovery
        result["gateway_recovered"] = (
            recovery["champion"] == v2 and recovery["challenger"] is None
            and recovery["v2_status"] == "promoted" and recovery["v2_replaced"] == v1
            and recovery["v1_superseded_by"] == v2
            and audit == [(v1, "start"), (v1, "promote"), (v2, "start"), (v2, "promote")])
        print(f"serving: gateway kills {kills}; recovery {recovery}", flush=True)

        # 3. a replica SIGKILLed while serving
        champion = f"{REGISTERED}-v{v2}"
        _until("both replicas to serve the champion", lambda: champion in _adapters(a, up_key)
               and champion in _adapters(b, up_key), 60)
        # ... the instant after it answered: the answer's record must be on the topic all the same
        body = {"model": champion, "max_tokens": 4, "temperature": 0.0, "user": "last-words",
                "messages": [{"role": "user", "content": "a last question"}]}
        answer = httpx.post(b.url + "/v1/chat/completions", json=body, timeout=60,
                            headers={"Authorization": f"Bearer {up_key}"})
        b.kill()
        answer.raise_for_status()
        last_words = answer.json()["request_id"]
        time.sleep(1)
        ready = b.start()
        loaded = _until("replica B to serve the champion", lambda: champion in _adapters(b, up_key), 60)
        result["replica_restart_to_champion_s"] = round(loaded - ready, 2)

        # 4. a full adapter disk
        def lacking() -> list[str]:
            status = httpx.get(gateway.url + "/rollout", headers=admin, timeout=10).json()
            return [r["lacking"] for r in status["replicas"] if r.get("lacking")]

        result["disk_full"] = _disk_full(a, up_key, champion, root, interval_s, lacking)
        time.sleep(2)
    finally:
        users.stop()
        for service in (gateway, a, b):
            service.stop()
    bus = KafkaBus(bootstrap)
    try:
        logged = {decode(r.value or b"", Interaction).request_id for r in bus.read_all(topics.interactions)}
    finally:
        bus.close()
    gaps = [y - x for x, y in zip(users.done_at, users.done_at[1:], strict=False)]
    result |= {
        "serving_requests": users.requests, "interactions_answered": len(users.answered),
        "interactions_logged": sum(1 for rid, _ in users.answered if rid in logged),
        "killed_right_after_answering_logged": last_words in logged,
        "serving_client_errors": len(users.errors), "serving_error_kinds": sorted(set(users.errors)),
        "serving_retried": users.retried, "serving_longest_stall_s": round(max(gaps), 1) if gaps else None,
        "serving_versions": sorted({v or "base" for _, v in users.answered}),
    }
    return result


def _disk_full(replica: Service, up_key: str, champion: str, root: Path, interval_s: float,
               lacking: Any) -> dict[str, Any]:
    """Restart `replica` with its adapter folder on a full tmpfs of its own; free it; the figures."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-Urm", "true"],
                                                         capture_output=True).returncode != 0:
        return {"skipped": "this machine gives no mount namespace (unshare -Urm) for a small tmpfs"}
    disk = root / "full-disk"
    disk.mkdir()
    replica.kill()
    script = (f"mount -t tmpfs -o size=1m tmpfs {disk} && "
              f"dd if=/dev/zero of={disk}/filler bs=4k >/dev/null 2>&1; exec ")
    replica.env = replica.env | {"ORL_INFERENCE__ADAPTERS_DIR": str(disk)}
    ready = replica.start(wrap=["unshare", "-Urm", "sh", "-c", script])
    assert replica.process is not None
    inside = Path(f"/proc/{replica.process.pid}/root") / str(disk).lstrip("/")
    time.sleep(max(5.0, 4 * interval_s))  # the controller tries to load the champion and is refused
    served = champion in _adapters(replica, up_key)
    left = sorted(str(p.relative_to(inside)) for p in inside.rglob("*") if p.is_file() and p.name != "filler")
    reasons = lacking()  # the gateway's status page says which replica lacks what, in its own words
    logged = "is full" in replica.log.read_text(errors="replace")
    (inside / "filler").unlink()
    freed = time.monotonic()
    loaded = _until("the replica to load the champion once the disk is free",
                    lambda: champion in _adapters(replica, up_key), 60)
    return {"loaded_while_full": served, "files_left_on_disk": left, "replica_logged_it": logged,
            "gateway_status": reasons[:1],
            "error_named_the_disk": any("is full" in r and "inference.adapters_dir" in r for r in reasons),
            "disk_freed_to_champion_s": round(loaded - freed, 2), "ready_s": round(freed - ready, 1)}
