"""The rollout flow on vLLM (`hybrid.engine: vllm`), on a real Ray runtime and a real vLLM engine: the
adapter reaches vLLM from memory after every update, vLLM then generates exactly what a PEFT model
with that adapter generates (greedy), no adapter file is written for a sync, and old versions are
unloaded."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from online_rl.config import Settings
from tests.hybrid.test_reshard import PROMPTS, _reference_generation, _train_once

pytestmark = pytest.mark.slow

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _devices() -> dict[str, float]:
    """Where the engine and the training device run: half a core each here; on a machine with a GPU
    (bench/gpu_check.sh) both share it, vLLM on CUDA and the hybrid worker on NCCL."""
    import torch

    if torch.cuda.is_available():
        return {"engine_cpus": 1, "cpus_per_worker": 1, "engine_gpus": 0.5, "gpus_per_worker": 0.5}
    return {"engine_cpus": 0.5, "cpus_per_worker": 0.5}


def test_rollout_flow_on_vllm_syncs_adapters_from_memory(tiny_model: Path, ray_runtime: None,
                                                          tmp_path: Path) -> None:
    from online_rl.hybrid.generation import VllmGeneration
    from online_rl.hybrid.loop import ColocatedPPO

    settings = Settings(
        cache_dir=tmp_path / "cache",
        model={"path": tiny_model},  # type: ignore[arg-type]
        trainer={"lora_rank": 4, "lora_alpha": 8, "lora_targets": TARGETS},  # type: ignore[arg-type]
        hybrid=_devices() | {  # type: ignore[arg-type]
            "engine": "vllm", "rollout_batch": 2, "max_new_tokens": 8, "min_pairs": 0, "learning_rate": 5e-2,
            "precision": "fp32", "critic_free": {"estimator": "grpo", "group_size": 4}},
        rewards={"functions": [{"name": "characters", "target": "tests.hybrid.reward_fns:characters"}],  # type: ignore[arg-type]
                 "weights": {}},
    )
    ppo = ColocatedPPO(settings)
    try:
        engine = ppo.engine
        assert isinstance(engine, VllmGeneration)
        ppo.observe(prompts=PROMPTS)
        names = []
        for step in range(2):
            metrics = ppo.step()
            sync = ppo.last_sync
            names.append(sync["adapter_name"])
            assert sync["files_written"] == [], sync  # the adapter travelled in memory only
            assert metrics["rollouts"] == 8 and metrics["generated_tokens"] > 0
            assert "ppo_loss" in metrics, metrics  # the policy took its steps
            # vLLM's behaviour log-probs are the trained policy's (fp32 both, temperature 1)
            assert metrics["behaviour_gap"] < 1e-3, metrics
            # the adapter is a small share of the base: only it moves
            base_bytes = sum(f.stat().st_size for f in tiny_model.glob("*.safetensors"))
            assert 0 < sync["adapter_sync_bytes"] < 0.2 * base_bytes
            assert engine.adapters()["names"] == {sync["adapter_name"]: step + 1}
            assert list(engine.adapters()["resident"]) == [step + 1]  # the previous version was unloaded
        assert len(set(names)) == 2  # a new immutable name per sync

        # after a sync, vLLM's greedy tokens are those of PEFT with the trained adapter
        _train_once(ppo.group, random.Random(0))  # a large step, so that greedy answers move too
        sync = engine.sync()
        ours = [c["token_ids"] for c in engine.generate(PROMPTS, 12, 0.0, seed=0)]
        ppo.save_adapter(str(tmp_path / "adapter"))
        assert ours == _reference_generation(tiny_model, tmp_path / "adapter", 12)
        base = [c["token_ids"] for c in engine.generate(PROMPTS, 12, 0.0, seed=0, adapter=None)]
        assert base == _reference_generation(tiny_model, None, 12)
        assert base != ours  # the adapter changed the answers: the comparison above is not vacuous

        with pytest.raises(Exception, match="already installed"):  # names are immutable
            import ray

            tensors, config = ppo.group.adapter_state()
            ray.get(engine.actor.install.remote(sync["adapter_name"], tensors, config))
    finally:
        ppo.close()


def _flow(model: Path, tmp_path: Path, name: str, reward: str = "repetitive", **hybrid: object) -> Settings:
    return Settings(
        cache_dir=tmp_path / name,
        model={"path": model},  # type: ignore[arg-type]
        trainer={"lora_rank": 4, "lora_alpha": 8, "lora_targets": TARGETS},  # type: ignore[arg-type]
        hybrid=_devices() | {  # type: ignore[arg-type]
            "engine": "vllm", "rollout_batch": 4, "max_new_tokens": 8, "min_pairs": 0, "learning_rate": 5e-2,
            "precision": "fp32", "critic_free": {"estimator": "grpo", "group_size": 4}} | hybrid,
        rewards={"functions": [{"name": reward,  # type: ignore[arg-type]
                                "target": f"tests.hybrid.reward_fns:{reward}"}], "weights": {}},
    )


def _learn(settings: Settings, steps: int) -> tuple[list[float], list[dict[str, float]]]:
    """Run the flow for `steps` iterations; the reward of each and the metrics."""
    from online_rl.hybrid.loop import ColocatedPPO

    ppo = ColocatedPPO(settings)
    try:
        ppo.observe(prompts=PROMPTS)
        runs = [ppo.step() for _ in range(steps)]
    finally:
        ppo.close()
    return [m["reward"] for m in runs], runs


@pytest.fixture(scope="module")
def learnable_model(embedded_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama that answers mostly in single characters, so a preference among them can be learned
    in a few steps (a plain random one cannot: see online_rl/models/tiny.py)."""
    from online_rl.models import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("learnable"), embedded_model, seed=0,
                            prefer_single_characters=True)


