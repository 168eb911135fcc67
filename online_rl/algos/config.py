"""Settings of the learning algorithms: one frozen dataclass per algorithm, checked on creation.

Each field carries its meaning in `metadata["help"]`; a bad value raises `ConfigError` naming the
field and a value that works. These know nothing about the trainer that uses them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from online_rl.errors import ConfigError

__all__ = ["CriticFreeConfig", "DPOConfig", "KLControlConfig", "KTOConfig", "PPOConfig", "RewardModelConfig"]

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
KLEstimator = Literal["k1", "k2", "k3"]
Estimator = Literal["grpo", "rloo", "reinforce++", "reinforce++-baseline"]
CriticFreeAggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def _positive(owner: str, name: str, value: float, example: str) -> None:
    if not value > 0:
        raise ConfigError(f"{owner}.{name}={value} must be > 0, e.g. {example}")


def _within(owner: str, name: str, value: float, low: float, high: float, example: str) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{owner}.{name}={value} must lie in [{low}, {high}], e.g. {example}")


def _one_of(owner: str, name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{owner}.{name}={value!r} is not one of {', '.join(allowed)}")


@dataclass(frozen=True)
class DPOConfig:
    """Direct Preference Optimization on (chosen, rejected) pairs."""

    beta: float = field(default=0.1, metadata={"help": "Strength of the implicit KL anchor."})
    loss: Literal["sigmoid", "ipo"] = field(
        default="sigmoid", metadata={"help": "'sigmoid' (the DPO paper) or 'ipo' (squared, per token)."}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "Assumed fraction of flipped preferences (sigmoid only), in [0, 0.5)."}
    )

    def __post_init__(self) -> None:
        _positive("dpo", "beta", self.beta, "0.1")
        _one_of("dpo", "loss", self.loss, ("sigmoid", "ipo"))
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ConfigError(f"dpo.label_smoothing={self.label_smoothing} must lie in [0, 0.5), e.g. 0.0")
        if self.loss == "ipo" and self.label_smoothing:
            raise ConfigError("dpo.label_smoothing applies to loss 'sigmoid' only; set it to 0 for 'ipo'")


@dataclass(frozen=True)
class KTOConfig:
    """Kahneman-Tversky Optimization on unpaired thumbs up/down."""

    beta: float = field(default=0.1, metadata={"help": "Strength of the KL anchor to the reference."})
    desirable_weight: float = field(default=1.0, metadata={"help": "Weight of thumbs-up losses."})
    undesirable_weight: float = field(
        default=1.0, metadata={"help": "Weight of the losses on thumbs-down samples."}
    )

    def __post_init__(self) -> None:
        _positive("kto", "beta", self.beta, "0.1")
        _positive("kto", "desirable_weight", self.desirable_weight, "1.0")
        _positive("kto", "undesirable_weight", self.undesirable_weight, "1.0")


@dataclass(frozen=True)
class KLControlConfig:
    """The KL penalty coefficient, fixed or adapted towards a target KL (Ziegler et al., 2019)."""

    coef: float = field(default=0.05, metadata={"help": "Initial (or fixed) KL penalty coefficient, >= 0."})
    target: float | None = field(
        default=None, metadata={"help": "Target KL per sequence (nats); None keeps `coef` fixed."}
    )
    horizon: int = field(default=10_000, metadata={"help": "Samples over which the coefficient adapts."})

    def __post_init__(self) -> None:
        if not self.coef >= 0:
            raise ConfigError(f"kl.coef={self.coef} must be >= 0, e.g. 0.05")
        if self.target is not None:
            _positive("kl", "target", self.target, "6.0")
            if self.coef == 0:
                raise ConfigError("kl.coef must be > 0 when kl.target is set (0 cannot be scaled), e.g. 0.05")
        if self.horizon < 1:
            raise ConfigError(f"kl.horizon={self.horizon} must be >= 1, e.g. 10000")


@dataclass(frozen=True)
class PPOConfig:
    """Proximal Policy Optimization for tokens, learning from traffic another policy generated."""

    clip_low: float = field(default=0.2, metadata={"help": "Ratio clip below 1: r >= 1 - clip_low."})
    clip_high: float = field(default=0.2, metadata={"help": "Ratio clip above 1: r <= 1 + clip_high."})
    behaviour_cap: float = field(
        default=2.0,
        metadata={"help": "Truncation of the importance weight pi_old/pi_behaviour (>= 1): off-policy "
                  "live traffic is reweighted, but never by more than this."},
    )
    value_clip: float = field(default=0.2, metadata={"help": "Clip of the value step around the old value."})
    value_coef: float = field(default=0.5, metadata={"help": "Weight of the value loss in the total."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus (>= 0)."})
    gamma: float = field(default=1.0, metadata={"help": "Discount per token, in (0, 1]."})
    lam: float = field(default=0.95, metadata={"help": "GAE lambda, in [0, 1]."})
    kl_estimator: KLEstimator = field(
        default="k1", metadata={"help": "Per-token KL to the reference in the reward: k1, k2 or k3."}
    )
    kl: KLControlConfig = field(default_factory=KLControlConfig, metadata={"help": "KL penalty control."})
    aggregation: Aggregation = field(
        default="token-mean",
        metadata={"help": "token-mean, seq-mean-token-mean or seq-mean-token-sum."},
    )
    whiten_advantages: bool = field(default=True, metadata={"help": "Normalise advantages over the batch."})

    def __post_init__(self) -> None:
        _within("ppo", "clip_low", self.clip_low, 0.0, 1.0, "0.2")
        _positive("ppo", "clip_high", self.clip_high, "0.2")
        if not self.behaviour_cap >= 1.0:
            raise ConfigError(f"ppo.behaviour_cap={self.behaviour_cap} must be >= 1 (1 ignores the behaviour "
                              "policy's excess probability), e.g. 2.0")
        _positive("ppo", "value_clip", self.value_clip, "0.2")
        if not self.value_coef >= 0 or not self.entropy_coef >= 0:
            raise ConfigError("ppo.value_coef and ppo.entropy_coef must be >= 0, e.g. 0.5 and 0.0")
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"ppo.gamma={self.gamma} must lie in (0, 1], e.g. 1.0")
        _within("ppo", "lam", self.lam, 0.0, 1.0, "0.95")
        _one_of("ppo", "kl_estimator", self.kl_estimator, ("k1", "k2", "k3"))
        _one_of("ppo", "aggregation", self.aggregation,
                ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"))


@dataclass(frozen=True)
class RewardModelConfig:
    """A scalar reward head trained with the Bradley-Terry loss on preference pairs."""

    margin: float = field(default=0.0, metadata={"help": "Required reward gap chosen - rejected (>= 0)."})
    center_coef: float = field(
        default=0.0, metadata={"help": "Weight of mean((r_chosen + r_rejected)^2) (centring)."}
    )

    def __post_init__(self) -> None:
        if not self.margin >= 0:
            raise ConfigError(f"reward_model.margin={self.margin} must be >= 0, e.g. 0.0")
        if not self.center_coef >= 0:
            raise ConfigError(f"reward_model.center_coef={self.center_coef} must be >= 0, e.g. 0.01")


@dataclass(frozen=True)
class CriticFreeConfig:
    """GRPO, RLOO and REINFORCE++: advantages from the other answers, no value head."""

    estimator: Estimator = field(
        default="grpo", metadata={"help": "grpo, rloo, reinforce++ or reinforce++-baseline."}
    )
    group_size: int = field(
        default=4, metadata={"help": "Answers sampled per prompt (GRPO and RLOO need >= 2)."}
    )
    scale_rewards: Literal["group", "batch", "none"] = field(
        default="group",
        metadata={"help": "GRPO: divide by the group's std ('group'), the batch's ('batch') or not at all "
                  "('none', Dr. GRPO)."},
    )
    normalize: bool = field(default=False, metadata={"help": "RLOO: whiten the advantages over the batch."})
    drop_zero_variance: bool = field(
        default=True,
        metadata={"help": "Leave out groups whose answers all got the same reward (DAPO): no signal (GRPO, "
                  "and RLOO without a KL in the reward; the others' advantages are not 0 there)."},
    )
    clip_low: float = field(default=0.2, metadata={"help": "Ratio clip below 1: r >= 1 - clip_low."})
    clip_high: float = field(
        default=0.28,
        metadata={"help": "Ratio clip above 1 (DAPO's clip-higher: > clip_low keeps exploring)."},
    )
    loss_aggregation: CriticFreeAggregation = field(
        default="token-mean",
        metadata={"help": "token-mean (DAPO's token-level loss), seq-mean-token-mean (GRPO's paper) or "
                  "seq-mean-token-sum-norm (Dr. GRPO; divides by batch x max_tokens)."},
    )
    max_tokens: int = field(
        default=64, metadata={"help": "The constant of seq-mean-token-sum-norm: the longest answer sampled."}
    )
    ratio_level: Literal["token", "sequence"] = field(
        default="token",
        metadata={"help": "Clip each token's ratio ('token') or the answer's whole ratio exp(sum of token "
                  "log-ratios), one loss per answer ('sequence', RLOO's original form)."},
    )
    beta: float = field(
        default=0.0, metadata={"help": "Weight of the k3 KL to the reference inside the loss (GRPO), >= 0."}
    )
    kl_ratio_correction: bool = field(
        default=True,
        metadata={"help": "Weigh each token's KL term by its ratio pi/pi_old, so its gradient is the "
                  "unbiased reverse-KL gradient on tokens the old policy sampled (DeepSeek-V3.2; TRL's "
                  "default)."},
    )
    kl_coef: float = field(
        default=0.0,
        metadata={"help": "RLOO and REINFORCE++: weight of the k1 KL to the reference in the reward (summed "
                  "over the answer for RLOO, per token for REINFORCE++), >= 0."},
    )
    gamma: float = field(default=1.0, metadata={"help": "REINFORCE++: discount per token, in (0, 1]."})
    eps: float = field(default=1e-4, metadata={"help": "Added to the std before dividing."})

    def __post_init__(self) -> None:
        _one_of("critic_free", "estimator", self.estimator,
                ("grpo", "rloo", "reinforce++", "reinforce++-baseline"))
        _one_of("critic_free", "scale_rewards", self.scale_rewards, ("group", "batch", "none"))
        _one_of("critic_free", "ratio_level", self.ratio_level, ("token", "sequence"))
        _one_of("critic_free", "loss_aggregation", self.loss_aggregation,
                ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
        if self.group_size < 1 or (self.estimator in ("grpo", "rloo") and self.group_size < 2):
            raise ConfigError(f"critic_free.group_size={self.group_size}: {self.estimator} compares answers "
                              "to the same prompt, so it needs >= 2 per prompt, e.g. 4")
        _within("critic_free", "clip_low", self.clip_low, 0.0, 1.0, "0.2")
        _positive("critic_free", "clip_high", self.clip_high, "0.28")
        if self.max_tokens < 1:
            raise ConfigError(f"critic_free.max_tokens={self.max_tokens} must be >= 1, e.g. 64")
        if not self.beta >= 0 or not self.kl_coef >= 0:
            raise ConfigError("critic_free.beta and critic_free.kl_coef must be >= 0, e.g. 0.0 and 0.01")
        if not 0.0 < self.gamma <= 1.0:
            raise ConfigError(f"critic_free.gamma={self.gamma} must lie in (0, 1], e.g. 1.0")
        _positive("critic_free", "eps", self.eps, "1e-4")
