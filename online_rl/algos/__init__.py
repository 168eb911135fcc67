"""Learning algorithms as pure tensor functions (no Ray, Kafka or MLflow)."""

from online_rl.algos.logprobs import completion_logprobs

__all__ = ["completion_logprobs"]
