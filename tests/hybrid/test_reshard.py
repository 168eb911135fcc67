"""Resharding on real Ray workers (gloo): generation shards are exact slices of the trained weights,
and a tensor-parallel generation after resharding is the unsharded model's generation."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig

from online_rl.algos.policy import LoraSpec
from online_rl.hybrid.engine import cut
from online_rl.hybrid.group import HybridGroup
from online_rl.hybrid.layout import llama_specs
from online_rl.trainer.spec import HybridSpec, ModelSpec

pytestmark = pytest.mark.slow

LORA = LoraSpec(rank=4, alpha=8, targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"))
PROMPTS = [[1, 9038, 2210, 314, 260], [1, 504, 1431], [1, 22, 314, 6549, 28, 33, 3117], [1, 1975]]


def _train_once(group: HybridGroup, rng: random.Random) -> None:
    """One PPO step with random advantages: the adapter leaves its zero start."""
    rollouts = [(p, [rng.randrange(100, 5000) for _ in range(4)]) for p in PROMPTS * 2]
    scored = group.score(rollouts)
    old = [s[0] for s in scored]
    advantages = [[rng.gauss(0, 1) for _ in c] for _, c in rollouts]
    group.ppo_train(rollouts, old, advantages, old)


def _check_shards(group: HybridGroup, full: dict[str, torch.Tensor], model_config: Any) -> None:
    for shards in group.generation_shards():
        tensors = shards["base"] | shards["adapter"]
        assert set(tensors) == set(full)
        for name, tensor in tensors.items():
            spec = llama_specs([(name, full[name].shape)], model_config)[0]
            expected = cut(full[name], spec.full(), spec.generation_box(shards["tp"], shards["tp_rank"]))
            assert torch.equal(tensor, expected), name


def _reference_generation(model_dir: Path, adapter: Path | None, max_new_tokens: int) -> list[list[int]]:
    """Greedy tokens of transformers (with PEFT and `adapter`, or the base alone) for PROMPTS."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    eos = model.config.eos_token_id
    out = []
    for prompt in PROMPTS:
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=eos)[0, len(prompt):].tolist()
        out.append(ids[: ids.index(eos) + 1] if eos in ids else ids)
    return out


@pytest.mark.parametrize(("dp", "fsdp", "tp", "keep_base"), [
    (1, 2, 2, True),  # FSDP 2 → TP 2: the shards line up, only norms and the vocabulary tail move
    (2, 2, 2, True),  # HSDP: two replicas of two shards, each replica its own engine
    (1, 4, 2, False),  # micro data-parallel groups of two; the copy is freed when training resumes
    (1, 4, 4, False),  # more ranks than key/value heads: those heads are replicated
])
def test_resharded_shards_and_generation_match_the_full_model(
        dp: int, fsdp: int, tp: int, keep_base: bool, tiny_model: Path, ray_runtime: None,
        tmp_path: Path) -> None:
    spec = HybridSpec(ModelSpec(str(tiny_model), LORA, seed=0, precision="fp32"), learning_rate=5e-2,
                      epochs=1)
    group = HybridGroup(spec, dp=dp, fsdp=fsdp, tp=tp, cpus_per_worker=0.5)
    try:
        model_config = AutoConfig.from_pretrained(tiny_model)
        _train_once(group, random.Random(0))
        full = group.full_weights()
        first = group.to_generation(keep_base=keep_base)
        assert all(s["base"] is not None for s in first)
        _check_shards(group, full, model_config)
        if not keep_base:  # zero redundancy: the training shards inside the generation copy are given back
            assert all(s["training_resident_bytes"] == 0 for s in first)

        ours = [c["token_ids"] for c in group.generate(PROMPTS, 12, temperature=0.0)]
        group.save_adapter(str(tmp_path / "adapter"))
        assert ours == _reference_generation(tiny_model, tmp_path / "adapter", 12)
        assert len({tuple(t) for t in ours}) > 1  # the prompts are answered differently

        group.to_training()
        after = group.full_weights()
        assert all(torch.equal(full[k], after[k]) for k in full)  # training resumes on the same weights

        _train_once(group, random.Random(1))
        full = group.full_weights()
        second = group.to_generation(method="allgather" if not keep_base else "hybrid", keep_base=keep_base)
        assert second[0]["adapter_name"] != first[0]["adapter_name"]  # a new immutable name per sync
        if keep_base:  # the base was synced once: only the adapter moved
            assert all(s["base"] is None for s in second)
        else:  # the hybrid plan moved less than the all-gather that followed it
            summary = group.plan_summary()
            assert [s["base"]["received_bytes"] for s in first] == summary["received_bytes"]
            if (fsdp, tp) == (4, 2):  # a quarter of the weights (the partner's half of the shard) vs 3/4
                model = summary["model_bytes"]
                assert max(s["base"]["received_bytes"] for s in first) == pytest.approx(model / 4, rel=0.01)
                assert min(s["base"]["received_bytes"] for s in second) == pytest.approx(3 * model / 4,
                                                                                        rel=0.01)
        _check_shards(group, full, model_config)
        group.to_training()
    finally:
        group.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (bench/gpu_check.sh)")
def test_nccl_reshard_on_one_gpu_generates_as_the_full_model(tiny_model: Path, ray_runtime: None,
                                                             tmp_path: Path) -> None:
    """The GPU path at tp = 1: the hybrid worker trains on CUDA, its process group is NCCL, the
    transition and the TP engine run on the GPU, and greedy decoding equals PEFT's on the CPU."""
    spec = HybridSpec(ModelSpec(str(tiny_model), LORA, seed=0, precision="fp32"), learning_rate=5e-2,
                      epochs=1)
    group = HybridGroup(spec, dp=1, fsdp=1, tp=1, cpus_per_worker=1, gpus_per_worker=1)
    try:
        _train_once(group, random.Random(0))
        first = group.to_generation(keep_base=True)
        assert first[0]["base"] is not None
        ours = [c["token_ids"] for c in group.generate(PROMPTS, 12, temperature=0.0)]
        group.save_adapter(str(tmp_path / "adapter"))
        assert ours == _reference_generation(tiny_model, tmp_path / "adapter", 12)
        group.to_training()
    finally:
        group.close()
