"""The rollout flow without a critic, scored by reward functions written as code, end to end on the
embedded model, a real Kafka topic, Ray and MLflow: GRPO samples a group of answers per prompt, the
reward functions score them in their own process, a function that raises or hangs is dead-lettered
while training continues, and the result is a registered version with its complete lineage.
(That GRPO with a reward function *learns* is measured by bench/grpo.py against an lr = 0 control.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings
from online_rl.events import encode
from online_rl.simulate import PROMPTS
from tests.factories import chat_ids, short_answer_pairs
from tests.registry.test_runs import assert_complete_lineage

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

STEPS = 2
FUNCTIONS = [
    {"name": "brief", "target": "tests.hybrid.reward_fns:brief", "weight": 1.0},
    {"name": "buggy", "target": "tests.hybrid.reward_fns:raises_on_some_rows", "weight": 0.5},
    {"name": "stuck", "target": "tests.hybrid.reward_fns:hangs_once", "weight": 0.5, "timeout_s": 3.0},
]


def test_grpo_with_reward_functions_trains_through_failing_user_code(
        kafka_bootstrap: str, embedded_model: Path, ray_runtime: None, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from online_rl.hybrid.runner import run_hybrid
    from online_rl.tracking import mlflow_client

    settings = Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"t{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        model={"path": embedded_model},  # type: ignore[arg-type]
        hybrid={"rollout_batch": 2, "max_new_tokens": 16, "min_pairs": 0,  # type: ignore[arg-type]
                "learning_rate": 5e-4, "reward_steps": 0, "publish_every_steps": STEPS,
                "critic_free": {"estimator": "grpo", "group_size": 4, "beta": 0.04}},
        rewards={"functions": FUNCTIONS, "weights": {}},  # type: ignore[arg-type]
    )
    samples, _ = short_answer_pairs(embedded_model, list(PROMPTS)[:4], settings.model.name)
    topics = settings.topics
    bus = KafkaBus(kafka_bootstrap)
    bus.create_topic(topics.samples, 1)
    bus.create_topic(topics.dlq, 1)
    producer = bus.producer()
    for sample in samples:
        producer.produce(topics.samples, encode(sample), sample.sample_id.encode())
    producer.flush()
    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    held = [chat_ids(tokenizer, q) for q in list(PROMPTS)[12:14]]
    seen: dict[str, Any] = {"steps": []}

    def on_step(loop: Any, metrics: dict[str, float]) -> None:
        seen["steps"].append(metrics)
        assert loop.critic is None  # critic-free: no value model was started ...
        assert loop.reward is None  # ... and no reward model: the rule weighs functions alone
        if metrics["step"] == STEPS:
            seen["eval"] = loop.evaluate(held, samples=1)

    state = run_hybrid(settings, bus, max_steps=STEPS, on_step=on_step)

    assert state.steps == STEPS and len(state.published) == 1
    first, second = seen["steps"]
    # a group of 4 answers for each of the 2 prompts; `buggy` raised on rows 0, 3 and 6 and `stuck` hung
    # on row 7 of the first step: a rollout that lacks a function's score is left out of its step
    # (answers compared within a group must be on one scale), the others train
    assert first["reward_fn_failures"] == 3 + 1 and first["rollouts"] == 4
    assert first["reward_fn_restarts"] == 1  # the hung actor was replaced ...
    assert second["reward_fn_failures"] == 3 and second["reward_fn_restarts"] == 1  # ... the fresh one served
    assert second["rollouts"] == 5
    for metrics in seen["steps"]:  # groups whose answers all scored the same were left out
        assert metrics["trained_rollouts"] == pytest.approx(
            metrics["rollouts"] * (1 - metrics["zero_variance_fraction"]))
        assert metrics["trained_rollouts"] == 0 or "ppo_loss" in metrics
        # GRPO's in-loss KL (beta 0.04): the k3 KL to the base, >= 0, in every step that trained
        assert metrics["trained_rollouts"] == 0 or metrics["kl_in_loss"] >= 0
    assert set(seen["eval"]) >= {"fn_brief", "base_fn_brief"}

    bodies = [json.loads(record.value or b"") for record in bus.read_all(topics.dlq)]
    assert sorted(b["function"] for b in bodies) == ["buggy"] * 6 + ["stuck"]
    assert all("KeyError" in b["reason"] for b in bodies if b["function"] == "buggy")
    assert all("timed out after 3 s" in b["reason"] for b in bodies if b["function"] == "stuck")
    assert all(b["completion"] is not None and b["prompt"] for b in bodies)
    bus.close()

    client = mlflow_client(settings)
    version = client.get_model_version_by_alias(settings.mlflow.registered_model, "challenger")
    assert version.run_id is not None
    folder = Path(client.download_artifacts(version.run_id, "hybrid", str(tmp_path / "dl")))
    from online_rl.registry import read_lineage

    lineage = read_lineage(next(folder.iterdir()))
    assert_complete_lineage(lineage, version.tags)
    params = client.get_run(version.run_id).data.params
    assert json.loads(params["critic_free"])["estimator"] == "grpo"


@pytest.mark.parametrize(("critic_free", "field"), [
    ({"estimator": "grpo", "group_size": 1}, "hybrid.critic_free.group_size"),
    ({"estimator": "grpo", "beta": -0.1}, "hybrid.critic_free"),
    ({"estimator": "grpo", "ratio_level": "sequence"}, "hybrid.critic_free.ratio_level"),
    ({"estimatr": "grpo"}, "hybrid.critic_free"),
])
def test_bad_critic_free_settings_name_the_field(critic_free: dict[str, Any], field: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
        Settings(hybrid={"critic_free": critic_free})  # type: ignore[arg-type]
