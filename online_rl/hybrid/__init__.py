"""HybridEngine: one set of devices trains the policy (FSDP) and generates with it (tensor parallel),
moving the weights between the two layouts by a plan with no redundant copy (HybridFlow's
3D-HybridEngine), and the colocated PPO loop that uses it on fresh rollouts scored by a reward model
learned from live preferences. See docs/hybrid.md.
"""

from online_rl.hybrid.layout import GenerationLayout, ParamSpec, TrainingLayout, llama_specs
from online_rl.hybrid.plan import (
    ReshardPlan,
    allgather_bytes,
    formula_allgather,
    formula_hybrid,
    plan_reshard,
)

__all__ = [
    "GenerationLayout",
    "ParamSpec",
    "ReshardPlan",
    "TrainingLayout",
    "allgather_bytes",
    "formula_allgather",
    "formula_hybrid",
    "llama_specs",
    "plan_reshard",
]
