"""Measuring what the loop learns: simulated users with one taste of the preference suite feed the real
bus, joiner and trainer; every version the trainer publishes is measured on held-out prompts.

A run goes in rounds. Each round the users ask the suite's training prompts of their topics and the
newest version answers (the canary bypassed: each version serves the next round at once, as if
promoted); their feedback (thumbs, ratings or pairwise, with noise and silent users as in
`Population`) goes to the bus beside the interactions, exactly as the inference service and the
feedback API write them; the joiner joins them into samples; the trainer trains on them and, once it
has read the round's samples, publishes a version to MLflow. That version is downloaded from MLflow,
loaded into the serving engine (as a replica does) and measured: its liked rate on the held-out prompts
of the taste's topics (the share of answers the users' taste scores 0.5 or more, noise-free), with the
same sampling seeds for every version and every run. The general-ability check (8 factual prompts,
temperature 0) runs on the final version.

`Lab` holds what a series of runs shares (the engine, the event loop, the Ray runtime, the bus); each
run has its own topics, consumer groups, checkpoints and registered model. `bench/learning.py` and
the learning tests drive it.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.config import Settings
from online_rl.events import Feedback, Interaction, Message, SamplingParams, encode
from online_rl.models.chat import user_turn_ids
from online_rl.simulate.errors import LearningError
from online_rl.simulate.population import FeedbackKind, Population
from online_rl.simulate.suite import SUITE, SuiteEntry

if TYPE_CHECKING:
    from online_rl.bus.topics import Topics

__all__ = ["Evaluation", "Lab", "LearnConfig", "LearnRun", "measure_base_rates", "other_answer"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LearnConfig:
    """One run's traffic and measurement."""

    events: int = 500  # feedback events the users send in the whole run
    rounds: int = 5  # versions published (one per round)
    kind: FeedbackKind = "thumbs"
    users: int = 32
    silent: float = 0.1
    noise: float = 0.1
    max_tokens: int = 48
    temperature: float = 0.7
    eval_samples: int = 4  # answers per held-out prompt per version
    facts: int | None = None  # the fact check's first this many facts (None: all) for the final version
    seed: int = 0
    round_timeout_s: float = 1800.0
    # a no-learning control that still trains: each user judges another user's answer of the same wave
    # and the feedback goes to their own, so labels keep their rate but say nothing about the answer
    shuffle_labels: bool = False

    def __post_init__(self) -> None:
        if self.events < self.rounds or self.rounds < 1:
            raise ValueError(f"learning: events ({self.events}) must be at least rounds ({self.rounds}) >= 1")
        if self.eval_samples < 1:
            raise ValueError("learning: eval_samples must be at least 1")


@dataclass(frozen=True)
class Evaluation:
    """A policy measured on one taste's held-out prompts."""

    liked_rate: float  # share of answers scored 0.5 or more
    mean_score: float
    answers: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "liked_rate": round(self.liked_rate, 4),
            "mean_score": round(self.mean_score, 4),
            "answers": self.answers,
        }


@dataclass
class LearnRun:
    """What one run learned: per published version, its evaluation and the feedback behind it."""

    preference: str
    learning_rate: float
    versions: list[dict[str, Any]] = field(default_factory=list)
    feedback_events: int = 0
    liked_feedback: float = 0.0  # share of the feedback that was positive (0-1 scale)
    ability: int | None = None  # of the 8 general-ability prompts, the final version's correct answers
    ability_missed: dict[str, str] = field(default_factory=dict)  # prompt -> the final version's wrong answer
    refused: int = 0  # rounds whose version the trainer's ability gate refused (the last one served on)
    facts: list[bool] = field(default_factory=list)  # the final version on the fact check, per fact
    duration_s: float = 0.0
    final_adapter: str | None = None  # the engine-level name of the final version (still loaded)
    final_folder: Path | None = None  # the final version's adapter as downloaded from MLflow

    @property
    def final(self) -> Evaluation | None:
        return self.versions[-1]["evaluation"] if self.versions else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "preference": self.preference,
            "learning_rate": self.learning_rate,
            "feedback_events": self.feedback_events,
            "liked_feedback": round(self.liked_feedback, 4),
            "ability": self.ability,
            "ability_missed": self.ability_missed,
            "refused": self.refused,
            "duration_s": round(self.duration_s, 1),
            "versions": [
                {"version": v["version"], "samples": v["samples"], "refused": v.get("refused", False),
                 **v["evaluation"].as_dict()}
                for v in self.versions
            ],
        }


