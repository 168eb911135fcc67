"""The trainer end to end on a real Kafka broker, a real MLflow store and a real Ray runtime.

A stream of preference pairs for a learnable preference (end the answer with PREFERRED rather than
AVOIDED) is trained in two lifetimes of the trainer (a restart in between); each lifetime publishes a
version. Checked: every sample trained exactly once across the restart, the later version prefers
the preferred ending on held-out prompts more than the earlier one (and the earlier more than the
base), each version's lineage is complete and its offset ranges tile the stream, the unusable sample
went to the dead-letter topic, and the MLflow run holds the config and per-step metrics. The gain is
checked against a control: the same pairs with chosen and rejected swapped at random.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from online_rl.bus import Bus, TopicPartition
from online_rl.bus.kafka import KafkaBus
from online_rl.bus.topics import Topics
from online_rl.config import Settings
from online_rl.events import Completion, Message, TrainingSample, encode
from online_rl.registry import read_lineage
from online_rl.trainer import Trainer
from tests.conftest import TINY_NAME
from tests.factories import drain
from tests.registry.test_runs import assert_complete_lineage

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

PREFERRED, AVOIDED = 1000, 2000


def _ids(rng: random.Random, low: int, high: int) -> list[int]:
    return [rng.randrange(100, 5000) for _ in range(rng.randint(low, high))]


def _completion(request_id: str, ids: list[int]) -> Completion:
    return Completion(request_id=request_id, text="-", token_ids=ids, logprobs=[-1.0] * len(ids))


def _pair(i: int, rng: random.Random, model: str = TINY_NAME) -> TrainingSample:
    prompt, stem = _ids(rng, 2, 6), _ids(rng, 1, 3)
    return TrainingSample(
        sample_id=f"s{i}", kind="pair", model=model, user_id=f"u{i % 5}",
        prompt=[Message(role="user", content=f"q{i}")], prompt_token_ids=prompt,
        chosen=_completion(f"c{i}", [*stem, PREFERRED]), rejected=_completion(f"r{i}", [*stem, AVOIDED]),
        feedback_kind="preference", reward_mapping_version="default-test",
        behaviour_versions=[None, "policy-v0"], created_at=float(i),
    )


def _margin(model_dir: Path, adapter: Path | None, held_out: list[tuple[list[int], list[int]]]) -> float:
    """Mean log-probability gap between ending with PREFERRED and with AVOIDED on held-out stems."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from online_rl.algos import Sample, forward, pack

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    batch = pack([Sample(prompt, [[*stem, PREFERRED], [*stem, AVOIDED]]) for prompt, stem in held_out])
    with torch.no_grad():
        sums = forward(model, batch).sequence_logprobs
    return (sums[0::2] - sums[1::2]).mean().item()


def send(producer: Any, topic: str, samples: list[TrainingSample]) -> None:
    """Produce `samples` to `topic` (keyed by sample id) and wait until the broker has them all."""
    for sample in samples:
        producer.produce(topic, encode(sample), sample.sample_id.encode())
    producer.flush()


def _kafka_topics(settings: Settings, partitions: int) -> tuple[Bus, Topics]:
    """A Kafka bus with this test's samples topic (`partitions`) and dead-letter topic."""
    topics = settings.topics
    bus: Bus = KafkaBus(settings.kafka.bootstrap_servers or "")
    bus.create_topic(topics.samples, partitions)
    bus.create_topic(topics.dlq, 1)
    return bus, topics


@pytest.fixture
def settings(kafka_bootstrap: str, tiny_model: Path, tmp_path: Path) -> Settings:
    return Settings(
        cache_dir=tmp_path / "cache",
        kafka={"bootstrap_servers": kafka_bootstrap},  # type: ignore[arg-type]
        bus={"topic_prefix": f"t{uuid.uuid4().hex[:8]}"},  # type: ignore[arg-type]
        model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
        mlflow={"registered_model": "policy"},  # type: ignore[arg-type]
        trainer={"batch_size": 8, "batch_timeout_s": 1.0, "learning_rate": 5e-3,  # type: ignore[arg-type]
                 "publish_every_samples": 16, "publish_every_s": 3600},
    )


