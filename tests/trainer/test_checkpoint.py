"""Checkpoints resume training exactly, survive a crash mid-write, and skip a corrupt newest one."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from online_rl.algos import DPOConfig
from online_rl.algos.batch import dpo_batch_loss
from online_rl.algos.policy import LoraSpec, lora_policy, trainable_parameters
from online_rl.bus import TopicPartition
from online_rl.trainer import Checkpoint, CheckpointCorrupt, CheckpointStore, capture_rng

SAMPLES = TopicPartition("orl.samples", 0)


def _pairs(seed: int, count: int) -> list[tuple[list[int], list[int], list[int]]]:
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    return [(ids(rng.randint(2, 6)), ids(rng.randint(1, 4)), ids(rng.randint(1, 4))) for _ in range(count)]


def _trainer(tiny_model: Path) -> tuple[Any, torch.optim.Optimizer]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    # dropout on the adapter's input, so that resuming also depends on the random state
    policy = lora_policy(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32),
                         LoraSpec(rank=4, dropout=0.1))
    policy.train()
    return policy, torch.optim.AdamW(list(trainable_parameters(policy).values()), lr=1e-2)


def _step(policy: Any, optimizer: torch.optim.Optimizer, pairs: list[Any]) -> None:
    dpo_batch_loss(policy, pairs, DPOConfig()).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _checkpoint(policy: Any, optimizer: torch.optim.Optimizer, step: int) -> Checkpoint:
    return Checkpoint(step=step, samples=4 * step, offsets={SAMPLES: 4 * step},
                      adapter={k: v.detach().clone() for k, v in trainable_parameters(policy).items()},
                      optimizer=optimizer.state_dict(), rng=capture_rng(), metadata={"config_hash": "abc"})


def test_resuming_trains_exactly_as_without_a_stop(tiny_model: Path, tmp_path: Path) -> None:
    batches = [_pairs(seed, 4) for seed in range(5)]
    store = CheckpointStore(tmp_path / "ckpt")
    policy, optimizer = _trainer(tiny_model)
    for batch in batches[:3]:
        _step(policy, optimizer, batch)
    store.save(_checkpoint(policy, optimizer, step=3))
    for batch in batches[3:]:
        _step(policy, optimizer, batch)
    uninterrupted = {k: v.detach().clone() for k, v in trainable_parameters(policy).items()}

    # a new process: fresh model and optimizer, restored from disk
    torch.manual_seed(1234)
    resumed, resumed_optimizer = _trainer(tiny_model)
    checkpoint = store.load_latest()
    assert checkpoint is not None and checkpoint.step == 3
    assert checkpoint.offsets == {SAMPLES: 12} and checkpoint.metadata == {"config_hash": "abc"}
    checkpoint.restore_into(trainable_parameters(resumed), resumed_optimizer)
    for batch in batches[checkpoint.step :]:
        _step(resumed, resumed_optimizer, batch)

    for name, value in trainable_parameters(resumed).items():
        assert torch.equal(value, uninterrupted[name]), name


def test_a_crash_while_writing_leaves_the_previous_checkpoint(tiny_model: Path, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt")
    policy, optimizer = _trainer(tiny_model)
    store.save(_checkpoint(policy, optimizer, step=1))
    # what a crash leaves: a staging folder, and a renamed folder whose manifest was never written
    (store.root / ".step-000000002-x1y2").mkdir()
    (store.root / "step-000000002").mkdir()
    (store.root / "step-000000002" / "tensors.safetensors").write_bytes(b"partial")
    checkpoint = store.load_latest()
    assert checkpoint is not None and checkpoint.step == 1


def test_a_corrupt_newest_checkpoint_falls_back_to_the_one_before(tiny_model: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=3)
    policy, optimizer = _trainer(tiny_model)
    for step in (1, 2):
        _step(policy, optimizer, _pairs(step, 4))
        store.save(_checkpoint(policy, optimizer, step=step))
    newest = store.root / "step-000000002" / "tensors.safetensors"
    data = bytearray(newest.read_bytes())
    data[-1] ^= 0xFF
    newest.write_bytes(bytes(data))
    with pytest.raises(CheckpointCorrupt, match=r"tensors\.safetensors does not match its manifest"):
        store.load(newest.parent)
    with caplog.at_level(logging.ERROR):
        checkpoint = store.load_latest()
    assert checkpoint is not None and checkpoint.step == 1 and checkpoint.offsets == {SAMPLES: 4}
    assert "skipping checkpoint step-000000002" in caplog.text


def test_old_checkpoints_are_pruned_and_latest_names_the_newest(tiny_model: Path, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2)
    policy, optimizer = _trainer(tiny_model)
    for step in range(1, 5):
        store.save(_checkpoint(policy, optimizer, step=step))
    assert [p.name for p in store.complete()] == ["step-000000003", "step-000000004"]
    assert (store.root / "latest").read_text() == "step-000000004"
    state = json.loads((store.root / "step-000000004" / "state.json").read_text())
    assert state["offsets"] == [["orl.samples", 0, 16]]


def test_a_checkpoint_for_another_adapter_shape_is_refused(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    store = CheckpointStore(tmp_path / "ckpt")
    policy, optimizer = _trainer(tiny_model)
    store.save(_checkpoint(policy, optimizer, step=1))
    only_q = LoraSpec(rank=4, targets=("q_proj",))
    other = lora_policy(AutoModelForCausalLM.from_pretrained(tiny_model), only_q)
    other_optimizer = torch.optim.AdamW(list(trainable_parameters(other).values()))
    checkpoint = store.load_latest()
    assert checkpoint is not None
    with pytest.raises(CheckpointCorrupt, match="does not fit this adapter"):
        checkpoint.restore_into(trainable_parameters(other), other_optimizer)


def test_a_crash_while_replacing_the_same_step_keeps_it(tiny_model: Path, tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=1)
    policy, optimizer = _trainer(tiny_model)
    store.save(_checkpoint(policy, optimizer, step=5))
    # the state a crash leaves between moving the old folder aside and moving the new one in
    final = store.root / "step-000000005"
    final.rename(store.root / ".step-000000005-replaced")
    checkpoint = store.load_latest()
    assert checkpoint is not None and checkpoint.step == 5 and final.is_dir()
    store.save(_checkpoint(policy, optimizer, step=5))  # replacing it for real leaves one folder
    assert [p.name for p in store.root.iterdir() if "step" in p.name] == ["step-000000005"]


def test_records_already_trained_or_read_twice_are_dropped() -> None:
    from online_rl.bus import Record
    from online_rl.stream import Batch
    from online_rl.trainer.controller import drop_trained

    def record(partition: int, offset: int) -> Record:
        return Record("orl.samples", partition, offset, None, b"", 0.0)

    reads = [record(0, 3), record(0, 4), record(1, 0), record(0, 4), record(0, 5)]
    batch = Batch(items=["a", "b", "c", "d", "e"], records=[*reads])
    batch.records.append(None)  # a cold-start item has no record and is always kept
    batch.items.append("cold")
    drop_trained(batch, {TopicPartition("orl.samples", 0): 4})
    assert batch.items == ["b", "c", "e", "cold"]


def test_the_critic_s_weights_and_optimizer_round_trip(tmp_path: Path) -> None:
    head = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(head.parameters(), lr=0.1)
    head(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    critic = {"adapter": {f"value_head.{n}": p.detach().clone() for n, p in head.named_parameters()},
              "optimizer": optimizer.state_dict()}
    store = CheckpointStore(tmp_path)
    store.save(Checkpoint(step=1, samples=1, offsets={}, adapter={"w": torch.zeros(2)},
                          optimizer=torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1).state_dict(),
                          critic=critic))
    loaded = store.load_latest()
    assert loaded is not None and loaded.critic is not None
    assert loaded.critic["adapter"].keys() == critic["adapter"].keys()
    for name, value in critic["adapter"].items():
        assert torch.equal(loaded.critic["adapter"][name], value)
    restored = torch.optim.AdamW(torch.nn.Linear(4, 1).parameters(), lr=0.1)
    restored.load_state_dict(loaded.critic["optimizer"])
    moment = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(restored.state_dict()["state"][0]["exp_avg"], moment)
    assert loaded.adapter.keys() == {"w"}  # the policy's own tensors stay apart


def test_the_trainers_adapted_coefficients_and_label_counts_survive_a_checkpoint(tmp_path: Path) -> None:
    from online_rl.trainer.controller import TrainerState

    state = TrainerState(step=7, samples=70, kl_coef=0.07, anchor_kl_coef=1.44, thumbs_up=9, thumbs_down=31)
    store = CheckpointStore(tmp_path / "ckpt")
    store.save(Checkpoint(step=7, samples=70, offsets={}, adapter={"w": torch.zeros(2)},
                          optimizer={"state": {}, "param_groups": []}, metadata=state.metadata()))
    loaded = store.load_latest()
    assert loaded is not None
    back = TrainerState.from_checkpoint(loaded)
    assert (back.kl_coef, back.anchor_kl_coef, back.thumbs_up, back.thumbs_down) == (0.07, 1.44, 9, 31)
