"""The policy worker on its own (no Ray): a non-finite loss never reaches the adapter."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from online_rl.config import Settings
from online_rl.trainer.samples import Routed, shard
from online_rl.trainer.spec import trainer_specs
from online_rl.trainer.worker import PolicyWorker
from tests.conftest import TINY_NAME


def test_a_non_finite_loss_skips_the_update_and_says_so(tiny_model: Path) -> None:
    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"precision": "fp32", "learning_rate": 1e-2})  # type: ignore[arg-type]
    worker = PolicyWorker(trainer_specs(settings)[0])
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    routed = Routed(pairs=[(ids(4), ids(3), ids(3)) for _ in range(3)],
                    thumbs=[(ids(4), ids(3), i % 2 == 0) for i in range(3)])
    (part,) = shard(routed, 1)
    assert "nonfinite" not in worker.train_step(part)  # a finite step moves the adapter
    before = {name: value.clone() for name, value in worker.adapter().items()}
    embedding = worker.policy.get_input_embeddings().weight
    with torch.no_grad():
        saved = embedding[routed.pairs[0][0][0]].clone()
        embedding[routed.pairs[0][0][0]] = float("inf")  # one bad weight: the loss and gradient are NaN
    metrics = worker.train_step(part)
    assert metrics["nonfinite"] == 1.0
    assert all(torch.equal(before[name], value) for name, value in worker.adapter().items())
    with torch.no_grad():
        embedding[routed.pairs[0][0][0]] = saved
    assert "nonfinite" not in worker.train_step(part)  # and the next finite step trains again
    assert any(not torch.equal(before[name], value) for name, value in worker.adapter().items())


def test_the_kto_weights_a_step_carries_replace_the_specs(tiny_model: Path) -> None:
    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"precision": "fp32", "kto_desirable_weight": 2.0})  # type: ignore[arg-type]
    rng = random.Random(1)

    def ids(n: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(n)]

    routed = Routed(thumbs=[(ids(4), ids(3), up) for up in (True, False, True)])
    # The adapter starts as the identity (LoRA's B is 0), so every log-ratio and the reference point are
    # 0 and each thumb's loss is its weight x (1 - sigmoid(0)) = weight / 2; the metric is their sum.
    (spec_weights,) = shard(routed, 1)
    (balanced,) = shard(routed, 1, kto_weights=(3.0, 1.5))
    assert PolicyWorker(trainer_specs(settings)[0]).train_step(spec_weights)["kto_loss"] == \
        pytest.approx((2.0 + 1.0 + 2.0) / 2, rel=1e-5)
    assert PolicyWorker(trainer_specs(settings)[0]).train_step(balanced)["kto_loss"] == \
        pytest.approx((3.0 + 1.5 + 3.0) / 2, rel=1e-5)