def test_the_trainer_learns_from_the_stream_and_registers_better_versions(
    settings: Settings, ray_runtime: None, tiny_model: Path, tmp_path: Path
) -> None:
    from online_rl.registry import new_signing_key, verify_adapter_dir
    from online_rl.tracking import mlflow_client

    pem, public = new_signing_key()  # the trainer signs what it publishes (serving may trust only that)
    (tmp_path / "signing.pem").write_bytes(pem)
    settings = settings.model_copy(update={"mlflow": settings.mlflow.model_copy(
        update={"signing_key_file": tmp_path / "signing.pem"})})
    bus, topics = _kafka_topics(settings, partitions=2)
    rng = random.Random(0)
    producer = bus.producer()
    samples = [_pair(i, rng) for i in range(32)]
    bad = _pair(99, rng, model="another-model")
    held_out = [(_ids(rng, 2, 6), _ids(rng, 1, 3)) for _ in range(16)]

    # first lifetime: 16 samples -> version 1; it stops once the stream is quiet
    send(producer, topics.samples, samples[:16])
    first = Trainer(settings, bus)
    state = first.run(idle_exit_s=3.0)
    assert state.samples == 16 and [v.version for v in first.published] == ["1"]
    # more traffic (one sample unusable); the second lifetime resumes from the checkpoint -> version 2
    send(producer, topics.samples, [samples[16], bad, *samples[17:]])
    second = Trainer(settings, bus)
    state = second.run(idle_exit_s=4.0)
    assert [v.version for v in second.published] == ["2"]
    assert state.samples == 32 and state.dead_lettered == 1  # every good sample exactly once
    ends = bus.end_offsets(topics.samples)
    assert state.offsets == ends and sum(ends.values()) == 33

    client = mlflow_client(settings)  # points MLflow's registry at this store too
    assert str(client.get_model_version_by_alias("policy", "challenger").version) == "2"
    import mlflow

    folders = [Path(mlflow.artifacts.download_artifacts(f"models:/policy/{v}", dst_path=str(tmp_path / v)))
               for v in ("1", "2")]
    manifests = [verify_adapter_dir(folder, TINY_NAME, [public]) for folder in folders]
    for manifest in manifests:
        assert manifest.base_model == TINY_NAME and manifest.base_model_sha256
        assert manifest.reward_mapping_version == "default-test"
        assert manifest.behaviour_versions == ["base", "policy-v0"]
        assert manifest.config_hash == first.config_hash and "train_dpo_accuracy" in manifest.eval
    assert manifests[1].parent_version == "policy-v1" and manifests[0].parent_version is None
    # the two versions' offset ranges tile the stream, partition by partition
    for tp, end in ends.items():
        position = 0
        for manifest in manifests:  # a version whose window read nothing there has no range
            window = manifest.offsets.get(topics.samples, {}).get(str(tp.partition))
            if window is not None:
                assert window[0] == position < window[1]
                position = window[1]
        assert position == end
    version = client.get_model_version("policy", "2")
    assert version.tags["adapter_sha256"] == manifests[1].adapter_sha256
    for number, manifest in zip(("1", "2"), manifests, strict=True):  # lineage.json and version tags
        assert_complete_lineage(manifest, client.get_model_version("policy", number).tags, public)
        assert manifest.kl_anchor == "base"
    assert first.config_hash == second.config_hash  # the same resolved config in both lifetimes

    base = _margin(tiny_model, None, held_out)
    v1, v2 = (_margin(tiny_model, folder, held_out) for folder in folders)
    assert base < v1 < v2, (base, v1, v2)
    # the control: the same pairs, steps and seeds with chosen and rejected swapped at random (no signal)
    labels = random.Random(7)
    shuffled = [s.model_copy(update={"chosen": s.rejected, "rejected": s.chosen}) if labels.random() < 0.5
                else s for s in samples]
    control_settings = settings.model_copy(update={
        "bus": settings.bus.model_copy(update={"topic_prefix": settings.bus.topic_prefix + "c"}),
        "mlflow": settings.mlflow.model_copy(update={"registered_model": "policy-control"}),
        "trainer": settings.trainer.model_copy(update={"checkpoint_dir": tmp_path / "control-checkpoints"})})
    control_bus, control_topics = _kafka_topics(control_settings, partitions=2)
    send(control_bus.producer(), control_topics.samples, shuffled)
    control_trainer = Trainer(control_settings, control_bus)
    control_trainer.run(idle_exit_s=3.0)
    control_bus.close()
    control_version = control_trainer.published[-1].version
    control_folder = Path(mlflow.artifacts.download_artifacts(f"models:/policy-control/{control_version}",
                                                              dst_path=str(tmp_path / "control")))
    control = _margin(tiny_model, control_folder, held_out)
    # measured: the learned version +0.43 over the base, the control -0.21 (a random walk either way)
    assert v2 - base > control - base + 0.2, (base, v2, control)

    dead = bus.consumer(f"check-{uuid.uuid4().hex[:6]}")
    dead.subscribe([topics.dlq])
    letters = drain(dead, 1)
    dead.close()
    assert len(letters) == 1 and b"another-model" in (letters[0].header("reason") or b"")

    run = client.get_run(version.run_id)
    assert run.data.params["batch_size"] == "8" and run.data.params["algorithm"] == "auto"
    # the fully resolved config: the adapter's shape, the base model, the precision the workers resolved
    assert run.data.params["lora_rank"] == "8" and run.data.params["lora_alpha"] == "16"
    assert run.data.params["lora_targets"] == '["q_proj", "k_proj", "v_proj", "o_proj"]'
    assert run.data.params["base_model"] == TINY_NAME and run.data.params["precision_resolved"] == "fp32"
    assert run.data.params["precision_reason"] and run.data.params["machine"]
    assert run.data.tags["config_hash"] == first.config_hash and run.data.tags["component"] == "trainer"
    # one run per lifetime, one loss per step, steps numbered on across the restart
    first_run = client.get_model_version("policy", "1").run_id
    first_steps = [m.step for m in client.get_metric_history(first_run, "loss")]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "loss")]
    assert first_steps == list(range(1, len(first_steps) + 1)) and len(first_steps) >= 2
    assert steps == list(range(len(first_steps) + 1, len(first_steps) + 1 + len(steps))) and len(steps) >= 2
    bus.close()


