"""Running the population against the deployment: prompts through the gateway, feedback to the API.

Each request picks a user and a prompt (seeded), asks the gateway with the `openai` client (the
user id in `user`, so the canary split is sticky on it), reads which version answered
(`X-ORL-Version`), and the user's feedback goes to the feedback API. The run's record per version —
answers served, their mean preference score (the reward the users' taste gives, before noise and
silence), feedback sent — is what a report plots. Knows the OpenAI and feedback HTTP APIs; nothing
about training or rollouts.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from online_rl.simulate.population import Population

__all__ = ["PROMPTS", "Served", "SimulationResult", "simulate"]

PROMPTS: tuple[str, ...] = (
    "What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Say hello in Spanish.",
    "What do bees make?", "Which planet is known as the red planet?", "How many days are in a week?",
    "What is the boiling point of water in Celsius?", "Give me a word that rhymes with cat.",
    "What is the largest ocean on Earth?", "Who wrote Romeo and Juliet?", "What gas do plants breathe in?",
    "Name a fruit that is yellow.", "How many legs does a spider have?", "What is the opposite of hot?",
    "What language is spoken in Brazil?", "What is the freezing point of water in Celsius?",
    "Name a musical instrument with strings.", "What is the square root of 9?", "What colour is the sky?",
)


@dataclass
class Served:
    """One version's share of the run."""

    answers: int = 0
    score_total: float = 0.0
    feedback: int = 0

    @property
    def mean_score(self) -> float | None:
        return self.score_total / self.answers if self.answers else None


@dataclass
class SimulationResult:
    requests: int = 0
    failed: int = 0
    versions: dict[str, Served] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed": self.failed,
                "versions": {v: {"answers": s.answers, "mean_score": s.mean_score, "feedback": s.feedback}
                             for v, s in sorted(self.versions.items())}}


def simulate(gateway_url: str, feedback_url: str, api_key: str, population: Population, requests: int,
             prompts: Sequence[str] = PROMPTS, concurrency: int = 4, max_tokens: int = 32,
             temperature: float = 0.7, progress: Callable[[int], None] | None = None) -> SimulationResult:
    """Send `requests` prompts from the population (pairwise: two answers per request) and their
    feedback; `progress(n)` is called as answers come back."""
    import openai

    from online_rl.client import FeedbackClient

    if requests < 1 or not prompts:
        raise ValueError("simulate needs at least one request and one prompt")
    llm = openai.OpenAI(base_url=gateway_url.rstrip("/") + "/v1", api_key=api_key, max_retries=2)
    rng = random.Random(population.seed)
    plan = [(rng.choice(population.ids), rng.choice(list(prompts)), rng.random()) for _ in range(requests)]
    result, lock = SimulationResult(), threading.Lock()

    def ask(user: str, prompt: str) -> tuple[str, str, str]:
        raw = llm.chat.completions.with_raw_response.create(
            model="online-rl", user=user, max_tokens=max_tokens, temperature=temperature,
            messages=[{"role": "user", "content": prompt}])
        answer = raw.parse()
        version = raw.headers.get("x-orl-version", answer.model)
        return answer.id, answer.choices[0].message.content or "", version

    def one(item: tuple[str, str, float], feedback: FeedbackClient) -> None:
        user, prompt, draw = item
        try:
            asked = [ask(user, prompt) for _ in range(2 if population.kind == "pairwise" else 1)]
        except openai.OpenAIError:
            with lock:
                result.requests += 1
                result.failed += 1
            return
        events = population.judge(user, prompt, [(rid, text) for rid, text, _ in asked], random.Random(draw))
        for event in events:
            feedback.send(event)
        with lock:
            result.requests += 1
            for _, text, version in asked:
                served = result.versions.setdefault(version, Served())
                served.answers += 1
                served.score_total += population.preference.score(prompt, text)
            if events:
                result.versions[asked[0][2]].feedback += len(events)
        if progress is not None:
            progress(1)

    with FeedbackClient(feedback_url, api_key) as feedback, ThreadPoolExecutor(concurrency) as pool:
        for done in pool.map(lambda item: one(item, feedback), plan):
            del done
    llm.close()
    return result
