"""The gateway's front door and control API on the real stack: keys and scopes, bad input, the
OpenAI pass-through (streamed too) with failover past a dead replica, the version named in the
answer and in the logged interaction, and the person's controls, audited and kept across a restart."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from online_rl.events import Interaction, decode
from online_rl.registry import alias_version
from online_rl.tracking import mlflow_client
from tests.conftest import TINY_NAME
from tests.services.feedback.conftest import free_port
from tests.services.gateway.conftest import GOOD, Stack, StackFactory
from tests.test_cli import _cli

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
CHAT = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0}


def _post(stack: Stack, body: object, **headers: str) -> httpx.Response:
    return httpx.post(stack.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_keys_scopes_and_bad_input_get_clear_errors(make_stack: StackFactory) -> None:
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    from online_rl.registry import new_signing_key

    pem, trainer = new_signing_key()  # the replicas load only versions this key signed
    stack = make_stack(joiner=False, trusted_signers=(trainer,))
    response = _post(stack, CHAT)
    assert response.status_code == 401
    assert "missing or unknown API key" in response.json()["error"]["message"]
    assert _post(stack, CHAT, **stack.headers(admin=True)).status_code == 403  # admin may not generate
    response = httpx.get(stack.url + "/rollout", headers=stack.headers())
    assert response.status_code == 403 and "lacks the 'admin' scope" in response.json()["error"]["message"]
    assert httpx.post(stack.url + "/rollout/pause").status_code == 401

    response = httpx.post(stack.url + "/v1/chat/completions", content=b"{not json", headers=stack.headers())
    assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]
    response = _post(stack, CHAT, **stack.headers(), **{"X-ORL-Version": "champion"})
    assert response.status_code == 403 and "'tester' scope" in response.json()["error"]["message"]
    response = _post(stack, CHAT, **stack.headers(tester=True), **{"X-ORL-Version": "policy-v9"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "X-ORL-Version"
    response = _post(stack, CHAT | {"user": 7}, **stack.headers())
    assert response.status_code == 400 and response.json()["error"]["param"] == "user"
    # a key bound to a user is served as that user (so the traffic split, not the client, picks its
    # arm) and cannot name another, in the body or the header
    alice = {"Authorization": f"Bearer {stack.alice_key}"}
    for named in ({"user": "bob"}, {"X-ORL-User": "bob"}):
        body, headers = (CHAT | named, alice) if "user" in named else (CHAT, alice | named)
        response = _post(stack, body, **headers)
        error = response.json()["error"]
        assert response.status_code == 403 and error["code"] == "user_mismatch"
        assert error["param"] == "user" and "'alice'" in error["message"]
    assert _post(stack, CHAT, **alice).status_code == 200
    assert _post(stack, CHAT | {"user": "alice"}, **alice).status_code == 200
    deadline, logged = time.monotonic() + 30, list[Interaction]()
    while len(logged) < 2 and time.monotonic() < deadline:
        logged = [decode(r.value or b"", Interaction) for r in stack.bus.read_all(stack.topics.interactions)]
        time.sleep(0.2)
    assert [i.user_id for i in logged] == ["alice", "alice"]
    response = stack.api("PUT", "/rollout/weight", json={"weight": 2})
    assert response.status_code == 400 and "weight" in response.json()["error"]["message"]
    response = stack.api("POST", "/rollout/pause")
    assert response.status_code == 409 and "no rollout" in response.json()["error"]["message"]
    response = stack.api("POST", "/rollout/start")
    assert response.status_code == 409 and "no `challenger` version" in response.json()["error"]["message"]
    response = stack.api("POST", "/rollout/start", json={"version": "999"})
    assert response.status_code == 409 and "no version 999" in response.json()["error"]["message"]
    assert stack.api("GET", "/rollout/history").json() == {"entries": []}  # nothing half-written

    # a version registered by someone who can reach MLflow, its hashes matching but not signed by the
    # trainer: loaded by no replica, rejected before any exposure; the trainer's next one rolls out
    forged = stack.publish(GOOD)
    stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["challenger"] == forged
               and s["rollout"]["status"] == "rolled_back")
    rejected = stack.api("GET", "/rollout/history").json()["entries"][-1]
    assert rejected["action"] == "reject" and rejected["weight"] == 0, rejected
    assert "is not signed" in rejected["reason"], rejected["reason"]
    assert all(f"policy-v{forged}" not in stack.replica_adapters(url) for url in stack.replicas)
    signed = stack.publish(GOOD, signing_key=load_pem_private_key(pem, password=None))
    stack.wait(lambda s: s["rollout"]["challenger"] == signed and s["rollout"]["status"] == "running")
    assert all(f"policy-v{signed}" in stack.replica_adapters(url) for url in stack.replicas)

    # the edge: bodies over the limit get 413 (a 1 GiB one refused at once, in bounded memory), a key
    # over its rate 429 with Retry-After, both as OpenAI errors
    from tests.services.edge import huge_body_is_refused_early_and_small

    # burst 3: the streamed 1 GiB body spends one (its key is checked before the body is read), then two
    limits = {"max_body_bytes": 4096, "rate_limit_per_s": 0.01, "rate_burst": 3}
    gateway = stack.settings.gateway.model_copy(update=limits)
    stack.settings = stack.settings.model_copy(update={"gateway": gateway})
    stack.restart_gateway()
    response = _post(stack, CHAT | {"messages": [{"role": "user", "content": "x" * 5000}]}, **stack.headers())
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    huge_body_is_refused_early_and_small(stack.url + "/v1/chat/completions", stack.headers())
    assert _post(stack, CHAT, **stack.headers()).status_code == 200
    assert _post(stack, CHAT, **stack.headers()).status_code == 200
    limited = _post(stack, CHAT, **stack.headers())
    assert limited.status_code == 429 and limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(limited.headers["Retry-After"]) >= 1
    assert stack.api("GET", "/rollout").status_code == 200  # another key, its own bucket


def test_streams_and_fails_over_past_a_dead_replica(make_stack: StackFactory) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # listed first: every other request tries it first
    # skipped for a minute after it refuses: long enough that a slow machine's requests below cannot
    # outlast the cooldown before /readyz is asked
    stack = make_stack(extra_replicas=(dead,), joiner=False, replica_cooldown_s=60.0)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key, max_retries=0)
    texts = []
    for i in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
            user=f"u{i}")
        assert raw.headers["x-orl-version"] == TINY_NAME and raw.headers["x-orl-arm"] == "champion"
        texts.append(raw.parse().choices[0].message.content)
    chunks = list(client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=4, temperature=0, user="u0", stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == texts[0]
    assert chunks[0].model == TINY_NAME
    metrics = httpx.get(stack.url + "/metrics").text
    failovers = next(float(line.split()[1]) for line in metrics.splitlines()
                     if line.startswith("orl_gateway_failovers_total "))
    assert failovers >= 1  # the dead replica was tried and passed over; no client saw it
    ready = httpx.get(stack.url + "/readyz").json()
    assert (ready["status"], ready["replicas_up"], ready["replicas"]) == ("ready", 2, 3)  # dead one skipped
    logged = [decode(r.value or b"", Interaction) for r in stack.bus.read_all(stack.topics.interactions)]
    assert sorted(i.user_id for i in logged) == ["u0", "u0", "u1", "u2", "u3"]
    assert {i.model for i in logged} == {TINY_NAME} and {i.adapter_version for i in logged} == {None}


def test_replicas_found_by_dns_serve_and_get_the_challenger(make_stack: StackFactory) -> None:
    """What the Helm chart does: the gateway lists a (headless Service) name, not the pods."""
    stack = make_stack(dns=True, joiner=False)
    ready = httpx.get(stack.url + "/readyz").json()
    assert ready["status"] == "ready" and ready["replicas_up"] >= 2  # localhost: 127.0.0.1 (and ::1)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=stack.key, max_retries=0)
    answer = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=3, temperature=0, user="u0")
    assert answer.model == TINY_NAME
    version = stack.publish(GOOD)
    status = stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["challenger"] == version)
    assert status["rollout"]["status"] == "running" and status["rollout"]["weight"] > 0
    for url in stack.replicas:  # the discovered replicas were loaded, each of them
        assert f"policy-v{version}" in stack.replica_adapters(url)


def test_controls_are_audited_and_survive_a_restart(make_stack: StackFactory) -> None:
    stack = make_stack(joiner=False, min_samples=10_000)  # the plan alone would never move
    version = stack.publish(" yes")
    name = f"policy-v{version}"
    stack.wait(lambda s: s["rollout"] is not None and s["rollout"]["status"] == "running")
    forced = _post(stack, CHAT | {"user": "tester"}, **stack.headers(tester=True),
                   **{"X-ORL-Version": "challenger"})
    assert forced.status_code == 200 and forced.headers["x-orl-version"] == name
    assert forced.json()["model"] == name and forced.headers["x-orl-rollout"].startswith("r-")

    assert stack.api("POST", "/rollout/pause").json()["rollout"]["status"] == "paused"
    assert stack.api("PUT", "/rollout/weight", json={"weight": 0.5}).json()["rollout"]["weight"] == 0.5
    stack.restart_gateway()  # the new process finds the rollout where the old one left it
    status = stack.status()
    assert (status["rollout"]["status"], status["rollout"]["weight"]) == ("paused", 0.5)
    users = {f"u{i}": _post(stack, CHAT | {"user": f"u{i}"}, **stack.headers()) for i in range(30)}
    assert {r.status_code for r in users.values()} == {200}
    assert {r.headers["x-orl-version"] for r in users.values()} == {TINY_NAME, name}
    assert stack.api("POST", "/rollout/resume").json()["rollout"]["status"] == "running"
    promoted = stack.api("POST", "/rollout/promote", json={"reason": "looks good to me"}).json()
    assert promoted["rollout"]["status"] == "promoted" and promoted["champion"]["version"] == version
    assert alias_version(mlflow_client(stack.settings), "policy", "champion") == version
    entries = stack.api("GET", "/rollout/history").json()["entries"]
    assert [e["action"] for e in entries] == ["start", "pause", "set_weight", "resume", "promote"]
    assert entries[0]["actor"] == "controller"
    assert {e["actor"] for e in entries[1:]} == {f"key:{stack.admin_key_id}"}
    assert entries[-1]["reason"] == "looks good to me"
    assert stack.api("POST", "/rollout/pause").status_code == 409  # nothing left to pause
    after = _post(stack, CHAT | {"user": "u1"}, **stack.headers())
    assert after.headers["x-orl-version"] == name

    # The same controls from the command line.
    shown = _cli("rollout", "status", "--url", stack.url, "--json", ORL_ADMIN_KEY=stack.admin_key)
    assert shown.returncode == 0 and json.loads(shown.stdout)["rollout"]["status"] == "promoted"
    history = _cli("rollout", "history", "--url", stack.url, "--key", stack.admin_key, COLUMNS="200")
    assert history.returncode == 0 and "looks good to me" in history.stdout
    refused = _cli("rollout", "pause", "--url", stack.url, "--key", stack.admin_key)
    assert refused.returncode == 2 and "cannot pause a rollout that is promoted" in refused.stderr
    anonymous = _cli("rollout", "status", "--url", stack.url, "--key", "orl_wrong")
    assert anonymous.returncode == 2 and "(401)" in anonymous.stderr

