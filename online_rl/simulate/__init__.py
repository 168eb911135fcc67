"""Simulated users for the local loop: a population with a declared taste (a preference plug-in),
noise and silent users, sending prompts through the gateway and feedback to the feedback API."""

from online_rl.simulate.errors import LearningError
from online_rl.simulate.population import FeedbackKind, Population
from online_rl.simulate.preferences import Format, Length, Phrase, Preference, load_preference
from online_rl.simulate.runner import PROMPTS, Answer, Served, SimulationResult, simulate

__all__ = [
    "PROMPTS",
    "Answer",
    "FeedbackKind",
    "Format",
    "LearningError",
    "Length",
    "Phrase",
    "Population",
    "Preference",
    "Served",
    "SimulationResult",
    "load_preference",
    "simulate",
]