def other_answer(index: int, count: int, rng: random.Random) -> int:
    """For the shuffled-labels control: the answer, other than `index`, of `count` whose verdict is
    given for `index` (uniform over the others)."""
    if count < 2:
        raise ValueError("shuffled labels need at least two answers per wave")
    return (index + 1 + rng.randrange(count - 1)) % count


def _seed(*parts: object) -> int:
    import hashlib

    digest = hashlib.blake2b("\x00".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class _Iterations:
    """The rollout flow's iterations granted so far. That flow samples its own rollouts and would iterate
    between rounds as long as the machine lets it; a round grants `hybrid.publish_every_steps`
    iterations once the trainer has read the round's samples, and the flow publishes after the last,
    so every run trains as many iterations per feedback event on any machine."""

    def __init__(self, program: Any) -> None:
        self.program, self.granted = program, 0

    def node(self, step: Any) -> None:
        """A node after `observe`: a pass past the grant reads its samples and ends there."""
        if self.program.state.steps >= self.granted:
            step.counts = False
            step.stop()


@dataclass
class _Workers:
    """A run's joiner and trainer, each in a thread of its own; either failing stops both (`failures`
    says why). `iterations` is set for the rollout flow."""

    joiner: Any
    trainer: Any
    iterations: _Iterations | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    failures: list[BaseException] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._guarded(lambda: self.joiner.run(self.stop.is_set)), daemon=True),
            threading.Thread(target=self._guarded(lambda: self.trainer.run(stop=self.stop)), daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _guarded(self, target: Callable[[], object]) -> Callable[[], None]:
        def body() -> None:
            try:
                target()
            except BaseException as exc:  # reported by the round loop (`Lab.learn`)
                self.failures.append(exc)
                self.stop.set()

        return body

    def stop_and_join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
        self.joiner.close()


@dataclass
class _RunState:
    """What the rounds of one run carry from one to the next."""

    tag: str  # names the run's topics, groups, checkpoints, registered model and adapters
    settings: Settings
    topics: Topics
    rng: random.Random
    producer: Any
    run: LearnRun
    adapter: str | None = None  # the engine name of the version answering users
    behaviour: str | None = None  # its serving name, recorded on each interaction
    liked: float = 0.0  # the reward sum of the feedback sent
    sample_ends: dict[Any, int] = field(default_factory=dict)  # offset after each partition's last sample


class Lab:
    """The shared pieces of a series of learning runs on `settings` (its bus, MLflow store, Ray runtime
    and model); `engine` names the serving engine that answers (default: `inference.engine`)."""

    def __init__(self, settings: Settings, engine: str | None = None) -> None:
        from transformers import AutoTokenizer

        from online_rl.bus import open_bus
        from online_rl.serving.factory import build_engine

        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.engine = build_engine(
            settings.model_dir, settings.inference, engine, cache_dir=settings.cache_dir
        )
        self.loop.run_until_complete(self.engine.start())
        self.tokenizer = AutoTokenizer.from_pretrained(str(settings.model_dir))
        self.bus = open_bus(settings)
        self.workdir = Path(tempfile.mkdtemp(prefix="orl-learning-"))
        self._prompt_ids: dict[str, list[int]] = {}

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.engine.close())
        finally:
            self.loop.close()
            self.bus.close()
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- generation --------------------------------------------------------------------------------
    def prompt_ids(self, prompt: str) -> list[int]:
        if prompt not in self._prompt_ids:
            self._prompt_ids[prompt] = user_turn_ids(self.tokenizer, prompt)
        return self._prompt_ids[prompt]

    def complete(
        self,
        prompts: Sequence[str],
        seeds: Sequence[int],
        adapter: str | None,
        temperature: float,
        max_tokens: int,
    ) -> list[tuple[str, list[int], list[float], str]]:
        """(text, token ids, log-probabilities, finish reason) for each prompt, by the engine."""
        from online_rl.serving.engine import GenerationRequest

        async def one(prompt: str, seed: int) -> tuple[str, list[int], list[float], str]:
            sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
            request = GenerationRequest(uuid.uuid4().hex, self.prompt_ids(prompt), sampling, adapter)
            ids: list[int] = []
            logprobs: list[float] = []
            finish = "length"
            async for delta in self.engine.generate(request):
                ids += delta.token_ids
                logprobs += delta.logprobs
                finish = delta.finish_reason or finish
            return str(self.tokenizer.decode(ids, skip_special_tokens=True)), ids, logprobs, finish

        async def run() -> list[tuple[str, list[int], list[float], str]]:
            return list(await asyncio.gather(*(one(p, s) for p, s in zip(prompts, seeds, strict=True))))

        return self.loop.run_until_complete(run())

    def evaluate(
        self,
        entry: SuiteEntry,
        adapter: str | None,
        samples: int = 4,
        seed: int = 0,
        temperature: float = 0.7,
        max_tokens: int = 48,
    ) -> Evaluation:
        """`adapter` (None: the base) on `entry`'s held-out prompts, `samples` answers each, with seeds
        that depend only on the prompt, the sample index and `seed` (the same for every version)."""
        prompts = [p for p in entry.prompts("eval") for _ in range(samples)]
        seeds = [_seed(seed, p, i % samples) for i, p in enumerate(prompts)]
        answers = self.complete(prompts, seeds, adapter, temperature, max_tokens)
        scores = [entry.preference.score(p, a[0]) for p, a in zip(prompts, answers, strict=True)]
        return Evaluation(sum(s >= 0.5 for s in scores) / len(scores), statistics.fmean(scores), len(scores))

    def ability(self, adapter: str | None) -> int:
        """How many of the demo's 8 general-ability prompts `adapter` answers correctly (temperature 0)."""
        from online_rl.demo.report import ABILITY_PROMPTS

        return len(ABILITY_PROMPTS) - len(self.ability_missed(adapter))

    def ability_missed(self, adapter: str | None) -> dict[str, str]:
        """The demo's general-ability prompts `adapter` answers wrongly (temperature 0), with its answers:
        which facts a version lost, not only how many."""
        from online_rl.demo.report import ABILITY_PROMPTS, correct

        answers = self.complete([p for p, _ in ABILITY_PROMPTS], [0] * len(ABILITY_PROMPTS), adapter, 0.0, 48)
        return {prompt: a[0] for a, (prompt, accepted) in zip(answers, ABILITY_PROMPTS, strict=True)
                if not correct(a[0], accepted)}

    def facts(self, adapter: str | None, count: int | None = None) -> list[bool]:
        """Which of the fact check's prompts (`online_rl.simulate.facts.FACT_CHECK`) `adapter` answers
        correctly (temperature 0, 48 tokens): forgetting measured on a couple of hundred facts rather than
        8, so that one fragile answer flipping does not decide it (`facts_kept`); `count`: the first this
        many facts only (a smoke run)."""
        from online_rl.simulate.facts import FACT_CHECK
        from online_rl.trainer.gate import probe_correct

        asked = FACT_CHECK[:count]
        answers = self.complete([f.prompt for f in asked], [0] * len(asked), adapter, 0.0, 48)
        return probe_correct(asked, [a[0] for a in answers])

    def load(self, name: str, folder: Path) -> None:
        self.loop.run_until_complete(self.engine.load_adapter(name, folder))

    def unload(self, name: str) -> None:
        self.loop.run_until_complete(self.engine.unload_adapter(name))

    # -- one run -----------------------------------------------------------------------------------
    def learn(
        self,
        entry: SuiteEntry,
        config: LearnConfig,
        learning_rate: float | None = None,
        label: str = "",
        progress: Callable[[str], None] | None = None,
    ) -> LearnRun:
        """Users with `entry`'s taste teach a fresh adapter (at `learning_rate`, default the trainer's);
        returns each published version's evaluation. The final version stays loaded in the engine
        (`LearnRun.final_adapter`) until `unload`."""
        from online_rl.ray_runtime import init_ray

        init_ray(self.settings)  # here, in the caller's thread: the run's trainer uses it from its own
        began = time.monotonic()
        name = label or entry.name
        tag = f"{name}-{uuid.uuid4().hex[:6]}"
        settings = self._run_settings(tag, learning_rate)
        workers = self._start_workers(settings, tag)
        population = Population(
            entry.preference,
            users=config.users,
            silent=config.silent,
            noise=config.noise,
            kind=config.kind,
            seed=config.seed,
        )
        state = _RunState(tag, settings, settings.topics, random.Random(config.seed), self.bus.producer(),
                          LearnRun(entry.name, settings.trainer.learning_rate))
        run = state.run
        try:
            for index in range(config.rounds):
                version, evaluation = self._learn_round(population, entry, config, state, workers, index)
                if progress is not None:
                    progress(
                        f"{name}: round {index + 1}/{config.rounds}: version {version} after "
                        f"{run.feedback_events} feedback events liked {evaluation.liked_rate:.3f}"
                    )
            from online_rl.demo.report import ABILITY_PROMPTS

            run.ability_missed = self.ability_missed(state.adapter)
            run.ability = len(ABILITY_PROMPTS) - len(run.ability_missed)
            run.facts = self.facts(state.adapter, config.facts)
        except BaseException:
            if state.adapter is not None:
                self.unload(state.adapter)
            raise
        finally:
            workers.stop_and_join()
            state.producer.close()
        if workers.failures:
            failure = workers.failures[0]
            raise LearningError(f"{name}: a component stopped: {failure!r}") from failure
        run.final_adapter = state.adapter
        run.liked_feedback = state.liked / run.feedback_events if run.feedback_events else 0.0
        run.duration_s = time.monotonic() - began
        return run

    def _run_settings(self, tag: str, learning_rate: float | None) -> Settings:
        """The lab's settings with the run's own topics, consumer group, checkpoints and registered
        model; the trainer publishes only when asked (`_publish`)."""
        trainer_update: dict[str, Any] = {
            "checkpoint_dir": self.workdir / tag / "checkpoints",
            "group_id": f"learn-{tag}",
            "publish_every_samples": 1 << 30,
            "publish_every_s": 1e9,
        }
        hybrid_update: dict[str, Any] = {"group_id": f"learn-{tag}"}  # the rollout flow's consumer group
        if learning_rate is not None:
            trainer_update["learning_rate"] = learning_rate
            hybrid_update["learning_rate"] = learning_rate
        return self.settings.model_copy(
            update={
                "bus": self.settings.bus.model_copy(update={"topic_prefix": f"learn.{tag}"}),
                "trainer": self.settings.trainer.model_copy(update=trainer_update),
                "hybrid": self.settings.hybrid.model_copy(update=hybrid_update),
                "mlflow": self.settings.mlflow.model_copy(update={"registered_model": f"learn-{tag}"}),
            }
        )

    def _start_workers(self, settings: Settings, tag: str) -> _Workers:
        """The run's topics made, its joiner and trainer started, each in a thread of its own."""
        from online_rl.bus.topics import ensure_topics
        from online_rl.stream import JoinConfig, Joiner
        from online_rl.trainer import Trainer

        topics = settings.topics
        ensure_topics(self.bus, topics, settings.bus.partitions)
        join = settings.join
        joiner = Joiner(
            self.bus,
            JoinConfig(
                window_s=join.window_s,
                aggregation=join.aggregation,
                default_reward=None,
                retention_s=max(join.retention_s, join.window_s),
                max_clock_skew_s=join.max_clock_skew_s,
                max_feedback_per_request=join.max_feedback_per_request,
            ),
            group_id=f"learn-join-{tag}",
            transactional_id=f"learn-join-{tag}",
            topics=topics,
        )
        trainer = Trainer(settings, self.bus)
        workers = _Workers(joiner, trainer)
        if trainer.rollout is not None:  # the rollout flow: iterations granted round by round
            workers.iterations = _Iterations(trainer.rollout)
            trainer.flow.add("iterations", workers.iterations.node, after="observe")
        workers.start()
        return workers

    def _learn_round(
        self,
        population: Population,
        entry: SuiteEntry,
        config: LearnConfig,
        state: _RunState,
        workers: _Workers,
        index: int,
    ) -> tuple[int | None, Evaluation]:
        """Round `index`: the users' traffic (collect), the joiner's samples (join), the trainer's new
        version (publish), served in place of the last one (serve) and measured (evaluate)."""
        run = state.run
        quota = config.events * (index + 1) // config.rounds - run.feedback_events
        sent, liked_now = self._round(population, entry, config, state, quota)  # collect
        run.feedback_events += sent
        state.liked += liked_now
        state.sample_ends = self._wait_for_samples(  # join
            state.topics.samples, run.feedback_events, state.sample_ends, workers.stop, workers.failures,
            config.round_timeout_s,
        )
        if workers.iterations is not None:  # publish
            published = self._publish_rollout(
                workers.iterations, state.settings.hybrid.publish_every_steps, state.sample_ends,
                workers.stop, workers.failures, config.round_timeout_s,
            )
        else:
            published = self._publish(
                workers.trainer, state.sample_ends, workers.stop, workers.failures, config.round_timeout_s
            )
        if published is None:  # the ability gate refused it: the last version serves on
            run.refused += 1
            previous = run.versions[-1] if run.versions else None
            evaluation = previous["evaluation"] if previous is not None else self.evaluate(
                entry, None, config.eval_samples, config.seed, config.temperature, config.max_tokens
            )
            version = previous["version"] if previous is not None else None
        else:
            self._serve(state, published)  # serve
            evaluation = self.evaluate(  # evaluate
                entry, state.adapter, config.eval_samples, config.seed, config.temperature, config.max_tokens
            )
            version = published.version
        run.versions.append({"version": version, "samples": run.feedback_events, "evaluation": evaluation,
                             "refused": published is None})
        return version, evaluation

    def _serve(self, state: _RunState, published: Any) -> None:
        """The `published` version downloaded from MLflow and loaded; the one it replaces unloaded."""
        from online_rl.registry import download_version

        folder = self.workdir / state.tag / f"v{published.version}"
        path = download_version(
            state.settings.mlflow_tracking_uri, published.registered_model, published.version, folder
        )
        name = f"{state.tag}-v{published.version}"
        self.load(name, path)
        state.run.final_folder = path
        if state.adapter is not None:
            self.unload(state.adapter)
        state.adapter, state.behaviour = name, published.serving_name

    def _round(
        self, population: Population, entry: SuiteEntry, config: LearnConfig, state: _RunState, quota: int
    ) -> tuple[int, float]:
        """Users ask and judge until `quota` feedback events are on the bus; (events, their reward sum)."""
        from online_rl.simulate.runner import feedback_reward

        prompts = entry.prompts("train")
        pairwise = config.kind == "pairwise"
        rng, producer = state.rng, state.producer
        sent, reward_sum = 0, 0.0
        while sent < quota:
            wave = [
                (rng.choice(population.ids), rng.choice(prompts), rng.getrandbits(62))
                for _ in range(16 if not pairwise else 8)
            ]
            asks = [
                (user, prompt, draw + copy)
                for user, prompt, draw in wave
                for copy in range(2 if pairwise else 1)
            ]
            answers = self.complete(
                [p for _, p, _ in asks],
                [s for _, _, s in asks],
                state.adapter,
                config.temperature,
                config.max_tokens,
            )
            per = 2 if pairwise else 1
            for i, (user, prompt, draw) in enumerate(wave):
                if sent >= quota:
                    break
                mine = answers[i * per : (i + 1) * per]
                ids = [uuid.uuid4().hex for _ in mine]
                self._log_interactions(state, config, user, prompt, ids, mine)
                judged = mine
                if config.shuffle_labels:  # another answer's verdict, sent for this one
                    other = other_answer(i, len(wave), rng)
                    judged = answers[other * per : (other + 1) * per]
                events = population.judge(
                    user, prompt, [(r, a[0]) for r, a in zip(ids, judged, strict=True)], random.Random(draw)
                )
                for event in events:
                    feedback = Feedback(event_id=uuid.uuid4().hex, created_at=time.time(), **event)
                    producer.produce(state.topics.feedback, encode(feedback), event["request_id"].encode())
                    reward_sum += feedback_reward(event, True)
                    sent += 1
            producer.flush()
        return sent, reward_sum

    def _log_interactions(
        self,
        state: _RunState,
        config: LearnConfig,
        user: str,
        prompt: str,
        ids: list[str],
        answers: list[tuple[str, list[int], list[float], str]],
    ) -> None:
        """`user`'s `answers` (request ids `ids`) onto the interactions topic, as the inference service
        logs them."""
        now = time.time()
        for request_id, (text, token_ids, logprobs, finish) in zip(ids, answers, strict=True):
            interaction = Interaction(
                request_id=request_id,
                user_id=user,
                created_at=now,
                model=state.settings.model.name,
                adapter_version=state.behaviour,
                sampling=SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens),
                prompt=[Message(role="user", content=prompt)],
                prompt_token_ids=self.prompt_ids(prompt),
                completion=text,
                completion_token_ids=token_ids,
                completion_logprobs=[max(v, -1e30) for v in logprobs],  # as serving logs them
                finish_reason=finish,
            )
            state.producer.produce(state.topics.interactions, encode(interaction), request_id.encode())

    def _wait_for_samples(
        self,
        topic: str,
        expected: int,
        previous: dict[Any, int],
        stop: threading.Event,
        failures: list[BaseException],
        timeout_s: float,
    ) -> dict[Any, int]:
        """Wait until the joiner has written `expected` samples in all; the offset after each
        partition's last sample."""
        deadline = time.monotonic() + timeout_s
        while True:
            ends: dict[Any, int] = {}
            count = 0
            for record in self.bus.read_all(topic):
                count += 1
                ends[record.tp] = max(ends.get(record.tp, 0), record.offset + 1)
            if count >= expected:
                return ends
            if stop.is_set() or time.monotonic() > deadline:
                raise LearningError(
                    f"the joiner wrote {count} of {expected} samples"
                    + (f" ({failures[0]!r})" if failures else "")
                )
            time.sleep(0.5)

    @staticmethod
    def _publish(
        trainer: Any,
        ends: dict[Any, int],
        stop: threading.Event,
        failures: list[BaseException],
        timeout_s: float,
    ) -> Any:
        """Once the trainer has read every sample up to `ends`, ask it to publish; the new version, or
        None when its ability gate refused it."""
        deadline = time.monotonic() + timeout_s
        requested = False
        published, refused = len(trainer.published), len(trainer.refused)
        while len(trainer.published) == published:
            if len(trainer.refused) > refused:
                return None
            state = trainer.state
            if (
                not requested
                and state is not None
                and all(state.offsets.get(tp, 0) >= end for tp, end in ends.items())
            ):
                trainer.request_publish()
                requested = True
            if stop.is_set() or time.monotonic() > deadline:
                raise LearningError(
                    f"the trainer did not publish version {published + 1}"
                    + (f" ({failures[0]!r})" if failures else "")
                )
            time.sleep(0.5)
        return trainer.published[-1]

    @staticmethod
    def _publish_rollout(
        iterations: _Iterations,
        steps: int,
        ends: dict[Any, int],
        stop: threading.Event,
        failures: list[BaseException],
        timeout_s: float,
    ) -> Any:
        """The rollout flow's version of `_publish`: once it has read every sample up to `ends`, grant
        it `steps` iterations; the version it publishes after them."""
        state = iterations.program.state
        deadline = time.monotonic() + timeout_s
        granted, published = False, len(state.published)
        while len(state.published) == published:
            if not granted and all(state.offsets.get(tp, 0) >= end for tp, end in ends.items()):
                iterations.granted += steps
                granted = True
            if stop.is_set() or time.monotonic() > deadline:
                raise LearningError(
                    f"the rollout flow did not publish version {published + 1} ({state.steps} iterations of "
                    f"{iterations.granted} granted)" + (f" ({failures[0]!r})" if failures else "")
                )
            time.sleep(0.5)
        return state.published[-1]


def measure_base_rates(samples: int = 3, settings: Settings | None = None) -> dict[str, float]:
    """Each suite preference's base rate on the configured model: `samples` answers per prompt of its
    topics (training and held-out halves), temperature 0.7, 48 tokens. Prints and returns them."""
    from online_rl.config import load_settings

    lab = Lab(settings or load_settings(), engine="transformers")
    try:
        out = {}
        for entry in SUITE:
            prompts = [p for split in ("train", "eval") for p in entry.prompts(split) for _ in range(samples)]
            seeds = [_seed("base-rate", p, i % samples) for i, p in enumerate(prompts)]
            answers = lab.complete(prompts, seeds, None, 0.7, 48)
            liked = [entry.preference.score(p, a[0]) >= 0.5 for p, a in zip(prompts, answers, strict=True)]
            out[entry.name] = round(sum(liked) / len(liked), 3)
            print(f"{entry.name:14s} {out[entry.name]:.3f}  ({len(liked)} answers)")
        return out
    finally:
        lab.close()
