"""The ability gate on a real Kafka broker, MLflow store and Ray runtime: a version that forgot what the
base answered is not published, the adapter goes back and the learning rate comes down; trained again
at a rate low enough to keep the answers (the gate's retry), the same batches are published; and a
version that passes at once brings a lowered rate back up (`ability_recovery`)."""

from __future__ import annotations

import json
import logging
import random
import uuid
from pathlib import Path

import pytest

from online_rl.bus.kafka import KafkaBus
from online_rl.config import Settings
from online_rl.trainer import CheckpointStore, Trainer
from tests.trainer.test_trainer import _kafka_topics, _pair, send

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PROMPTS = ("Tell me about rivers.", "What is a good name for a cat?", "Describe the sea.",
           "Say something about winter.", "How do clocks work?", "Name a colour.")
TOKENS = 6


@pytest.fixture
def base(kafka_bootstrap: str, embedded_model: Path, tmp_path: Path) -> Settings:
    """The embedded model (the tiny random one answers every prompt with blank lines: nothing to lose)."""
    return Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        model={"path": embedded_model},  # type: ignore[arg-type]
        trainer={"batch_size": 8, "batch_timeout_s": 1.0, "precision": "fp32",  # type: ignore[arg-type]
                 "publish_every_samples": 16, "publish_every_s": 3600},
    )


def _probe_file(settings: Settings, path: Path) -> Path:
    """A probe whose accepted 'word' for each prompt is the base's own greedy answer, computed by the
    worker code the trainer runs (so the base passes every prompt and any change of answer is a loss)."""
    from transformers import AutoTokenizer

    from online_rl.trainer.spec import trainer_specs
    from online_rl.trainer.worker import PolicyWorker

    tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
    ids = [list(tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                                        add_generation_prompt=True),
                          add_special_tokens=False).input_ids) for p in PROMPTS]
    worker = PolicyWorker(trainer_specs(settings)[0].resolved("fp32"))
    eos = tokenizer.eos_token_id
    answers = [str(tokenizer.decode(a, skip_special_tokens=True)).strip().lower()
               for a in worker.answer_greedy(ids, TOKENS, eos, eos, base=True)]
    rows = [{"prompt": p, "accept": [a]} for p, a in zip(PROMPTS, answers, strict=True) if a]
    assert len(rows) >= 4, answers
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _gated(base: Settings, tmp_path: Path, name: str, retries: int, backoff: float,
           shrink: tuple[float, ...] = ()) -> Settings:
    return base.model_copy(update={
        "bus": base.bus.model_copy(update={"topic_prefix": f"g{uuid.uuid4().hex[:8]}"}),
        "mlflow": base.mlflow.model_copy(update={"registered_model": name}),
        "trainer": base.trainer.model_copy(update={
            "learning_rate": 5e-2, "ability_probe": tmp_path / "probe.jsonl", "ability_retries": retries,
            "ability_backoff": backoff, "ability_shrink": list(shrink),
            "ability_tolerance": 0, "ability_max_tokens": TOKENS, "checkpoint_dir": tmp_path / name})})