def test_a_restart_before_the_commit_trains_nothing_twice(settings: Settings, ray_runtime: None,
                                                          tmp_path: Path) -> None:
    """The checkpoint, not the group's committed offsets, says where to resume."""
    from online_rl.trainer import CheckpointStore

    bus, topics = _kafka_topics(settings, partitions=1)
    rng = random.Random(1)
    producer = bus.producer()
    send(producer, topics.samples, [_pair(i, rng) for i in range(16)])
    Trainer(settings, bus).run(max_steps=1)
    tp = TopicPartition(topics.samples, 0)
    # As if it crashed after the checkpoint but before the commit: a group with nothing committed
    # (it would start at offset 0) resumes from the checkpoint's offsets instead.
    uncommitted = settings.model_copy(update={"trainer": settings.trainer.model_copy(
        update={"group_id": "never-committed"})})
    state = Trainer(uncommitted, bus).run(idle_exit_s=3.0)
    assert state.samples == 16 and state.offsets == {tp: 16}
    assert CheckpointStore(settings.checkpoint_dir).load_latest().samples == 16  # type: ignore[union-attr]
    bus.close()
    # the topic recreated empty under the same name: the checkpoint is ahead of it, and the trainer
    # says so instead of letting the consumer jump somewhere
    from online_rl.bus.embedded import EmbeddedBus
    from online_rl.trainer import CheckpointAhead

    recreated = EmbeddedBus(tmp_path / "recreated.db")
    recreated.create_topic(topics.samples, 1)
    with pytest.raises(CheckpointAhead, match=r"partition 0 at 16 \(topic ends at 0\)"):
        Trainer(settings, recreated).run(max_steps=1)
    recreated.close()


