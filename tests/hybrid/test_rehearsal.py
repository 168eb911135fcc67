"""Fact rehearsal in the rollout flow (`hybrid.rehearsal_prompts`), end to end on the embedded model, a
real Kafka topic, Ray and MLflow: each iteration adds the rehearsal set's prompts to the users' ones,
reward functions read them as the set writes them, and a verifier adds `rehearsal_weight` to each
answer that holds the fact. (That it keeps facts while a taste is learned is measured by
`bench/learning.py --set trainer.flow=rollout --set hybrid.rehearsal_prompts=N`, docs/learning.md.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from online_rl.bus.kafka import KafkaBus
from online_rl.config import HybridConfig, Settings
from online_rl.events import encode
from online_rl.simulate import PROMPTS
from tests.factories import short_answer_pairs
from tests.hybrid.reward_fns import REHEARSED


@pytest.mark.slow
@pytest.mark.kafka
def test_rehearsal_prompts_join_each_iteration_and_right_answers_earn_the_weight(
        kafka_bootstrap: str, embedded_model: Path, ray_runtime: None, tmp_path: Path) -> None:
    from online_rl.hybrid.runner import run_hybrid

    rehearsal_set = tmp_path / "facts.jsonl"
    rehearsal_set.write_text("\n".join(json.dumps({"prompt": p, "accept": [a]})
                                       for p, a in zip(REHEARSED, ("paris", "tokyo"), strict=True)))
    weight = 3.0
    settings = Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"t{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        model={"path": embedded_model},  # type: ignore[arg-type]
        trainer={"rehearsal_set": rehearsal_set},  # type: ignore[arg-type]
        hybrid={"rollout_batch": 1, "max_new_tokens": 12, "min_pairs": 0,  # type: ignore[arg-type]
                "reward_steps": 0, "publish_every_steps": 2, "temperature": 0.3, "rehearsal_prompts": 2,
                "rehearsal_weight": weight, "critic_free": {"estimator": "grpo", "group_size": 2}},
        rewards={"functions": [{"name": "asked", "target": "tests.hybrid.reward_fns:rehearsal_prompt",  # type: ignore[arg-type]
                                "weight": 1.0}], "weights": {}},
    )
    samples, _ = short_answer_pairs(embedded_model, list(PROMPTS)[:2], settings.model.name)
    topics = settings.topics
    bus = KafkaBus(kafka_bootstrap)
    bus.create_topic(topics.samples, 1)
    bus.create_topic(topics.dlq, 1)
    producer = bus.producer()
    for sample in samples:
        producer.produce(topics.samples, encode(sample), sample.sample_id.encode())
    producer.flush()
    steps: list[dict[str, float]] = []
    state = run_hybrid(settings, bus, max_steps=2, on_step=lambda loop, metrics: steps.append(metrics))
    bus.close()

    assert len(steps) == 2 and len(state.published) == 1
    for metrics in steps:
        # one users' prompt and both rehearsal prompts, 2 answers each
        assert metrics["rehearsal_prompts"] == 2 and metrics["rollouts"] == 6
        # reward functions read the rehearsal prompts as the set writes them (4 of the 6 answers)
        assert metrics["reward_fn_asked"] == pytest.approx(4 / 6)
        # the verifier's weight on each right answer: the step's mean reward holds both parts
        right = metrics["rehearsal_correct"] * 4
        assert right == pytest.approx(round(right))
        assert metrics["reward"] == pytest.approx((4 + weight * right) / 6)
    # the embedded model knows both capitals (sampled at 0.3): some answers were right
    assert sum(m["rehearsal_correct"] for m in steps) > 0


def test_rehearsal_in_the_rollout_flow_needs_rollouts_in_turn_with_the_update() -> None:
    with pytest.raises(ValidationError, match=r"hybrid\.rehearsal_prompts=2 needs rollouts sampled in turn"):
        HybridConfig(engine="vllm", max_staleness=1, rehearsal_prompts=2)


def test_a_missing_rehearsal_set_names_the_field(tmp_path: Path) -> None:
    from online_rl.errors import ConfigError
    from online_rl.trainer.rehearsal import REHEARSAL_SET, load_rehearsal_set

    assert load_rehearsal_set(None) == REHEARSAL_SET
    with pytest.raises(ConfigError, match=r"trainer\.rehearsal_set=.*is not a file"):
        load_rehearsal_set(tmp_path / "none.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "What is 2 + 2?"}\n')
    with pytest.raises(ConfigError, match=r"trainer\.rehearsal_set"):
        load_rehearsal_set(bad)
