"""Colocated PPO end to end on the embedded model: preference pairs on a real Kafka topic teach the
reward model, PPO on fresh rollouts raises its score on held-out prompts (and the answers get shorter,
the users' true preference) while the KL to the reference stays under its target, and the result is a
registered MLflow version."""

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

STEPS, KL_TARGET = 8, 6.0


def test_ppo_on_fresh_rollouts_raises_the_learned_reward_within_the_kl_target(
        kafka_bootstrap: str, embedded_model: Path, ray_runtime: None, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from online_rl.hybrid.runner import run_hybrid
    from online_rl.registry import read_lineage
    from online_rl.tracking import mlflow_client

    settings = Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"t{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        model={"path": embedded_model},  # type: ignore[arg-type]
        hybrid={"rollout_batch": 8, "max_new_tokens": 24, "min_pairs": 4,  # type: ignore[arg-type]
                "learning_rate": 5e-4, "reward_steps": 2, "kl_coef": 0.1, "kl_target": KL_TARGET,
                "kl_horizon": 8, "publish_every_steps": STEPS},
    )
    questions = list(PROMPTS)
    train, held = questions[:12], questions[12:]
    samples, _ = short_answer_pairs(embedded_model, train, settings.model.name)
    assert len(samples) >= 6
    topics = settings.topics
    bus = KafkaBus(kafka_bootstrap)
    bus.create_topic(topics.samples, 2)
    bus.create_topic(topics.dlq, 1)
    producer = bus.producer()
    for sample in samples:
        producer.produce(topics.samples, encode(sample), sample.sample_id.encode())
    producer.flush()

    tokenizer = AutoTokenizer.from_pretrained(embedded_model)
    held_ids = [chat_ids(tokenizer, q) for q in held]
    seen: dict[str, Any] = {"steps": []}

    def on_ready(loop: Any) -> None:
        for _ in range(3):  # the reward model first catches up on the pairs already there
            loop.learn_rewards()

    def on_step(loop: Any, metrics: dict[str, float]) -> None:
        seen["steps"].append(metrics)
        print("hybrid step", {k: round(v, 3) for k, v in metrics.items()}, flush=True)
        if metrics["step"] == STEPS:
            seen["after"] = loop.evaluate(held_ids, samples=2)

    state = run_hybrid(settings, bus, max_steps=STEPS, on_ready=on_ready, on_step=on_step)
    bus.close()

    after = seen["after"]
    print("hybrid eval", after, flush=True)
    assert state.steps == STEPS and state.pairs == len(samples)
    # the same reward model, the same sampling seeds: the trained policy's answers score higher
    assert after["reward"] > after["base_reward"] + 0.3, after
    # ... and by the users' own measure, not only the reward model's (which PPO optimised, and could
    # game): the answers got shorter (measured 18.6 tokens against the base's 22.1 of at most 24)
    assert after["completion_tokens"] < after["base_completion_tokens"] - 1.0, after
    assert after["kl"] < KL_TARGET, after
    # rollouts are on-policy: the generation engine's log-probs are the training forward's
    assert max(m["behaviour_gap"] for m in seen["steps"]) < 1e-3

    client = mlflow_client(settings)
    version = client.get_model_version_by_alias(settings.mlflow.registered_model, "challenger")
    assert str(version.version) == state.published[-1].version
    folder = Path(client.download_artifacts(version.run_id, "hybrid", str(tmp_path / "dl")))
    lineage = read_lineage(next(folder.iterdir()))
    assert sum(end - first for first, end in lineage.offsets[topics.samples].values()) == len(samples)
    # the complete lineage, in lineage.json and as the version's tags, like the trainer's versions
    assert_complete_lineage(lineage, version.tags)
    assert lineage.behaviour_versions == ["base"] and lineage.reward_mapping_version == "test"
    assert lineage.parent_version is None and lineage.kl_anchor == "base"
    run = client.get_run(version.run_id)
    assert lineage.config_hash == run.data.tags["config_hash"] and run.data.tags["component"] == "hybrid"
    # the resolved config: the hybrid's section, the adapter's shape (from trainer.*) and the model
    lora = settings.trainer
    assert run.data.params["lora_rank"] == str(lora.lora_rank) and run.data.params["lora_alpha"] == str(
        lora.lora_alpha)
    assert run.data.params["lora_targets"] == json.dumps(lora.lora_targets)
    assert run.data.params["rollout_batch"] == "8" and run.data.params["base_model"] == settings.model.name
    assert run.data.params["precision_resolved"] == "fp32"
    rewards = client.get_metric_history(version.run_id, "hybrid_reward")
    assert len(rewards) == STEPS
