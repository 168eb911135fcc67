"""Worker specs: what the settings say reaches every worker, typed, in one derivation."""

from __future__ import annotations

import pickle
import re
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from online_rl.algos import DPOConfig, KLControlConfig, PPOConfig
from online_rl.algos.policy import LoraSpec
from online_rl.config import Settings
from online_rl.trainer.spec import build_lora, hybrid_specs, trainer_specs
from tests.conftest import TINY_NAME

ROOT = Path(__file__).resolve().parents[2]


def test_the_trainer_settings_reach_the_policy_and_critic_specs() -> None:
    settings = Settings(trainer={  # type: ignore[arg-type]
        "learning_rate": 3e-4, "beta": 0.25, "lora_rank": 4, "lora_alpha": 12, "lora_targets": ["q_proj"],
        "seed": 7, "ppo_epochs": 3, "kl_coef": 0.2, "kl_target": 4.0, "critic_learning_rate": 2e-4,
        "cold_start_kl_coef": 0.5, "precision": "bf16"})
    policy, critic = trainer_specs(settings)
    assert policy.model.lora == LoraSpec(rank=4, alpha=12, targets=("q_proj",))
    assert (policy.model.seed, policy.model.precision, policy.model.model_dir) == (7, "bf16",
                                                                                  str(settings.model_dir))
    assert (policy.learning_rate, policy.epochs, policy.anchor_kl_coef) == (3e-4, 3, 0.5)
    assert policy.dpo.beta == policy.kto.beta == 0.25
    assert (policy.ppo.kl.coef, policy.ppo.kl.target) == (0.2, 4.0)
    assert critic.model == policy.model and critic.ppo == policy.ppo
    assert (critic.learning_rate, critic.epochs) == (2e-4, 3)


def test_the_hybrid_specs_take_the_adapter_from_trainer_and_the_rest_from_hybrid() -> None:
    settings = Settings(trainer={"lora_rank": 4, "seed": 3},  # type: ignore[arg-type]
                        hybrid={"learning_rate": 1e-3, "ppo_epochs": 1, "kl_coef": 0.1,  # type: ignore[arg-type]
                                "kl_target": 1.0, "kl_horizon": 32, "reward_window": 64, "reward_batch": 4,
                                "reward_learning_rate": 5e-4, "aligned": False, "behaviour_cap": 1.5,
                                "critic_free": {"estimator": "grpo", "clip_low": 0.2, "clip_high": 0.28,
                                                "loss_aggregation": "seq-mean-token-mean"}},
                        mlflow={"registered_model": "chat-policy"})  # type: ignore[arg-type]
    policy, critic, reward = hybrid_specs(settings)
    assert policy.model.lora.rank == 4 and policy.model.seed == 3
    assert (policy.learning_rate, policy.epochs, policy.aligned, policy.adapter_prefix) == (
        1e-3, 1, False, "chat-policy")
    assert policy.ppo.kl == KLControlConfig(coef=0.1, target=1.0, horizon=32)
    assert (policy.ppo.clip_low, policy.ppo.clip_high, policy.ppo.aggregation) == (
        0.2, 0.28, "seq-mean-token-mean")
    assert policy.ppo.behaviour_cap == 1.5
    assert critic.ppo == policy.ppo
    assert (reward.learning_rate, reward.window, reward.batch) == (5e-4, 64, 4)


def test_specs_are_frozen_and_cross_a_process_boundary_intact() -> None:
    policy, critic = trainer_specs(Settings())
    with pytest.raises(FrozenInstanceError):
        policy.learning_rate = 1.0  # type: ignore[misc]
    assert pickle.loads(pickle.dumps((policy, critic))) == (policy, critic)


def test_the_settings_defaults_are_the_algorithms_own() -> None:
    """A default a user may change is written once: the settings take it from online_rl/algos."""
    settings = Settings()
    policy, _ = trainer_specs(settings)
    assert policy.dpo == DPOConfig() and policy.kto.beta == DPOConfig().beta
    assert policy.model.lora == LoraSpec()
    assert policy.ppo.kl.coef == KLControlConfig().coef == settings.hybrid.kl_coef
    assert hybrid_specs(settings)[0].ppo.behaviour_cap == PPOConfig().behaviour_cap


def test_an_unresolved_precision_is_refused_before_anything_loads(tiny_model: Path) -> None:
    settings = Settings(model={"name": TINY_NAME, "path": tiny_model},  # type: ignore[arg-type]
                        trainer={"precision": "auto"})  # type: ignore[arg-type]
    policy, _ = trainer_specs(settings)
    assert policy.model.precision == "auto"
    with pytest.raises(ValueError, match="still `auto`: resolve it"):
        build_lora(policy.model, "policy")
    model, config = build_lora(policy.model.resolved("fp32"), "policy")
    assert config.vocab_size > 0 and any(p.requires_grad for p in model.parameters())


def test_no_worker_reads_its_settings_by_string_key() -> None:
    """The issue's check: `grep -rn 'config\\["' online_rl/` finds nothing in the trainer or hybrid."""
    pattern = re.compile(r'config\["')
    found = [f"{path.relative_to(ROOT)}:{n}" for folder in ("trainer", "hybrid")
             for path in sorted((ROOT / "online_rl" / folder).glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