@pytest.mark.parametrize("loss", ["label", "kl"])
def test_cold_start_samples_are_mixed_into_the_batches_and_recorded(
    settings: Settings, ray_runtime: None, tmp_path: Path, loss: str
) -> None:
    from online_rl.registry import file_sha256
    from online_rl.tracking import mlflow_client
    from tests.trainer.test_samples import _thumb

    cold = tmp_path / "cold.jsonl"
    cold.write_text("".join(_thumb(100 + i, i % 2 == 0).model_dump_json() + "\n" for i in range(4)))
    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "cold_start": cold, "cold_start_weight": 0.25, "batch_size": 4, "cold_start_loss": loss,
        # with "kl" the term's weight adapts towards a KL so small that any move of the adapter exceeds it
        "cold_start_kl_target": None if loss == "label" else 1e-9,
        "publish_every_samples": 10 if loss == "label" else 8})})
    bus, topics = _kafka_topics(settings, partitions=1)
    producer = bus.producer()
    rng = random.Random(4)
    send(producer, topics.samples, [_pair(i, rng) for i in range(8)])
    trainer = Trainer(settings, bus)
    state = trainer.run(idle_exit_s=3.0)
    # one cold-start thumb for every three live pairs: 8 live + 2 cold (trained with "label"; with "kl"
    # only held to the reference, so not counted as trained), all in one version
    assert state.samples == (10 if loss == "label" else 8) and [v.version for v in trainer.published] == ["1"]
    client = mlflow_client(settings)
    import mlflow

    manifest = read_lineage(Path(mlflow.artifacts.download_artifacts("models:/policy/1",
                                                                     dst_path=str(tmp_path / "v1"))))
    adapted = {} if loss == "label" else {"kl_target": 1e-9, "kl_coef_now": pytest.approx(4.8)}
    assert manifest.cold_start == {"sha256": file_sha256(cold), "weight": 0.25, "file_samples": 4,
                                   "mixed_in": 2, "loss": loss, "kl_coef": 4.0} | adapted
    assert manifest.offsets == {topics.samples: {"0": [0, 8]}} and manifest.kl_anchor == "base"
    assert_complete_lineage(manifest, client.get_model_version("policy", "1").tags)
    run_id = client.get_model_version("policy", "1").run_id
    if loss == "label":
        assert client.get_metric_history(run_id, "kto_loss")  # the cold thumbs were trained by KTO
        assert not client.get_metric_history(run_id, "anchor_kl")
    else:  # not trained as thumbs: they hold the KL term, which is 0 until the adapter moves, then grows
        assert not client.get_metric_history(run_id, "kto_loss")
        held = [m.value for m in sorted(client.get_metric_history(run_id, "anchor_kl"), key=lambda m: m.step)]
        assert len(held) == 2 and held[0] < 1e-6 < held[1], held
        # the weight: 4.0 for the first step (its KL 0 is under the target, and 4.0 is the floor), 4.0 in
        # the second, then x1.2 (the most one step moves it) after the second step's KL passed the target
        weights = sorted(client.get_metric_history(run_id, "anchor_kl_coef"), key=lambda m: m.step)
        assert [m.value for m in weights] == [4.0, 4.0]
    assert client.get_run(run_id).data.params["cold_start_weight"] == "0.25"
    bus.close()


def test_opposite_thumbs_on_one_prompt_train_as_a_dpo_pair(settings: Settings, ray_runtime: None) -> None:
    from online_rl.tracking import mlflow_client

    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "pair_thumbs": True, "batch_size": 6, "publish_every_samples": 4})})
    bus, topics = _kafka_topics(settings, partitions=1)
    rng = random.Random(7)
    thumbs = []
    for i in range(3):
        pair = _pair(i, rng)
        assert pair.chosen is not None and pair.rejected is not None
        up = _single(pair, list(pair.chosen.token_ids), 1.0, "thumbs", [-1.0] * len(pair.chosen.token_ids))
        # two users on prompts 0 and 1 disagree (a thumbs-down on the other answer); prompt 2 gets two ups
        other = pair.rejected.token_ids if i < 2 else [*pair.chosen.token_ids[:-1], 3000]
        second = _single(pair, list(other), 0.0 if i < 2 else 1.0, "thumbs", [-1.0] * len(other))
        thumbs += [up.model_copy(update={"sample_id": f"up{i}"}),
                   second.model_copy(update={"sample_id": f"b{i}"})]
    send(bus.producer(), topics.samples, thumbs)
    trainer = Trainer(settings, bus)
    state = trainer.run(idle_exit_s=3.0)
    assert state.step == 1 and [v.version for v in trainer.published] == ["1"]
    client = mlflow_client(settings)
    run_id = client.get_model_version("policy", "1").run_id

    def logged(name: str) -> list[float]:
        return [m.value for m in client.get_metric_history(run_id, name)]

    # the two disagreements trained as DPO pairs, the two thumbs-up of prompt 2 as KTO thumbs
    assert logged("thumb_pairs") == [2.0] and logged("thumbs_awaiting_pair") == [2.0]
    assert len(logged("dpo_loss")) == 1 and len(logged("kto_loss")) == 1 and state.samples == 4
    bus.close()


