"""The service on the vLLM engine (embedded model): answers, streams, logged log-probabilities that
match the trainer's recomputation with and without an adapter, and a hot swap."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from online_rl.algos import completion_logprobs
from online_rl.bus.embedded import EmbeddedBus
from online_rl.events import Interaction
from online_rl.models import EMBEDDED_MODEL_ID
from services.inference.main import create_app
from tests.factories import lora_adapter
from tests.services.feedback.conftest import serve
from tests.services.inference.conftest import Server, server_settings

pytestmark = [pytest.mark.slow]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def adapter(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lora_adapter(embedded_model, tmp_path_factory.mktemp("vllm") / "lora", EMBEDDED_MODEL_ID,
                        seed=3, scale=0.5)


@pytest.fixture(scope="module")
def server(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("vllm-service")
    settings, key, admin_key = server_settings(root / "cache", embedded_model, EMBEDDED_MODEL_ID,
                                               engine="vllm", max_loras=2, max_lora_rank=8)
    bus = EmbeddedBus(root / "bus.db")
    app = create_app(settings, bus=bus)
    with serve(app, startup_timeout=300) as url:
        yield Server(url, app, bus, settings.topics, key, admin_key)
    bus.close()


def logged(server: Server, request_id: str) -> Interaction:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for interaction in server.interactions():
            if interaction.request_id == request_id:
                return interaction
        time.sleep(0.2)
    raise AssertionError(f"no interaction logged for {request_id}")


def recompute(model: torch.nn.Module, interaction: Interaction) -> torch.Tensor:
    with torch.no_grad():
        return completion_logprobs(model, interaction.prompt_token_ids, interaction.completion_token_ids)


def test_vllm_answers_streams_and_logs_the_base_models_logprobs(server: Server, embedded_model: Path) -> None:
    client = server.openai(timeout=120)
    answer = client.chat.completions.create(model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=24,  # type: ignore[arg-type]
                                            temperature=0)
    assert "Paris" in (answer.choices[0].message.content or "")
    stream = client.chat.completions.create(model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=24,  # type: ignore[arg-type]
                                            temperature=0, stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == answer.choices[0].message.content
    sampled = client.chat.completions.create(model=EMBEDDED_MODEL_ID, messages=QUESTION, max_tokens=16,  # type: ignore[arg-type]
                                             temperature=1.0, seed=7)
    base = AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32).eval()
    for request_id in (answer.id, sampled.id):
        interaction = logged(server, request_id)
        assert interaction.adapter_version is None
        assert torch.allclose(torch.tensor(interaction.completion_logprobs), recompute(base, interaction),
                              atol=2e-3)


def test_vllm_hot_swap_serves_the_adapter_and_its_logprobs_match(
    server: Server, embedded_model: Path, adapter: Path
) -> None:
    loaded = server.admin("POST", "/admin/adapters", json={"source": str(adapter), "name": "policy-v1",
                                                           "alias": "policy"})
    assert loaded.status_code == 201, loaded.text
    client = server.openai(timeout=120)
    answer = client.chat.completions.create(model="policy", messages=QUESTION, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    assert answer.model == "policy-v1"
    interaction = logged(server, answer.id)
    assert interaction.adapter_version == "policy-v1"
    tuned = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32), str(adapter)).eval()
    expected = recompute(tuned, interaction)
    assert torch.allclose(torch.tensor(interaction.completion_logprobs), expected, atol=2e-3)
    base = AutoModelForCausalLM.from_pretrained(str(embedded_model), dtype=torch.float32).eval()
    assert not torch.allclose(recompute(base, interaction), expected, atol=1e-2)  # the adapter mattered
    assert server.admin("DELETE", "/admin/aliases/policy").status_code == 204
    assert server.admin("DELETE", "/admin/adapters/policy-v1").status_code == 204
