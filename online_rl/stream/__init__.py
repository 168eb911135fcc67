"""Streams over the bus: the feedback join and the fluent Stream API."""

from online_rl.stream.api import Batch, Stream
from online_rl.stream.join import JoinConfig, JoinState
from online_rl.stream.joiner import Joiner, StepResult

__all__ = ["Batch", "JoinConfig", "JoinState", "Joiner", "StepResult", "Stream"]