def test_held_out_gains_trigger_publishing_and_the_champion_becomes_the_kl_anchor(
    settings: Settings, ray_runtime: None, tmp_path: Path
) -> None:
    import mlflow

    from online_rl.tracking import mlflow_client
    from online_rl.trainer.samples import held_out

    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "eval_holdout": 0.25, "eval_every_steps": 1, "publish_on_eval_gain": 0.02, "kl_anchor": "champion",
        "publish_every_samples": 1000})})  # only an evaluation can make a publish due
    bus, topics = _kafka_topics(settings, partitions=1)
    producer = bus.producer()
    rng = random.Random(6)
    samples = [_pair(i, rng) for i in range(48)]
    send(producer, topics.samples, samples[:32])
    held = [s.sample_id for s in samples[:32] if held_out(s.sample_id, 0.25)]
    assert 2 <= len(held) <= 16
    first = Trainer(settings, bus)
    state = first.run(idle_exit_s=3.0)
    assert state.samples == 32 - len(held)  # held-out samples are never trained on
    assert first.published, "no evaluation beat the threshold"
    client = mlflow_client(settings)

    def manifest(version: str) -> Any:
        return read_lineage(Path(mlflow.artifacts.download_artifacts(
            f"models:/policy/{version}", dst_path=str(tmp_path / f"v{version}"))))

    v1 = manifest(first.published[0].version)
    assert v1.eval["eval_gain"] >= 0.02 and 1 <= v1.eval["eval_samples"] <= len(held)
    assert_complete_lineage(v1, client.get_model_version("policy", first.published[0].version).tags)
    from online_rl.trainer import CheckpointStore

    latest = CheckpointStore(settings.checkpoint_dir).load_latest()
    assert latest is not None and len(latest.metadata["eval_set"]) == len(held)  # kept for the next lifetime
    assert v1.kl_anchor == "base"  # no champion yet
    # the canary promotes version 1; the next lifetime holds its KL term to it and compares with
    # its own last published version (reloaded from MLflow) on the held-out set it checkpointed
    client.set_registered_model_alias("policy", "champion", first.published[0].version)
    send(producer, topics.samples, samples[32:])
    second = Trainer(settings.model_copy(update={"trainer": settings.trainer.model_copy(
        update={"publish_every_samples": 8})}), bus)
    second.run(idle_exit_s=3.0)
    assert second.kl_anchor == f"policy-v{first.published[0].version}"
    run_id = client.search_runs([client.get_experiment_by_name(settings.trainer.experiment).experiment_id],
                                order_by=["attributes.start_time DESC"])[0].info.run_id
    assert client.get_metric_history(run_id, "eval_baseline_score")
    assert manifest(second.published[0].version).kl_anchor == f"policy-v{first.published[0].version}"
    bus.close()


def _single(pair: TrainingSample, token_ids: list[int], reward: float, kind: str,
            logprobs: list[float] | None = None) -> TrainingSample:
    """`pair`'s prompt and ids with one rated answer instead of its chosen/rejected pair."""
    completion = Completion(request_id=f"a-{pair.sample_id}", text="-", token_ids=token_ids,
                            logprobs=logprobs or [])
    return TrainingSample.model_validate(pair.model_dump(exclude={"chosen", "rejected"}) | {
        "kind": "single", "completion": completion, "reward": reward, "label": reward >= 0.5,
        "feedback_kind": kind, "behaviour_versions": [None]})


def _rating(i: int, rng: random.Random) -> TrainingSample:
    """A rated single answer: 5/5 when it ends with PREFERRED, 1/5 when it ends with AVOIDED."""
    good = i % 2 == 0
    # one-token answers: the reward is all about that token
    return _single(_pair(i, rng), [PREFERRED if good else AVOIDED], 1.0 if good else 0.0, "rating")


