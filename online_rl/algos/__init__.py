"""The mathematics of learning from feedback: losses, advantages and log-probabilities.

Pure torch, kept free of Ray, Kafka and MLflow so it can be read and tested on its own: DPO/IPO for
preference pairs, KTO for thumbs, PPO (GAE, clipped losses, KL control) for scalar rewards, GRPO, RLOO
and REINFORCE++ (critic-free advantages from groups of answers), a Bradley-Terry reward model, and the
padding-free log-probability computation they all share.
"""

from online_rl.algos.config import (
    CriticFreeConfig,
    DPOConfig,
    KLControlConfig,
    KTOConfig,
    PPOConfig,
    RewardModelConfig,
)
from online_rl.algos.critic_free import (
    CriticFreeBatch,
    critic_free_advantages,
    critic_free_loss,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    zero_variance_groups,
)
from online_rl.algos.dpo import PreferenceLoss, dpo_loss
from online_rl.algos.kto import KTOLoss, balanced_weights, kto_loss, kto_reference_point, mismatched_pairs
from online_rl.algos.logprobs import (
    PackedBatch,
    PolicyOutput,
    Sample,
    causal_lm,
    completion_logprobs,
    forward,
    hidden_states,
    pack,
    reference_adapter_disabled,
    reference_policy,
)
from online_rl.algos.ops import aggregate, masked_mean, masked_whiten
from online_rl.algos.ppo import (
    AdaptiveKLController,
    Advantages,
    PolicyLoss,
    ValueLoss,
    entropy_from_logits,
    gae,
    kl_penalty,
    policy_loss,
    ppo_advantages,
    token_rewards,
    value_loss,
    whiten_advantages,
)
from online_rl.algos.reward_model import PairLoss, RewardModel, bradley_terry_loss, thumbs_loss

__all__ = [
    "AdaptiveKLController",
    "Advantages",
    "CriticFreeBatch",
    "CriticFreeConfig",
    "DPOConfig",
    "KLControlConfig",
    "KTOConfig",
    "KTOLoss",
    "PPOConfig",
    "PackedBatch",
    "PairLoss",
    "PolicyLoss",
    "PolicyOutput",
    "PreferenceLoss",
    "RewardModel",
    "RewardModelConfig",
    "Sample",
    "ValueLoss",
    "aggregate",
    "balanced_weights",
    "bradley_terry_loss",
    "causal_lm",
    "completion_logprobs",
    "critic_free_advantages",
    "critic_free_loss",
    "dpo_loss",
    "entropy_from_logits",
    "forward",
    "gae",
    "grpo_advantages",
    "hidden_states",
    "kl_penalty",
    "kto_loss",
    "kto_reference_point",
    "masked_mean",
    "masked_whiten",
    "mismatched_pairs",
    "pack",
    "policy_loss",
    "ppo_advantages",
    "reference_adapter_disabled",
    "reference_policy",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "thumbs_loss",
    "token_rewards",
    "value_loss",
    "whiten_advantages",
    "zero_variance_groups",
]
