"""The gateway split into proxies and controllers, as real processes: two proxies give every user the
same arm, the controller that runs the rollout is SIGKILLed mid-rollout and the standby takes the
lease and finishes it from the state on the bus, and the proxies serve throughout, also with no
controller alive (Kafka, MLflow, two inference replicas and the joiner real; docs/deploy.md,
"Scaling the gateway")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import pytest

from online_rl.bus import ensure_topics
from online_rl.bus.kafka import KafkaBus
from online_rl.tracking import mlflow_client
from services.inference.main import create_app as inference_app
from tests.conftest import TINY_NAME
from tests.services.feedback.conftest import free_port, serve
from tests.services.gateway.conftest import GOOD, Stack, Users, _start_joiner, stack_settings

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


@dataclass
class Gateway:
    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def ready(self) -> int | None:
        try:
            return httpx.get(self.url + "/readyz", timeout=2).status_code
        except httpx.HTTPError:
            return None

    def tail(self) -> str:
        return f"--- {self.name}\n" + self.log.read_text(errors="replace")[-3000:]


@pytest.fixture
def split(kafka_bootstrap: str, steerable_model: Path,
          tmp_path: Path) -> Iterator[tuple[Stack, dict[str, Gateway]]]:
    with ExitStack() as stack:
        settings, keys = stack_settings(tmp_path, steerable_model, kafka_bootstrap, ["http://unused"],
                                        steps=[0.5, 1.0], min_samples=10, margin=0.05, max_step_s=300,
                                        guardrail_min_requests=40, max_p99_latency_ratio=3.0)
        bus = KafkaBus(kafka_bootstrap)
        stack.callback(bus.close)
        ensure_topics(bus, settings.topics, settings.bus.partitions)
        replicas = [stack.enter_context(serve(inference_app(settings, bus=bus))) for _ in range(2)]
        _start_joiner(stack, bus, settings.topics, 3.0)
        mlflow_client(settings)  # the store's tables made once, before four processes open it at once
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "ORL_KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
               "ORL_BUS__TOPIC_PREFIX": settings.bus.topic_prefix, "ORL_BUS__PARTITIONS": "2",
               "ORL_MODEL__NAME": TINY_NAME, "ORL_MODEL__PATH": str(steerable_model),
               "ORL_MLFLOW__TRACKING_URI": settings.mlflow_tracking_uri,
               "ORL_MLFLOW__REGISTERED_MODEL": "policy", "ORL_GATEWAY__REPLICAS": json.dumps(replicas),
               "ORL_GATEWAY__UPSTREAM_API_KEY": keys["upstream"],
               "ORL_GATEWAY__API_KEYS": json.dumps(settings.gateway.api_keys),
               "ORL_GATEWAY__REPLICA_COOLDOWN_S": "1", "ORL_GATEWAY__LEASE_DURATION_S": "3",
               "ORL_GATEWAY__LOCK_FILE": str(tmp_path / "controller.lock"),
               "ORL_GATEWAY__ROLLOUT": json.dumps(settings.gateway.rollout.model_dump(mode="json"))}
        gateways: dict[str, Gateway] = {}
        roles = {"controller-a": "controller", "controller-b": "controller", "proxy-1": "proxy",
                 "proxy-2": "proxy"}
        for name, role in roles.items():
            port = free_port()
            log = tmp_path / f"{name}.log"
            # Each process has a state folder of its own: what a controller continues from is on the bus.
            process = subprocess.Popen([sys.executable, "-m", "services.gateway"], stdout=log.open("wb"),
                                       stderr=subprocess.STDOUT,
                                       env={**env, "ORL_GATEWAY__ROLE": role, "ORL_GATEWAY__PORT": str(port),
                                            "ORL_CACHE_DIR": str(tmp_path / name)})
            gateways[name] = Gateway(name, f"http://127.0.0.1:{port}", process, log)

        def stop() -> None:
            for gateway in gateways.values():
                if gateway.process.poll() is None:
                    gateway.process.send_signal(signal.SIGTERM)
            for gateway in gateways.values():
                try:
                    gateway.process.wait(30)
                except subprocess.TimeoutExpired:
                    gateway.process.kill()

        stack.callback(stop)
        made = Stack(settings, gateways["proxy-1"].url, replicas, bus, settings.topics, keys["client"],
                     keys["tester"], keys["admin"], keys["upstream"], steerable_model, tmp_path,
                     keys["alice"])
        deadline = time.monotonic() + 120
        while not (gateways["proxy-1"].ready() == gateways["proxy-2"].ready() == 200
                   and {gateways["controller-a"].ready(), gateways["controller-b"].ready()} == {200, 503}):
            assert time.monotonic() < deadline, "\n".join(g.tail() for g in gateways.values())
            for gateway in gateways.values():
                assert gateway.process.poll() is None, gateway.tail()
            time.sleep(0.5)
        yield made, gateways


def _routes(url: str, stack: Stack, users: list[str]) -> list[tuple[str, str]]:
    answer = httpx.post(url + "/rollout/routes", json={"users": users}, headers=stack.headers(admin=True),
                        timeout=60)
    assert answer.status_code == 200, answer.text
    return [(r["arm"], r["model"]) for r in answer.json()["routes"]]


def _rollout_seen(url: str, stack: Stack) -> str | None:
    answer = httpx.post(url + "/rollout/routes", json={"users": ["anyone"]},
                        headers=stack.headers(admin=True), timeout=60)
    assert answer.status_code == 200, answer.text
    rollout_id: str | None = answer.json()["rollout_id"]
    return rollout_id


def test_proxies_agree_and_a_killed_controller_is_replaced_mid_rollout(
        split: tuple[Stack, dict[str, Gateway]]) -> None:
    stack, gateways = split
    proxy_1, proxy_2 = gateways["proxy-1"], gateways["proxy-2"]
    logs = lambda: "\n".join(g.tail() for g in gateways.values())  # noqa: E731
    users_1 = Users(stack, 30)
    users_2 = Users(replace(stack, url=proxy_2.url), 30, seed=1)
    try:
        good = stack.publish(GOOD)
        running = stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["challenger"] == good, 90)
        assert running["rollout"]["weight"] == 0.5, logs()
        first = running["controller"]["identity"]

        # The proxies read the controller's state from the bus within moments.
        rollout_id, seen = running["rollout"]["rollout_id"], time.monotonic()
        for proxy in (proxy_1, proxy_2):
            while _rollout_seen(proxy.url, stack) != rollout_id:
                assert time.monotonic() - seen < 10, logs()
                time.sleep(0.1)
        # 10,000 users: both proxies give each the same arm, as the controller's state splits them.
        population = [f"person-{i}" for i in range(10_000)]
        on_1, on_2 = _routes(proxy_1.url, stack, population), _routes(proxy_2.url, stack, population)
        assert on_1 == on_2
        share = sum(arm == "challenger" for arm, _ in on_1) / len(on_1)
        assert 0.47 < share < 0.53, share
        # Real answers agree too: the same user through either proxy gets the same arm and version.
        answers_1, answers_2 = users_1.round(), users_2.round()
        by_user = {a.user: (a.arm, a.version) for a in answers_1}
        assert all(by_user[a.user] == (a.arm, a.version) for a in answers_2), (answers_1, answers_2)

        # Traffic until the first step has passed, then the leading controller is killed.
        answers = answers_1 + answers_2
        deadline = time.monotonic() + 300
        while stack.status()["rollout"]["weight"] < 1.0:
            assert time.monotonic() < deadline, (stack.status(), logs())
            answers += users_1.round() + users_2.round()
        leader = next(g for g in (gateways["controller-a"], gateways["controller-b"]) if g.ready() == 200)
        standby = next(g for g in (gateways["controller-a"], gateways["controller-b"]) if g is not leader)
        leader.process.send_signal(signal.SIGKILL)
        leader.process.wait(10)
        # The proxies serve on meanwhile, by the last state; the standby takes the lease and goes on.
        answers += users_1.round()
        deadline = time.monotonic() + 60
        while standby.ready() != 200:
            assert time.monotonic() < deadline, logs()
            time.sleep(0.5)
        # The proxies relay the admin API to the new controller once its heartbeat has reached them
        # (until then: 503 with Retry-After, as a client retries).
        while (relayed := stack.api("GET", "/rollout")).status_code != 200:
            assert relayed.status_code == 503 and time.monotonic() < deadline, (relayed.text, logs())
            time.sleep(0.5)
        assert relayed.json()["controller"]["identity"] != first
        while (status := stack.status())["rollout"]["status"] == "running":
            assert time.monotonic() < deadline + 240, (status, logs())
            answers += users_1.round() + users_2.round()
        status = stack.wait(lambda s: s["rollout"]["mlflow_pending"] is None)
        assert status["rollout"]["status"] == "promoted", (status, logs())
        assert status["controller"]["identity"] != first
        assert [a.status for a in answers] == [200] * len(answers), logs()
        history = stack.api("GET", "/rollout/history").json()["entries"]
        assert [e["action"] for e in history] == ["start", "advance", "promote"], history
        assert {e["actor"] for e in history if e["action"] == "start"} == {"controller"}

        # No controller alive at all: the proxies still serve the promoted version; the admin API
        # says why it cannot answer.
        standby.process.send_signal(signal.SIGKILL)
        standby.process.wait(10)
        after = users_1.round()
        assert {(a.status, a.version) for a in after} == {(200, f"policy-v{good}")}, logs()
        deadline = time.monotonic() + 30
        while (answer := stack.api("GET", "/rollout")).status_code != 503:
            assert time.monotonic() < deadline, answer.text
            time.sleep(0.5)
        assert answer.json()["error"]["code"] == "no_controller"
    finally:
        users_1.close()
        users_2.close()
