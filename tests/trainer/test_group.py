"""Data parallelism: a batch split over several Ray workers (gloo all-reduce) trains the adapter the
same as one worker, and the split itself puts every sample in exactly one shard."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from online_rl.algos import mismatched_pairs
from online_rl.config import Settings
from online_rl.trainer.samples import Routed, shard
from online_rl.trainer.spec import trainer_specs
from tests.conftest import TINY_NAME

pytestmark = pytest.mark.slow


def _routed(rng: random.Random, pairs: int, thumbs: int, anchors: int = 0) -> Routed:
    def ids(low: int, high: int) -> list[int]:
        return [rng.randrange(100, 5000) for _ in range(rng.randint(low, high))]

    return Routed(pairs=[(ids(2, 9), ids(1, 6), ids(1, 6)) for _ in range(pairs)],
                  thumbs=[(ids(2, 9), ids(1, 6), rng.random() < 0.5) for _ in range(thumbs)],
                  anchors=[(ids(2, 9), ids(1, 6)) for _ in range(anchors)])


def test_shards_hold_every_sample_once_with_partners_from_the_whole_batch() -> None:
    routed = _routed(random.Random(0), pairs=5, thumbs=6)
    shards = shard(routed, 3)
    assert sorted(map(repr, [s for part in shards for s in part.pairs])) == sorted(map(repr, routed.pairs))
    assert sorted(map(repr, [t for part in shards for t in part.thumbs])) == sorted(map(repr, routed.thumbs))
    partner_of = {repr(routed.thumbs[i]): routed.thumbs[j][1]
                  for i, j in enumerate(mismatched_pairs(len(routed.thumbs)))}
    for part in shards:
        assert part.total_pairs == 5 and part.total_thumbs == 6 and part.partners is not None
        assert [partner_of[repr(t)] for t in part.thumbs] == part.partners
    loads = [sum(len(p) + len(c) + len(r) for p, c, r in s.pairs)
             + sum(len(p) + len(c) for p, c, _ in s.thumbs) for s in shards]
    assert max(loads) - min(loads) <= 15  # balanced to within one sample's tokens
    # a single thumb has no partner anywhere: its reference point is 0, as on one worker
    assert all(part.partners is None for part in shard(_routed(random.Random(1), 3, 1), 2))


Adapter = dict[str, torch.Tensor]


def _train(settings: Settings, workers: int,
           batches: list[Routed]) -> tuple[Adapter, list[dict[str, float]], list[Adapter]]:
    """The first rank's adapter before training, each step's metrics and every rank's adapter after."""
    from online_rl.trainer.group import WorkerGroup

    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(
        update={"workers": workers, "cpus_per_worker": 1.0, "learning_rate": 1e-2})})
    group = WorkerGroup(settings, *trainer_specs(settings))
    try:
        initial = group.adapters()[0]
        metrics = [group.train_step(batch) for batch in batches]
        return initial, metrics, group.adapters()
    finally:
        group.close()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_two_workers_train_the_same_adapter_as_one(tiny_model: Path, ray_runtime: None,
                                                    precision: str) -> None:
    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"precision": precision})  # type: ignore[arg-type]
    rng = random.Random(2)
    # mixed DPO + KTO, odd counts (one rank gets no thumbs in the third), a lone thumb (z0 = 0); the
    # cold-start KL term's anchors in two batches, one of them leaving a rank without any
    batches = [_routed(rng, 3, 4), _routed(rng, 4, 3, anchors=3), _routed(rng, 2, 1, anchors=1),
               _routed(rng, 0, 5)]
    initial, one_metrics, (one,) = _train(settings, 1, batches)
    _, two_metrics, (first, second) = _train(settings, 2, batches)
    for name in one:
        assert torch.equal(first[name], second[name]), name  # the ranks agree exactly
    if precision == "fp32":
        # sums over a different split round differently; Adam scales an element whose gradient is
        # near zero up to about lr per step, so allow 1 % of each tensor's largest move (seen: 0.25 %)
        for name in one:
            moved = (one[name] - initial[name]).abs().max().item()
            torch.testing.assert_close(first[name], one[name], rtol=0, atol=1e-2 * moved)
    else:
        # bfloat16 products round differently for different shard shapes, and Adam's first steps
        # move each weight by about +-lr whatever its gradient's size: compare the whole update
        update_one = torch.cat([(one[n] - initial[n]).flatten() for n in one])
        update_two = torch.cat([(first[n] - initial[n]).flatten() for n in one])
        cosine = torch.nn.functional.cosine_similarity(update_one, update_two, dim=0).item()
        assert cosine > 0.99
    assert any(not torch.equal(one[name], initial[name]) for name in one)  # and it learned something
    assert one_metrics[1]["anchor_kl"] > 0 and "anchor_kl" not in one_metrics[0]  # the adapter had moved
    rel, abs_ = (1e-3, 1e-4) if precision == "fp32" else (5e-2, 1e-2)  # bf16 log-probs: ~0.01 nats
    for a, b in zip(one_metrics, two_metrics, strict=True):
        assert a.keys() == b.keys()
        for key in ("loss", "dpo_accuracy", "kto_kl", "grad_norm", "anchor_kl"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=rel, abs=abs_), key


def test_ppo_on_two_workers_matches_one(tiny_model: Path, ray_runtime: None) -> None:
    """PPO's phases (ranks score, the critic values, the controller computes advantages, ranks and
    critic update) give the same adapter on 2 workers as on 1, with an empty rank in one batch."""
    from online_rl.trainer.group import WorkerGroup
    from online_rl.trainer.ppo import advantages_for

    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"learning_rate": 1e-2, "cpus_per_worker": 1.0})  # type: ignore[arg-type]
    rng = random.Random(3)

    def rollouts(n: int) -> Routed:
        return Routed(rollouts=[([rng.randrange(100, 5000) for _ in range(rng.randint(2, 6))],
                                 [rng.randrange(100, 5000) for _ in range(rng.randint(1, 5))],
                                 None, rng.random()) for _ in range(n)])

    batches = [rollouts(5), rollouts(1), rollouts(4)]  # the 1-rollout batch leaves rank 1 empty
    adapters = []
    for workers in (1, 2):
        trainer = settings.trainer.model_copy(update={"workers": workers})
        policy, critic = trainer_specs(settings)
        group = WorkerGroup(settings.model_copy(update={"trainer": trainer}), policy, critic)
        try:
            for routed in batches:
                scored, values = group.ppo_score(routed)
                old, ref = [o for o, _ in scored], [r for _, r in scored]
                out = advantages_for(routed.rollouts, old, ref, values, policy.ppo, 0.05)
                metrics = group.ppo_train(routed, old, out.advantages, out.returns, values)
                assert metrics["value_loss"] >= 0 and "ppo_clip_fraction" in metrics
            adapters.append(group.adapters())
        finally:
            group.close()
    (one,), (first, second) = adapters
    assert any("lora_B" in name and one[name].abs().sum() > 0 for name in one)  # PPO moved the adapter
    for name in one:
        assert torch.equal(first[name], second[name]), name
        torch.testing.assert_close(first[name], one[name], rtol=1e-4, atol=1e-5)
