"""The off-policy gate's scorer: how likely a registered version is to write the champion's logged
answers, and the estimate that follows.

For each logged champion answer (a joined sample with the champion's per-token log-probabilities
and a reward users gave), the challenger's sequence log-probability is computed on this host: the
base model with the challenger's adapter applied by the serving code's `MultiLora` (the same LoRA
maths the replicas run, `lm_head` adapters included). Then `snips` re-weights the rewards, and the
mean log-ratio over the logged answers estimates KL(champion || challenger), which the KL guardrail
uses. Log-probabilities are the model's own (temperature 1), as the engines log them.

Knows transformers, MLflow's artifacts and the serving adapter code; nothing about HTTP or rollouts.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.events import TrainingSample
from online_rl.registry import adapter_files, write_folder
from online_rl.rollout.offpolicy import OffPolicyEstimate, snips

if TYPE_CHECKING:
    from mlflow import MlflowClient

__all__ = ["LogprobScorer"]

logger = logging.getLogger(__name__)


class LogprobScorer:
    """Scores logged answers under registered versions of `registered_model` (the base model is
    loaded once, at the first call)."""

    def __init__(self, model_dir: Path, client: MlflowClient, registered_model: str) -> None:
        self.model_dir = Path(model_dir)
        self.client = client
        self.registered = registered_model
        self._model: Any = None
        self._lora: Any = None
        self._lock = threading.Lock()

    def _load(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from online_rl.serving.multi_lora import MultiLora

        self._model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=torch.float32).eval()
        self._lora = MultiLora(self._model)

    def __call__(self, serving_name: str, samples: list[TrainingSample]) -> OffPolicyEstimate:
        """The SNIPS estimate of `serving_name`'s reward (`<registered>-v<n>`) from `samples`."""
        import torch

        from online_rl.algos import completion_logprobs
        from online_rl.serving.multi_lora import MultiLora

        version = serving_name.removeprefix(f"{self.registered}-v")
        if not version.isdigit():
            raise ValueError(f"{serving_name!r} is not a version of {self.registered!r} (<name>-v<number>)")
        logged = [s for s in samples if s.completion is not None and s.reward is not None]
        with self._lock, tempfile.TemporaryDirectory(prefix="orl-gate-") as tmp:
            if self._model is None:
                self._load()
            write_folder(tmp, adapter_files(self.client, self.registered, version))
            self._lora.install(serving_name, MultiLora.prepare(Path(tmp)))
            try:
                targets = []
                with torch.inference_mode():
                    for sample in logged:
                        assert sample.completion is not None
                        with self._lora.route([serving_name]):
                            lp = completion_logprobs(self._model, sample.prompt_token_ids,
                                                     sample.completion.token_ids)
                        targets.append(float(lp.sum()))
            finally:
                self._lora.remove(serving_name)
        behaviour = [sum(s.completion.logprobs) for s in logged if s.completion is not None]
        rewards = [float(s.reward) for s in logged if s.reward is not None]
        estimate = snips(rewards, targets, behaviour)
        kl = sum(b - t for b, t in zip(behaviour, targets, strict=True)) / len(logged)
        logger.info("scored %d logged answers under %s: SNIPS %.3f, KL(champion||challenger) %.3f",
                    len(logged), serving_name, estimate.value, kl)
        return OffPolicyEstimate(estimate.value, estimate.logged_value, estimate.effective_samples,
                                 estimate.samples, kl)
