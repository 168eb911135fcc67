"""The gateway's test stack, all real: a Kafka broker, an MLflow store, two inference replicas on a
steerable tiny Llama, the joiner, and the gateway (uvicorn threads in this process)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from online_rl.bus import Bus, Topics, ensure_topics
from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings
from online_rl.events import encode
from online_rl.ingest import hash_key, new_key
from online_rl.registry import publish_adapter
from online_rl.stream import JoinConfig, Joiner
from online_rl.tracking import ensure_experiment, mlflow_client
from services.gateway.main import create_app as gateway_app
from services.inference.main import create_app as inference_app
from tests.conftest import TINY_NAME
from tests.factories import steerable_llama, steering_adapter, thumbs
from tests.services.feedback.conftest import serve

GOOD, BAD = " yes", " no"  # what the simulated users like to read, and what they do not


@pytest.fixture(scope="session")
def steerable_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return steerable_llama(tiny_model, tmp_path_factory.mktemp("steerable"))


@dataclass
class Stack:
    settings: Settings
    url: str  # the gateway
    replicas: list[str]
    bus: Bus
    topics: Topics
    key: str  # scope inference
    tester_key: str  # scopes inference, tester (may force a version)
    admin_key: str  # scope admin (the gateway's)
    upstream_key: str  # the replicas' key (inference, admin)
    model_dir: Path
    root: Path
    alice_key: str = ""  # scope inference, bound to the user "alice"
    published: list[str] = field(default_factory=list)
    _gateway: ExitStack = field(default_factory=ExitStack)

    def start_gateway(self) -> str:
        self.url = self._gateway.enter_context(serve(gateway_app(self.settings, bus=self.bus)))
        return self.url

    def restart_gateway(self) -> str:
        """Stop the gateway (its rollout loop too) and start a new one on the same state folder."""
        self._gateway.close()
        return self.start_gateway()

    @property
    def admin_key_id(self) -> str:
        return hash_key(self.admin_key)[:8]

    def headers(self, admin: bool = False, tester: bool = False) -> dict[str, str]:
        key = self.admin_key if admin else self.tester_key if tester else self.key
        return {"Authorization": f"Bearer {key}"}

    def api(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, self.url + path, headers=self.headers(admin=True), timeout=60, **kwargs)

    def status(self) -> dict[str, Any]:
        response = self.api("GET", "/rollout")
        assert response.status_code == 200, response.text
        return dict(response.json())

    def replica_adapters(self, url: str) -> set[str]:
        auth = {"Authorization": f"Bearer {self.upstream_key}"}
        response = httpx.get(url + "/admin/adapters", headers=auth)
        return {a["name"] for a in response.json()["adapters"]}

    def publish(self, word: str, strength: float = 1.0, signing_key: Any = None) -> str:
        """Register an adapter that makes the model say `word`, with the `challenger` alias (its
        manifest signed with `signing_key`, an Ed25519 private key, when given)."""
        from transformers import AutoConfig, AutoTokenizer

        config = AutoConfig.from_pretrained(str(self.model_dir))
        token = AutoTokenizer.from_pretrained(str(self.model_dir)).encode(word, add_special_tokens=False)[0]
        folder = steering_adapter(self.root / f"adapter-{len(self.published)}", TINY_NAME, config.hidden_size,
                                  config.vocab_size, token, strength)
        if signing_key is not None:
            from online_rl.registry import write_lineage

            write_lineage(folder, TINY_NAME, signing_key)
        client = mlflow_client(self.settings)
        experiment = ensure_experiment(client, "gateway-test", self.settings)
        run = client.create_run(experiment)
        version = publish_adapter(client, run.info.run_id, folder, self.settings.mlflow.registered_model,
                                  f"v{len(self.published)}").version
        client.set_terminated(run.info.run_id)
        self.published.append(version)
        return version

    def wait(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if predicate(status):
                return status
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; the rollout is {status}")
            time.sleep(0.2)


def stack_settings(root: Path, model_dir: Path, bootstrap: str, replicas: list[str],
                   trusted_signers: tuple[str, ...] = (), **rollout: Any) -> tuple[Settings, dict[str, str]]:
    keys = {name: new_key() for name in ("client", "tester", "admin", "upstream", "alice")}
    settings = Settings(
        cache_dir=root / "cache",
        kafka={"bootstrap_servers": bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"g{uuid.uuid4().hex[:8]}", "partitions": 2},  # type: ignore[arg-type]
        model={"name": TINY_NAME, "path": model_dir},  # type: ignore[arg-type]
        mlflow={"registered_model": "policy", "trusted_signers": list(trusted_signers)},  # type: ignore[arg-type]
        # The replicas here are threads of the test process, sharing its one GIL with the users, the
        # joiner and the gateway: an answer held for its record's confirmation (log_confirm_s) waits on
        # thread scheduling too. One CI run (the first with the confirmation) rolled a good challenger
        # back on its latency guardrail, 5 of 87 answers slow; the cause was not isolated. These
        # tests are about routing and rollouts; the confirmation is tested with the inference service
        # (tests/services/inference/test_interaction_log.py) and under SIGKILL in bench/chaos.py.
        inference={"engine": "transformers", "max_model_len": 512,  # type: ignore[arg-type]
                   "api_keys": [f"{keys['upstream'][1]} inference,admin"], "log_confirm_s": 0.0},
        gateway={"replicas": replicas, "upstream_api_key": keys["upstream"][0],  # type: ignore[arg-type]
                 "api_keys": [f"{keys['client'][1]} inference", f"{keys['tester'][1]} inference,tester",
                              f"{keys['admin'][1]} admin", f"{keys['alice'][1]} inference user=alice"],
                 "replica_cooldown_s": 1.0,
                 "rollout": {"interval_s": 0.5, "reward_bucket_s": 1.0} | rollout},
    )
    return settings, {name: raw for name, (raw, _) in keys.items()}


StackFactory = Callable[..., Stack]


@pytest.fixture
def make_stack(kafka_bootstrap: str, steerable_model: Path, tmp_path: Path) -> Iterator[StackFactory]:
    """Start the whole stack; `extra_replicas` are URLs listed before the real ones (e.g. a dead one);
    `dns` lists the real ones as `dns+http://localhost:<port>` sources."""
    with ExitStack() as stack:

        def make(extra_replicas: tuple[str, ...] = (), joiner: bool = True, dns: bool = False,
                 replica_cooldown_s: float = 1.0, trusted_signers: tuple[str, ...] = (),
                 window_s: float = 3.0, **rollout: Any) -> Stack:
            root = tmp_path / uuid.uuid4().hex[:6]
            settings, keys = stack_settings(root, steerable_model, kafka_bootstrap, ["http://unused"],
                                            trusted_signers, **rollout)
            bus: Bus = KafkaBus(kafka_bootstrap)
            stack.callback(bus.close)
            topics = settings.topics
            ensure_topics(bus, topics, settings.bus.partitions)
            replicas = [stack.enter_context(serve(inference_app(settings, bus=bus))) for _ in range(2)]
            listed = [u.replace("http://127.0.0.1:", "dns+http://localhost:") if dns else u for u in replicas]
            gateway = settings.gateway.model_copy(update={"replicas": [*extra_replicas, *listed],
                                                          "replica_cooldown_s": replica_cooldown_s})
            settings = settings.model_copy(update={"gateway": gateway})
            if joiner:
                _start_joiner(stack, bus, topics, window_s)
            made = Stack(settings, "", replicas, bus, topics, keys["client"], keys["tester"], keys["admin"],
                         keys["upstream"], steerable_model, root, keys["alice"])
            made.start_gateway()
            stack.callback(made._gateway.close)
            return made

        yield make


def _start_joiner(stack: ExitStack, bus: Bus, topics: Topics, window_s: float) -> None:
    joiner = Joiner(bus, JoinConfig(window_s=window_s, retention_s=max(60.0, 2 * window_s)), topics=topics,
                    transactional_id=f"j-{topics.prefix}", group_id=f"j-{topics.prefix}")
    stop = threading.Event()
    thread = threading.Thread(target=joiner.run, args=(stop.is_set,), daemon=True)
    thread.start()

    def close() -> None:
        stop.set()
        thread.join(timeout=30)
        joiner.close()

    stack.callback(close)


@dataclass
class Answer:
    user: str
    status: int
    version: str | None
    arm: str | None
    text: str
    request_id: str | None


class Users:
    """Simulated users: each sends a chat through the gateway and gives a thumb on the answer —
    up when it contains `GOOD`, with `noise` of the thumbs flipped (seeded)."""

    def __init__(self, stack: Stack, count: int, noise: float = 0.1, seed: int = 0,
                 temperature: float = 0.0) -> None:
        import random

        self.stack = stack
        self.ids = [f"user-{i}" for i in range(count)]
        self.noise = noise
        self.temperature = temperature
        self.rng = random.Random(seed)
        self.client = httpx.Client(timeout=60, headers=stack.headers())
        self.producer = stack.bus.producer()
        self.answers: list[Answer] = []
        self.judged: list[tuple[Answer, bool]] = []  # every thumb given: (the answer, up)

    def ask(self, user: str, stream: bool = False) -> Answer:
        body = {"model": "anything", "messages": [{"role": "user", "content": f"hello from {user}"}],
                "max_tokens": 3, "temperature": self.temperature, "user": user, "stream": stream}
        response = self.client.post(self.stack.url + "/v1/chat/completions", json=body)
        text, request_id = "", None
        if response.status_code == 200 and not stream:
            data = response.json()
            text, request_id = data["choices"][0]["message"]["content"], data["request_id"]
        return Answer(user, response.status_code, response.headers.get("x-orl-version"),
                      response.headers.get("x-orl-arm"), text, request_id)

    def round(self) -> list[Answer]:
        """Every user asks once (a few at a time); every answer gets its thumb."""
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(self.ask, self.ids))
        now = time.time()
        for answer in answers:
            if answer.request_id is None:
                continue
            up = GOOD in answer.text
            if self.rng.random() < self.noise:
                up = not up
            self.judged.append((answer, up))
            event = thumbs(answer.request_id, up, created_at=now, event_id=uuid.uuid4().hex,
                           user_id=answer.user)
            self.producer.produce(self.stack.topics.feedback, encode(event), answer.request_id.encode())
        self.producer.flush()
        self.answers.extend(answers)
        return answers

    def close(self) -> None:
        self.client.close()
        self.producer.close()