def test_a_version_that_forgot_is_refused_and_the_trainer_steps_back(
    base: Settings, ray_runtime: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from online_rl.tracking import mlflow_client

    _probe_file(base, tmp_path / "probe.jsonl")
    client = mlflow_client(base)
    outcomes = {}
    # the same 16 pairs at a learning rate that wrecks the answers, one publish due: refused at once
    # (no retry), or trained again at 1e-4 of the rate (a retry) and published, or shrunk to a share
    # of its change small enough to keep the answers (ability_shrink) and published
    for name, retries, backoff, shrink in (("forgets", 0, 0.5, ()), ("retried", 1, 1e-4, ()),
                                           ("shrunk", 0, 0.5, (0.5, 1e-3))):
        run_settings = _gated(base, tmp_path, name, retries, backoff, shrink)
        bus, topics = _kafka_topics(run_settings, partitions=1)
        send(bus.producer(), topics.samples, [_pair(i, random.Random(i), base.model.name) for i in range(16)])
        trainer = Trainer(run_settings, bus)
        state = trainer.run(idle_exit_s=3.0)
        assert state.samples == 16
        outcomes[name] = (trainer, state, CheckpointStore(run_settings.checkpoint_dir).load_latest())
        bus.close()

    trainer, state, checkpoint = outcomes["forgets"]
    assert trainer.published == [] and len(trainer.refused) == 1
    verdict = trainer.refused[0]
    assert not verdict.passed and verdict.lost and verdict.base_correct >= 4
    assert not client.search_model_versions("name='forgets'")  # nothing reached the registry
    assert trainer.metrics.registry.get_sample_value("orl_trainer_ability_refusals_total") == 1.0
    # stepped back: the adapter answers as the base again (LoRA's B zero), the rate halved, and
    # both survive in the checkpoint a restart resumes from
    assert checkpoint is not None and checkpoint.metadata["lr_scale"] == 0.5
    assert checkpoint.metadata["refusals"] == 1 and state.samples_since_publish == 0
    lora_b = [t for n, t in checkpoint.adapter.items() if "lora_B" in n]
    assert lora_b and all(not t.any() for t in lora_b)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="online_rl.trainer.controller"):
        restarted = Trainer(trainer.settings).run(idle_exit_s=2.0)  # a restart, nothing new to read
    assert restarted.lr_scale == 0.5 and restarted.refusals == 1
    # the base's answers to the probe were kept in the checkpoint: the restart did not ask them again
    said = [r for r in caplog.records if getattr(r, "event", None) == "ability_probe_base"]
    assert [(r.correct, r.from_checkpoint) for r in said] == [(verdict.base_correct, True)]  # type: ignore[attr-defined]
    assert restarted.probe_base == checkpoint.metadata["probe_base"]

    # trained on at a rate that keeps the answers, with trainer.ability_recovery: the next version
    # passes at the first try and the halved rate comes back (x2, up to the configured one)
    gentle = trainer.settings.model_copy(update={"trainer": trainer.settings.trainer.model_copy(
        update={"learning_rate": 1e-7, "ability_recovery": 2.0})})
    bus = KafkaBus(gentle.kafka.bootstrap_servers or "")
    send(bus.producer(), gentle.topics.samples,
         [_pair(i, random.Random(i), base.model.name) for i in range(16, 32)])
    recovered = Trainer(gentle, bus)
    recovered_state = recovered.run(idle_exit_s=3.0)
    bus.close()
    assert [v.version for v in recovered.published] == ["1"] and recovered.refused == []
    assert recovered_state.lr_scale == 1.0 and recovered_state.refusals == 1

    retried, retried_state, _ = outcomes["retried"]
    assert [v.version for v in retried.published] == ["1"] and retried.refused == []
    assert retried_state.lr_scale == 1e-4 and retried_state.refusals == 0
    history = client.get_metric_history(retried.mlflow_run.run_id, "ability_retries")
    assert [m.value for m in history] == [0.0, 1.0]  # the probe failed once, then passed on the retry

    # shrunk: the whole change lost answers, a small enough share of it kept them; that share was
    # published and is what the trainer goes on from (not the base: LoRA's B is not zero), at the
    # configured rate
    shrunk, shrunk_state, shrunk_checkpoint = outcomes["shrunk"]
    assert [v.version for v in shrunk.published] == ["1"] and shrunk.refused == []
    assert shrunk_state.shrinks == 1 and shrunk_state.refusals == 0 and shrunk_state.lr_scale == 1.0
    tried = [m.value for m in client.get_metric_history(shrunk.mlflow_run.run_id, "ability_shrink_kept")]
    passed = [m.value for m in client.get_metric_history(shrunk.mlflow_run.run_id, "ability_probe_passed")]
    assert tried in ([0.5], [0.5, 1e-3]) and passed == [0.0] * len(tried) + [1.0], (tried, passed)
    assert shrunk_checkpoint is not None and shrunk_checkpoint.metadata["shrinks"] == 1
    assert any(t.any() for n, t in shrunk_checkpoint.adapter.items() if "lora_B" in n)
