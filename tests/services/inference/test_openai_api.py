"""The OpenAI-compatible API through the official `openai` client, on real engines and a real broker."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from online_rl.algos import completion_logprobs
from online_rl.bus.kafka import KafkaBus
from online_rl.ingest import ApiKeyStore, new_key
from online_rl.models import EMBEDDED_MODEL_ID
from tests.services.inference.conftest import Server, ServerFactory


def wait_for_interactions(server: Server, count: int, timeout: float = 30.0) -> list:
    deadline = time.monotonic() + timeout
    while True:
        got = server.interactions()
        if len(got) >= count or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.kafka
def test_embedded_model_answers_and_each_answer_is_logged_with_matching_logprobs(
    make_server: ServerFactory, embedded_model: Path, kafka_bootstrap: str
) -> None:
    server = make_server(embedded_model, EMBEDDED_MODEL_ID, bus=KafkaBus(kafka_bootstrap))
    client = server.openai()
    raw = client.chat.completions.with_raw_response.create(
        model=EMBEDDED_MODEL_ID, messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=24, temperature=0, user="user-7", metadata={"session_id": "s-1"})
    answer = raw.parse()
    assert "Paris" in (answer.choices[0].message.content or "")
    assert answer.model == EMBEDDED_MODEL_ID
    request_id = raw.headers["x-request-id"]
    assert answer.id == request_id and answer.model_extra and answer.model_extra["request_id"] == request_id

    sampled = client.completions.create(model=EMBEDDED_MODEL_ID, prompt="The capital of France is",
                                        max_tokens=8, temperature=0.8, seed=5)
    assert sampled.choices[0].text and sampled.usage and sampled.usage.completion_tokens <= 8

    logged = {i.request_id: i for i in wait_for_interactions(server, 2)}
    assert set(logged) == {request_id, sampled.id}
    chat = logged[request_id]
    assert chat.user_id == "user-7" and chat.session_id == "s-1" and chat.adapter_version is None
    assert chat.model == EMBEDDED_MODEL_ID and chat.sampling.temperature == 0
    assert chat.sampling.max_tokens == 24
    assert "Paris" in chat.completion and chat.prompt[0].content == "What is the capital of France?"
    assert chat.finish_reason == "stop" and chat.latency_ms != 0.0
    model = AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32).eval()
    for interaction in logged.values():
        with torch.no_grad():
            recomputed = completion_logprobs(model, interaction.prompt_token_ids,
                                             interaction.completion_token_ids)
        assert torch.allclose(torch.tensor(interaction.completion_logprobs), recomputed, atol=1e-3)
    assert logged[sampled.id].sampling.seed == 5


def test_streaming_chat_and_completion(make_server: ServerFactory, tiny_model: Path) -> None:
    server = make_server(tiny_model, "tiny-llama")
    client = server.openai()
    whole = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].id != whole.id

    pieces = list(client.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=6,
                                            temperature=0, stream=True))
    plain = client.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=6, temperature=0)
    assert "".join(p.choices[0].text for p in pieces) == plain.choices[0].text
    logged = wait_for_interactions(server, 4)
    assert {i.request_id for i in logged} == {whole.id, chunks[0].id, pieces[0].id, plain.id}


def test_models_lists_base_versions_and_aliases(make_server: ServerFactory, tiny_model: Path,
                                                adapters: list[Path]) -> None:
    server = make_server(tiny_model, "tiny-llama")
    loaded = server.admin("POST", "/admin/adapters", json={"source": str(adapters[0]), "name": "policy-v1",
                                                           "alias": "policy"})
    assert loaded.status_code == 201, loaded.text
    assert loaded.json()["aliases"] == ["policy"]
    ids = {m.id: m for m in server.openai().models.list().data}
    assert set(ids) == {"tiny-llama", "policy-v1", "policy"}
    assert ids["policy"].model_extra and ids["policy"].model_extra["alias_of"] == "policy-v1"
    answer = server.openai().chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=4)
    assert answer.model == "policy-v1"
    assert wait_for_interactions(server, 1)[0].adapter_version == "policy-v1"


def test_bad_requests_get_openai_errors(make_server: ServerFactory, tiny_model: Path) -> None:
    server = make_server(tiny_model, "tiny-llama", max_model_len=64)
    client = server.openai()
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert unknown.value.status_code == 404 and "GET /v1/models" in unknown.value.message
    assert unknown.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as too_many:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                       max_tokens=1000)
    assert too_many.value.body["param"] == "max_tokens" and "lower max_tokens" in too_many.value.message  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as malformed:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "robot", "content": "x"}])  # type: ignore[misc,list-item]
    assert malformed.value.body["param"] == "messages.0.role"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as unsupported:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}], n=2)
    assert unsupported.value.body["param"] == "n"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as bad_session:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                       metadata={"session_id": "has spaces"})
    assert bad_session.value.body["param"] == "metadata"  # type: ignore[index]
    fits = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}])
    assert fits.usage is not None and fits.usage.total_tokens <= 64  # no max_tokens: what the context allows
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    no_auth = httpx.post(server.url + "/admin/adapters", json={"source": "/tmp/x", "name": "v"})
    assert no_auth.status_code == 401 and no_auth.json()["error"]["type"] == "authentication_error"
    wrong_scope = httpx.get(server.url + "/admin/adapters", headers={"Authorization": f"Bearer {server.key}"})
    assert wrong_scope.status_code == 403 and "'admin' scope" in wrong_scope.json()["error"]["message"]
    all_scopes_key, digest = new_key()  # a key without scopes may generate but never administer
    server.app.state.service.keys = ApiKeyStore([digest])
    scopeless = httpx.get(server.url + "/admin/adapters",
                          headers={"Authorization": f"Bearer {all_scopes_key}"})
    assert scopeless.status_code == 403
    assert [i.request_id for i in wait_for_interactions(server, 1)] == [fits.id]  # refused: not logged
    alice_key, digest = new_key()  # a key bound to one user: its answers are that user's, it names no other
    server.app.state.service.keys = ApiKeyStore([f"{digest} inference user=alice"])
    alice = openai.OpenAI(base_url=server.url + "/v1", api_key=alice_key, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as posing:
        alice.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                      max_tokens=2, user="bob")
    assert posing.value.body["code"] == "user_mismatch" and posing.value.body["param"] == "user"  # type: ignore[index]
    own = alice.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                        max_tokens=2)
    logged = wait_for_interactions(server, 2)  # two partitions: read in no particular order
    expected = [(fits.id, "anonymous"), (own.id, "alice")]
    assert sorted((i.request_id, i.user_id) for i in logged) == sorted(expected)


def test_adapter_loads_are_verified_and_failures_change_nothing(
    make_server: ServerFactory, tiny_model: Path, adapters: list[Path], tmp_path: Path
) -> None:
    server = make_server(tiny_model, "tiny-llama")
    assert server.admin("POST", "/admin/adapters", json={"source": str(adapters[0]), "name": "p-v1",
                                                         "alias": "p"}).status_code == 201
    tampered = tmp_path / "tampered"
    tampered.mkdir()
    for item in adapters[1].iterdir():
        tampered.joinpath(item.name).write_bytes(item.read_bytes())
    tampered.joinpath("adapter_model.bin").write_bytes(b"pickle")
    refused = server.admin("POST", "/admin/adapters", json={"source": str(tampered), "name": "p-v2",
                                                            "alias": "p"})
    assert refused.status_code == 422 and "only safetensors" in refused.json()["error"]["message"]
    shadow = server.admin("POST", "/admin/adapters", json={"source": str(adapters[1]), "name": "p"})
    assert shadow.status_code == 409 and "an alias's name" in shadow.json()["error"]["message"]
    reused = server.admin("POST", "/admin/adapters", json={"source": str(adapters[1]), "name": "p-v1"})
    assert reused.status_code == 409 and "immutable" in reused.json()["error"]["message"]
    listing = server.admin("GET", "/admin/adapters").json()
    assert [a["name"] for a in listing["adapters"]] == ["p-v1"] and listing["aliases"] == {"p": "p-v1"}
    in_use = server.admin("DELETE", "/admin/adapters/p-v1")
    assert in_use.status_code == 409 and "alias p still points" in in_use.json()["error"]["message"]
    assert server.admin("DELETE", "/admin/aliases/p").status_code == 204
    assert server.admin("DELETE", "/admin/adapters/p-v1").status_code == 204
    assert [m.id for m in server.openai().models.list().data] == ["tiny-llama"]


def test_big_bodies_get_413_and_a_key_over_its_rate_429_as_openai_errors(
        make_server: ServerFactory, tiny_model: Path) -> None:
    from tests.services.edge import huge_body_is_refused_early_and_small

    server = make_server(tiny_model, "tiny-llama", max_body_bytes=4096, rate_limit_per_s=0.01, rate_burst=4)
    client = server.openai()
    with pytest.raises(openai.APIStatusError) as big:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x" * 5000}])
    assert big.value.status_code == 413 and big.value.body["code"] == "request_too_large"  # type: ignore[index]
    huge_body_is_refused_early_and_small(server.url + "/v1/chat/completions",
                                        {"Authorization": f"Bearer {server.key}"})
    client.models.list()  # the 413s spent no tokens: refused before the key was checked
    client.models.list()
    client.models.list()
    client.models.list()
    with pytest.raises(openai.RateLimitError) as limited:
        client.models.list()
    assert limited.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
    assert int(limited.value.response.headers["Retry-After"]) >= 1
    for _ in range(6):  # an operator's (admin) key, like the gateway's that relays every user: not limited
        admin = server.admin("GET", "/admin/adapters")
        assert admin.status_code == 200, admin.text