def test_async_pipeline_within_the_bound_learns_as_the_synchronous_one(learnable_model: Path,
                                                                     ray_runtime: None,
                                                                     tmp_path: Path) -> None:
    """The same budget of 10 iterations, the same prompts and seeds, rewarded for letters and digits:
    an lr = 0 control, the synchronous pipeline and the asynchronous one with max_staleness 2 (the
    decoupled-PPO correction on). The asynchronous run samples two batches ahead (staleness 0, 1, then
    exactly 2, each batch's behaviour log-probs then differing from the policy's), and it still ends
    within 0.1 of the synchronous run's reward, both well above the control."""
    steps, lr = 10, 5e-3
    control, _ = _learn(_flow(learnable_model, tmp_path, "control", "alphanumeric", learning_rate=0.0), steps)
    sync, _ = _learn(_flow(learnable_model, tmp_path, "sync", "alphanumeric", learning_rate=lr), steps)
    pipelined, runs = _learn(_flow(learnable_model, tmp_path, "async", "alphanumeric", learning_rate=lr,
                                   max_staleness=2), steps)
    assert [m["staleness"] for m in runs] == [0, 1] + [2] * (steps - 2)
    assert all("ppo_loss" in m for m in runs)
    assert runs[0]["behaviour_gap"] < 1e-3 < max(m["behaviour_gap"] for m in runs)

    def last(rewards: list[float]) -> float:
        return sum(rewards[-3:]) / 3

    print(f"control {control}\nsync {sync}\nasync {pipelined}")
    assert last(sync) > last(control) + 0.2, (sync, control)
    assert last(pipelined) > last(control) + 0.2, (pipelined, control)
    assert abs(last(pipelined) - last(sync)) <= 0.1, (pipelined, sync)


def test_batches_older_than_the_bound_are_dropped_when_so_configured(
        tiny_model: Path, ray_runtime: None, tmp_path: Path) -> None:
    """Sampling three batches ahead with max_staleness 1 and `stale: drop`: the batches that would train
    two or three versions late are dropped (counted) and nothing older than the bound trains."""
    _, runs = _learn(_flow(tiny_model, tmp_path, "drop", max_staleness=1, rollout_ahead=3, stale="drop"), 6)
    assert all(m["staleness"] <= 1 for m in runs)
    assert sum(m["dropped_batches"] for m in runs) > 0
    assert all(m["behaviour_gap"] >= 0 for m in runs if "behaviour_gap" in m)
