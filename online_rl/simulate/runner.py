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
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from online_rl.errors import OnlineRLError
from online_rl.simulate.population import Population

if TYPE_CHECKING:
    import openai

    from online_rl.client import FeedbackClient

__all__ = ["PROMPTS", "Answer", "Served", "SimulationResult", "feedback_reward", "simulate"]

PROMPTS: tuple[str, ...] = (
    "What is the capital of France?", "Name a primary colour.", "What is 2 + 2?", "Say hello in Spanish.",
    "What do bees make?", "Which planet is known as the red planet?", "How many days are in a week?",
    "What is the boiling point of water in Celsius?", "Give me a word that rhymes with cat.",
    "What is the largest ocean on Earth?", "Who wrote Romeo and Juliet?", "What gas do plants breathe in?",
    "Name a fruit that is yellow.", "How many legs does a spider have?", "What is the opposite of hot?",
    "What language is spoken in Brazil?", "What is the freezing point of water in Celsius?",
    "Name a musical instrument with strings.", "What is the square root of 9?", "What colour is the sky?",
)


@dataclass(frozen=True)
class Answer:
    """One answer a simulated user got, and what they said of it."""

    at: float  # when the answer came back (time.time())
    user: str
    request_id: str
    version: str
    score: float  # the preference's score of the text, 0-1 (before noise and silence)
    reward: float | None = None  # the feedback on the 0-1 scale (thumbs 1/0, rating normalised,
    #                              pairwise: 1 if this answer won); None: the user said nothing
    feedback_at: float | None = None
    arm: str = ""  # the gateway's X-ORL-Arm: champion, challenger or holdout ("" when not through one)


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
    feedback_failed: int = 0  # answers whose feedback the API did not take (after its retries)
    versions: dict[str, Served] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "failed": self.failed, "feedback_failed": self.feedback_failed,
                "versions": {v: {"answers": s.answers, "mean_score": s.mean_score, "feedback": s.feedback}
                             for v, s in sorted(self.versions.items())}}


def feedback_reward(event: dict[str, Any], first: bool) -> float:
    """A feedback event on the 0-1 scale, for the answer it names first (`first`) or the other one."""
    if event["kind"] == "thumbs":
        return 1.0 if event["value"] > 0 else 0.0
    if event["kind"] == "rating":
        low, high = event["scale"]
        return (float(event["value"]) - low) / (high - low)
    return 1.0 if (event["winner"] == "this") == first else 0.0


def _draws(
    population: Population, prompts: list[str], requests: int | None
) -> Iterator[tuple[str, str, float]]:
    """(user, prompt, the user's judging seed) for each request, seeded by the population; endless when
    `requests` is None."""
    rng = random.Random(population.seed)
    sent = 0
    while requests is None or sent < requests:
        sent += 1
        yield rng.choice(population.ids), rng.choice(prompts), rng.random()


@dataclass
class _Run:
    """What the workers of one `simulate` share: the clients' settings, the requests still to send (under
    `items_lock`) and the result they fill (under `lock`)."""

    llm: openai.OpenAI
    population: Population
    items: Iterator[tuple[str, str, float]]
    result: SimulationResult
    max_tokens: int
    temperature: float
    progress: Callable[[int], None] | None
    stop: Callable[[], bool] | None
    items_lock: threading.Lock = field(default_factory=threading.Lock)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[Exception] = field(default_factory=list)

    def ask(self, user: str, prompt: str) -> tuple[str, str, str, str]:
        """(request id, text, the version that answered, the gateway's arm) of one answer."""
        raw = self.llm.chat.completions.with_raw_response.create(
            model="online-rl", user=user, max_tokens=self.max_tokens, temperature=self.temperature,
            messages=[{"role": "user", "content": prompt}])
        answer = raw.parse()
        version = raw.headers.get("x-orl-version", answer.model)
        return answer.id, answer.choices[0].message.content or "", version, raw.headers.get("x-orl-arm", "")

    def one(self, item: tuple[str, str, float], feedback: FeedbackClient) -> None:
        """One request: ask (twice for pairwise), judge, send the feedback, record it all."""
        import openai

        user, prompt, draw = item
        try:
            asked = [self.ask(user, prompt) for _ in range(2 if self.population.kind == "pairwise" else 1)]
        except openai.OpenAIError:
            with self.lock:
                self.result.requests += 1
                self.result.failed += 1
            return
        answered_at = time.time()
        events = self.population.judge(user, prompt, [(a[0], a[1]) for a in asked], random.Random(draw))
        try:
            for event in events:
                feedback.send(event)
        except (OnlineRLError, httpx.HTTPError):
            with self.lock:
                self.result.feedback_failed += 1
            events = []
        self.record(user, prompt, asked, events, answered_at, time.time() if events else None)
        if self.progress is not None:
            self.progress(1)

    def record(self, user: str, prompt: str, asked: list[tuple[str, str, str, str]],
               events: list[dict[str, Any]], answered_at: float, sent_at: float | None) -> None:
        """Count a request's answers under the versions that gave them, with the feedback sent on them."""
        result = self.result
        with self.lock:
            result.requests += 1
            for index, (request_id, text, version, arm) in enumerate(asked):
                score = self.population.preference.score(prompt, text)
                served = result.versions.setdefault(version, Served())
                served.answers += 1
                served.score_total += score
                reward = feedback_reward(events[0], index == 0) if events else None
                result.answers.append(Answer(answered_at, user, request_id, version, score, reward, sent_at,
                                             arm))
            if events:
                result.versions[asked[0][2]].feedback += len(events)

    def worker(self, feedback: FeedbackClient) -> None:
        """Send requests until none is left, `stop()` says so or another worker failed."""
        while (self.stop is None or not self.stop()) and not self.errors:
            with self.items_lock:
                item = next(self.items, None)
            if item is None:
                return
            try:
                self.one(item, feedback)
            except Exception as exc:  # re-raised by simulate() once every worker has stopped
                self.errors.append(exc)


def simulate(gateway_url: str, feedback_url: str, api_key: str, population: Population, requests: int | None,
             prompts: Sequence[str] = PROMPTS, concurrency: int = 4, max_tokens: int = 32,
             temperature: float = 0.7, progress: Callable[[int], None] | None = None,
             stop: Callable[[], bool] | None = None,
             result: SimulationResult | None = None) -> SimulationResult:
    """Send `requests` prompts from the population (None: until `stop()` says so; pairwise: two answers
    per request) and their feedback; `progress(n)` is called as answers come back. Pass `result` to
    watch it fill from another thread (read it under no lock: counters only grow)."""
    import openai

    from online_rl.client import FeedbackClient

    if (requests is not None and requests < 1) or (requests is None and stop is None) or not prompts:
        raise ValueError("simulate needs at least one request (or a stop condition) and one prompt")
    llm = openai.OpenAI(base_url=gateway_url.rstrip("/") + "/v1", api_key=api_key, max_retries=2)
    run = _Run(llm, population, _draws(population, list(prompts), requests),
               result if result is not None else SimulationResult(), max_tokens, temperature, progress, stop)
    with FeedbackClient(feedback_url, api_key) as feedback:
        threads = [threading.Thread(target=run.worker, args=(feedback,), daemon=True)
                   for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    llm.close()
    if run.errors:
        raise run.errors[0]
    return run.result