def test_ratings_train_ppo_with_a_critic_and_the_version_learns(
    settings: Settings, ray_runtime: None, tiny_model: Path, tmp_path: Path
) -> None:
    import mlflow

    from online_rl.tracking import mlflow_client
    from online_rl.trainer import CheckpointStore

    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={
        "publish_every_samples": 96, "learning_rate": 3e-3, "critic_learning_rate": 1e-3,
        "kl_coef": 0.01, "ppo_epochs": 4,
        # a token's prior is the MLPs' to move: attention-only adapters learn it slowly and noisily
        "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]})})
    bus, topics = _kafka_topics(settings, partitions=1)
    producer = bus.producer()
    rng = random.Random(7)
    send(producer, topics.samples, [_rating(i, rng) for i in range(96)])
    held_out: list[tuple[list[int], list[int]]] = [(_ids(rng, 2, 6), []) for _ in range(16)]
    trainer = Trainer(settings, bus)
    state = trainer.run(idle_exit_s=3.0)
    assert state.samples == 96 and [v.version for v in trainer.published] == ["1"]
    folder = Path(mlflow.artifacts.download_artifacts("models:/policy/1", dst_path=str(tmp_path / "v1")))
    base, v1 = _margin(tiny_model, None, held_out), _margin(tiny_model, folder, held_out)
    assert v1 > base + 1.0, (base, v1)  # PPO moved probability from the low-rated ending to the high
    client = mlflow_client(settings)
    assert_complete_lineage(read_lineage(next(folder.rglob("lineage.json")).parent),
                            client.get_model_version("policy", "1").tags)
    run_id = client.get_model_version("policy", "1").run_id
    for name in ("ppo_loss", "value_loss", "ppo_kl", "ppo_reward", "kl_coef"):
        assert client.get_metric_history(run_id, name), name
    assert not client.get_metric_history(run_id, "dpo_loss")  # auto sent every rating to PPO
    checkpoint = CheckpointStore(settings.checkpoint_dir).load_latest()
    assert checkpoint is not None and checkpoint.critic is not None  # the critic resumes too
    assert any(name.startswith("value_head.") for name in checkpoint.critic["adapter"])
    bus.close()


def test_a_batch_with_a_non_finite_loss_is_dead_lettered_and_never_reaches_a_version(
    settings: Settings, ray_runtime: None, tiny_model: Path, tmp_path: Path
) -> None:
    """A model whose embedding of one token is infinite: the batch that uses that token has a NaN loss.
    Its update is skipped on every rank, its samples go to the dead-letter topic, the batches around it
    train, and the published adapter is finite."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    poisoned, token = tmp_path / "poisoned", 4321
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    # untie the output layer first: the tiny Llama shares it with the embedding, which would make every
    # logit row infinite, not only where the token is read
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        model.get_input_embeddings().weight[token] = float("inf")
    model.save_pretrained(poisoned)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model / name).exists():
            (poisoned / name).write_bytes((tiny_model / name).read_bytes())
    settings = settings.model_copy(update={
        "model": settings.model.model_copy(update={"path": poisoned}),
        "trainer": settings.trainer.model_copy(update={"batch_size": 4, "publish_every_samples": 8})})
    bus, topics = _kafka_topics(settings, partitions=1)
    rng = random.Random(6)
    pairs = [_pair(i, rng) for i in range(12)]
    bad = {f"s{i}" for i in range(4, 8)}  # the second batch: its prompts use the poisoned token
    pairs = [p.model_copy(update={"prompt_token_ids": [token, *p.prompt_token_ids]})
             if p.sample_id in bad else p for p in pairs]
    send(bus.producer(), topics.samples, pairs)
    trainer = Trainer(settings, bus)
    state = trainer.run(idle_exit_s=3.0)
    assert state.samples == 8 and state.dead_lettered == 4
    assert state.offsets[TopicPartition(topics.samples, 0)] == 12  # read past, committed: not retried
    dead = {r.key.decode(): dict(r.headers)["reason"].decode() for r in bus.read_all(topics.dlq) if r.key}
    assert set(dead) == bad and all("non-finite" in reason for reason in dead.values()), dead
    import mlflow

    folder = Path(mlflow.artifacts.download_artifacts("models:/policy/1", dst_path=str(tmp_path / "v1")))
    weights = load_file(str(next(folder.rglob("adapter_model.safetensors"))))
    assert weights and all(torch.isfinite(w).all() for w in weights.values())
    bus.close()
