"""`online-rl up / status / down` and `online-rl demo` on real processes: MLflow's server, the inference
replica (transformers, tiny model), the feedback API, the joiner, the trainer (Ray) and the gateway, on
the suite's real Kafka broker."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from bench.common import missing_fields
from bench.demo import FIELDS as DEMO_FIELDS
from bench.demo import demo_figures
from online_rl.config import Settings, load_settings
from online_rl.launch import (
    ComponentStatus,
    LaunchError,
    down,
    read_keys,
    read_registry_auth,
    read_state,
    status,
    up,
    watchdog_alive,
)
from online_rl.ports import free_port
from tests.conftest import TINY_NAME, SecuredBroker
from tests.deploy.monitoring import exposed_series, queried_metrics


def _config(root: Path, model: Path, kafka: dict[str, str] | None) -> tuple[Settings, Path]:
    data = {
        "cache_dir": str(root / "cache"),
        "model": {"name": TINY_NAME, "path": str(model)},
        "bus": {"partitions": 2, "topic_prefix": f"l{os.getpid()}{free_port()}"},
        "join": {"window_s": 3},
        "mlflow": {"registered_model": "policy"},
        "inference": {"engine": "transformers", "max_model_len": 512, "port": free_port()},
        "feedback_api": {"port": free_port()},
        "trainer": {"batch_size": 8, "batch_timeout_s": 2, "publish_every_samples": 8,
                    "learning_rate": 1e-3, "group_id": f"launch-{free_port()}"},
        "gateway": {"port": free_port(), "holdout": 0.2,  # 5 of the demo's 20 users: the base model
                    "rollout": {"interval_s": 1, "steps": [0.5, 1.0], "min_samples": 5}},
        "ray": {"num_cpus": 2},
        "launch": {"run_dir": str(root / "run"), "mlflow_port": free_port(),
                   "trainer_metrics_port": free_port(), "joiner_metrics_port": free_port(),
                   "ready_timeout_s": 240, "bus": "embedded",
                   "max_restarts": 1, "restart_backoff_s": 0.5},
    }
    if kafka:
        data["kafka"] = kafka
    path = root / "online-rl.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_settings(path), path


@pytest.fixture
def stopper() -> Iterator[list[Settings]]:
    started: list[Settings] = []
    yield started
    for settings in started:
        down(settings, echo=lambda _: None)


def _pids(settings: Settings) -> list[int]:
    state = read_state(settings.run_dir)
    if state is None:
        return []
    return [c["pid"] for c in state["components"].values() if c.get("pid")]


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


@pytest.mark.slow
@pytest.mark.kafka
def test_up_runs_the_loop_the_demo_reports_on_it_and_down_stops_it(
        tmp_path: Path, tiny_model: Path, secured_broker: SecuredBroker, stopper: list[Settings]) -> None:
    # the broker asks for TLS and SCRAM: every component reaches it through the kafka.* settings
    settings, config = _config(tmp_path, tiny_model, secured_broker.kafka_settings())
    stopper.append(settings)
    lines: list[str] = []
    began = time.monotonic()
    up(settings, config, echo=lines.append)
    up_s = time.monotonic() - began
    wiring, components = status(settings)
    assert wiring is not None and wiring["bus"] == "kafka" and wiring["bootstrap"] == secured_broker.bootstrap
    assert [c.name for c in components] == ["mlflow", "inference", "feedback", "joiner", "trainer", "gateway"]
    assert {c.state for c in components} == {"ready"}, components
    assert all(Path(c.log).is_file() for c in components if c.log)
    assert any("gateway ready in" in line for line in lines)
    keys = read_keys(settings.run_dir)
    assert os.stat(settings.run_dir / "keys.json").st_mode & 0o077 == 0  # the raw keys: owner only
    # the trainer signs versions with the run's key and serving loads only what it signed (the
    # promotion below would fail otherwise)
    assert os.stat(settings.run_dir / "signing.pem").st_mode & 0o077 == 0

    # MLflow asks who is there: each component signs in as its own user (the passwords: owner only)
    assert os.stat(settings.run_dir / "mlflow-auth.json").st_mode & 0o077 == 0
    registry = read_registry_auth(settings.run_dir)
    assert registry is not None
    viewer = registry.users["inference"]
    assert httpx.get(wiring["mlflow_url"], timeout=10).status_code == 401
    ui = httpx.get(wiring["mlflow_url"], auth=(viewer.username, viewer.password), timeout=10)
    assert ui.status_code == 200

    # Wired together: users chat through the gateway and post feedback with the user key, which cannot steer
    # rollouts; the admin key can.
    llm = openai.OpenAI(base_url=wiring["gateway_url"] + "/v1", api_key=keys.user)
    answer = llm.chat.completions.create(model="any", user="u1", max_tokens=4,
                                         messages=[{"role": "user", "content": "Hi"}])
    assert answer.model == TINY_NAME
    user_auth = {"Authorization": f"Bearer {keys.user}"}
    posted = httpx.post(wiring["feedback_url"] + "/v1/feedback", headers=user_auth,
                        json={"event_id": "e1", "request_id": answer.id, "user_id": "u1", "kind": "thumbs",
                              "value": 1}, timeout=10)
    assert posted.status_code in (200, 202), posted.text
    for key, code in ((keys.user, 403), ("not-a-key", 401), (keys.admin, 200)):
        got = httpx.get(wiring["gateway_url"] + "/rollout", headers={"Authorization": f"Bearer {key}"},
                        timeout=10)
        assert got.status_code == code
    with pytest.raises(LaunchError, match="already running"):
        up(settings, config, echo=lambda _: None)

    # The demo on the running loop: simulated users until one version is promoted and has served a few
    # answers, or a budget that also fits a machine busy with other tests (45 s was too short twice in CI
    # with two and three test workers on 2 cores: once nothing was published yet), then the report.
    from online_rl.demo import DemoOptions, run_demo

    said: list[str] = []
    options = DemoOptions(budget_s=120, promotions=1, measure=5, concurrency=4, max_tokens=8, users=20,
                          silent=0.0, noise=0.0, line_every_s=5)
    report = run_demo(settings, tmp_path / "report", options, echo=said.append)
    saved = json.loads((tmp_path / "report" / "report.json").read_text())
    # no terminal here: plain progress lines instead of bars, so a run in CI or under nohup shows life
    progress = [line for line in said if line.startswith("[") and " answers · reward (last 200) " in line]
    assert len(progress) >= 3 and all("trainer step" in line for line in progress), said
    assert saved["stopped_by"] in ("goal", "budget") and saved["final_answers"] >= 0
    # the demo benchmark's figures (bench/demo.py runs this loop and this demo; CI checks its line here)
    figures = demo_figures(report, up_s)
    assert missing_fields(figures, [f for f in DEMO_FIELDS if f != "machine"]) == [], figures
    assert figures["base_reward"] == saved["base_reward"] and figures["stopped_by"] == saved["stopped_by"]
    json.dumps(figures)  # the line the benchmark prints
    assert saved["machine"]["precision"] in ("fp32", "bf16") and saved["machine"]["isa"]
    assert saved["restarts"] == dict.fromkeys(
        ["mlflow", "inference", "feedback", "joiner", "trainer", "gateway"], 0) and saved["exited"] == []
    assert saved["base_reward"] == report["base_reward"] is not None
    assert {"base_reward", "final_reward", "promoted_versions", "freshness_s"} <= set(saved)
    assert saved["meta"]["requests"] > 10
    # the base reward is the holdout's: users the base model served beside the versions all along
    assert saved["base_source"].startswith("holdout") and saved["base_feedback"] >= 1, saved["base_source"]
    assert saved["base_interval"][0] <= saved["base_reward"] <= saved["base_interval"][1]
    assert (tmp_path / "report" / "reward.png").stat().st_size > 10_000
    markdown = (tmp_path / "report" / "report.md").read_text()
    assert "## Reward per version over time" in markdown and "## Rollout decisions" in markdown
    assert saved["ability"]["models"][TINY_NAME]["asked"] == 8
    # The whole loop turned: the trainer published from the users' feedback (every 8 samples), MLflow
    # lists the version with the offsets it was trained on, the gateway hot-swapped it and started its
    # canary, and the report traced its training data back to the users' own requests (freshness).
    # (A version may already have been published, and its canary started, before the demo began.)
    assert saved["mlflow_versions"], "the trainer published no version from the simulated feedback"
    assert all(v["tags"]["offsets"].startswith(settings.bus.topic_prefix) for v in saved["mlflow_versions"])
    published = {f"policy-v{v['version']}" for v in saved["mlflow_versions"]}
    started = [d["version"] for d in saved["decisions"] if d["action"] == "start"]
    assert started and set(started) <= published, (saved["decisions"], saved["meta"]["problems"])
    fresh = saved["freshness_s_by_version"]
    assert any(0 < fresh.get(v, -1) < 60 for v in started), (fresh, started)

    # The chart's dashboard and alerts query only metrics the running components export.
    pages = [wiring["gateway_url"], wiring["inference_url"], wiring["feedback_url"],
             wiring["trainer_metrics_url"], f"http://127.0.0.1:{settings.launch.joiner_metrics_port}"]
    exposed = set().union(*(exposed_series(httpx.get(f"{url}/metrics", timeout=10).text) for url in pages))
    missing = queried_metrics() - exposed
    assert not missing, f"the dashboard or the alerts query what no component exports: {sorted(missing)}"

    # The loop heals: the joiner and the feedback API killed outright are restarted by the watchdog
    # (as a Deployment would), and a user's feedback still becomes a training sample.
    state = read_state(settings.run_dir)
    assert state is not None and watchdog_alive(settings)
    for name in ("joiner", "feedback"):
        os.kill(state["components"][name]["pid"], signal.SIGKILL)
    healed = _wait_for(settings, lambda c: {c["joiner"].state, c["feedback"].state} == {"ready"}
                       and c["joiner"].restarts == c["feedback"].restarts == 1)
    assert healed["gateway"].restarts == 0
    answer = llm.chat.completions.create(model="any", user="u9", max_tokens=4,
                                         messages=[{"role": "user", "content": "Hello again"}])
    posted = httpx.post(wiring["feedback_url"] + "/v1/feedback", headers=user_auth,
                        json={"event_id": "e-after", "request_id": answer.id, "user_id": "u9",
                              "kind": "thumbs", "value": 1}, timeout=10)
    assert posted.status_code in (200, 202), posted.text
    _wait_for_sample(settings, answer.id)
    # ... but not forever: past launch.max_restarts (1 here) in the window it gives up and says why
    os.kill(read_state(settings.run_dir)["components"]["feedback"]["pid"], signal.SIGKILL)  # type: ignore[index]
    failed = _wait_for(settings, lambda c: c["feedback"].state == "failed")["feedback"]
    assert failed.problem is not None and "launch.max_restarts" in failed.problem

    pids = _pids(settings)
    watchdog = read_state(settings.run_dir)["watchdog"]["pid"]  # type: ignore[index]
    stopped = down(settings, echo=lambda _: None)
    assert stopped == ["gateway", "trainer", "joiner", "inference", "mlflow"]  # the feedback API was down
    assert _dead(watchdog) and not watchdog_alive(settings)
    deadline = time.monotonic() + 10
    while not all(_dead(pid) for pid in pids):
        assert time.monotonic() < deadline, "a component outlived `down`"
        time.sleep(0.2)
    assert {c.state for c in status(settings)[1]} == {"stopped", "failed"}


def _wait_for(settings: Settings, done: Callable[[dict[str, ComponentStatus]], bool],
              timeout_s: float = 120) -> dict[str, ComponentStatus]:
    deadline = time.monotonic() + timeout_s
    while True:
        components = {c.name: c for c in status(settings)[1]}
        if done(components):
            return components
        assert time.monotonic() < deadline, components
        time.sleep(0.5)


def _wait_for_sample(settings: Settings, request_id: str, timeout_s: float = 60) -> None:
    from online_rl.bus import open_bus
    from online_rl.events import TrainingSample, decode

    bus = open_bus(settings)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for record in bus.read_all(settings.topics.samples):
                sample = decode(record.value or b"", TrainingSample)
                if sample.completion is not None and sample.completion.request_id == request_id:
                    return
            time.sleep(1.0)
    finally:
        bus.close()
    raise AssertionError(f"no training sample for {request_id} after the restarts")


def test_a_taken_port_is_named_with_its_setting_and_nothing_starts(tmp_path: Path, tiny_model: Path,
                                                                  stopper: list[Settings]) -> None:
    settings, config = _config(tmp_path, tiny_model, None)
    stopper.append(settings)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", settings.gateway.port))
        squatter.listen()
        with pytest.raises(LaunchError) as refused:
            up(settings, config, echo=lambda _: None)
    message = str(refused.value)
    assert f"port {settings.gateway.port} (gateway) is taken" in message
    assert "gateway.port" in message and "ORL_GATEWAY__PORT" in message
    assert _pids(settings) == []


@pytest.mark.slow
def test_a_component_that_fails_to_start_is_reported_with_its_log_and_the_rest_stopped(
        tmp_path: Path, tiny_model: Path, stopper: list[Settings]) -> None:
    settings, config = _config(tmp_path, tmp_path / "no-such-model", None)
    stopper.append(settings)
    with pytest.raises(LaunchError) as failed:
        up(settings, config, echo=lambda _: None)
    message = str(failed.value)
    assert "inference exited during start-up" in message and "inference.log" in message
    assert "no-such-model" in message  # the end of its log says why
    state = read_state(settings.run_dir)
    assert state is not None and state["components"]["mlflow"]["pid"] is None  # MLflow was stopped again
    assert _free(settings.launch.mlflow_port)


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_restart_policy_backs_off_and_gives_up_after_max_restarts_in_the_window() -> None:
    from online_rl.launch.watchdog import RestartPolicy

    policy = RestartPolicy(backoff_s=1.0, backoff_max_s=8.0, max_restarts=3, window_s=100.0)
    assert policy.restart_at([], 1000.0) == 1001.0  # first exit: after the base backoff
    assert policy.restart_at([990.0], 1000.0) == 1002.0  # doubled per restart in the window
    assert policy.restart_at([980.0, 990.0], 1000.0) == 1004.0
    assert policy.restart_at([970.0, 980.0, 990.0], 1000.0) is None  # max_restarts in the window: give up
    assert policy.restart_at([700.0, 800.0, 990.0], 1000.0) == 1002.0  # older restarts have left the window
    long = RestartPolicy(backoff_s=1.0, backoff_max_s=8.0, max_restarts=100, window_s=100.0)
    assert long.restart_at([999.0] * 10, 1000.0) == 1008.0  # never longer than backoff_max_s
