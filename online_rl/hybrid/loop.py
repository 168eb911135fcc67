"""Colocated PPO: the classic RLHF loop on the HybridEngine, driven by a reward model that keeps
learning from live preferences.

Each `step`: the reward model learns from the preference pairs that arrived; the actor devices switch
to generation (only the adapter moves after the first time), sample completions for prompts drawn
from the recent ones on the stream, switch back to training; the reward model scores the
completions, the actors give the policy's and the reference's log-probs, the critic its values;
GAE on KL-penalised rewards gives the advantages; the actors and the critic take their PPO steps; the
KL coefficient adapts towards its target. The driver holds no weights.

With `hybrid.critic_free` set there is no critic: each prompt gets `group_size` answers and GRPO, RLOO
or REINFORCE++ (`online_rl.algos.critic_free`) compares them with each other. Either way a rollout's
reward is the rule of `settings.rewards`: the reward model's score, reward functions written as code
(run out of process by `online_rl.flow.RewardFunctions`) and their gates. A rollout no function could
score is dropped from the step and its failures go to the dead-letter topic.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from online_rl.algos import AdaptiveKLController, critic_free_advantages
from online_rl.errors import ConfigError
from online_rl.flow import FEEDBACK, REWARD_MODEL, combine, dead_letter_failures
from online_rl.hybrid.group import HybridGroup
from online_rl.hybrid.pipeline import Batch, StalenessPipeline
from online_rl.trainer.ppo import advantages_for
from online_rl.trainer.spec import hybrid_specs

if TYPE_CHECKING:
    from online_rl.bus import Bus, DeadLetters
    from online_rl.config import Settings
    from online_rl.flow import RewardFunctions, RewardScores
    from online_rl.trainer.gate import ProbeItem

__all__ = ["ColocatedPPO"]

logger = logging.getLogger(__name__)

Pair = tuple[list[int], list[int], list[int]]
Thumb = tuple[list[int], list[int], bool]  # prompt, completion, thumbs-up


class ColocatedPPO:
    """The hybrid actor group, its critic and the reward model, driven as one loop."""

    def __init__(self, settings: Settings, bus: Bus | None = None) -> None:
        from online_rl.ray_runtime import init_ray

        self.critic: Any = None  # critic-free estimators need none
        self.reward: Any = None
        init_ray(settings)
        self.settings, self.config = settings, settings.hybrid
        self._rewards_setup(settings, bus)  # first: a reward function that cannot load takes no device
        try:
            self._rehearsal_setup(settings)  # before the workers: a bad set takes no device
            self._start_workers(settings)
        except BaseException:
            self.close()
            raise
        self.prompts: deque[tuple[int, ...]] = deque(maxlen=self.config.prompt_window)
        self.pending: list[Pair] = []
        self.pending_thumbs: list[Thumb] = []
        self.pairs_seen = 0
        self.thumbs_seen = 0
        self.steps = 0
        self.random = random.Random(settings.trainer.seed)
        self.sample_seed = settings.trainer.seed * 1_000_003  # each seed its own sampling (0: as before)
        self.last_sync: dict[str, Any] = {}
        self.updates = 0  # policy updates so far: the version a rollout batch is sampled with
        self.synced = -1  # the update count of the adapter the engine has
        self.submitted = 0
        self.pipeline: StalenessPipeline | None = None
        if self.config.engine == "vllm" and (self.config.max_staleness or self.config.rollout_ahead):
            self.pipeline = StalenessPipeline(self.config.max_staleness, self.config.rollout_ahead,
                                              self.config.stale)
        self.timeline: list[dict[str, Any]] = []  # per batch: when it was sampled and trained

    def _start_workers(self, settings: Settings) -> None:
        """The hybrid actor group, and on device 0's bundle the reward model (and the critic, for GAE)."""
        import ray

        from online_rl.hybrid.reward import RewardWorker
        from online_rl.ray_runtime import resolve_precision_on
        from online_rl.trainer.critic import CriticWorker

        policy, critic, reward = hybrid_specs(settings)
        free = settings.ray.num_cpus - (self.config.engine_cpus if self.config.engine == "vllm" else 0)
        cpus = self.config.cpus_per_worker or max(1.0, float(int(free) // self.config.world))
        self.group = HybridGroup(policy, self.config.dp, self.config.fsdp, self.config.tp,
                                 cpus, self.config.gpus_per_worker, cache_dir=settings.cache_dir)
        # the critic and the reward model time-share device 0's bundle, as verl colocates them
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        share = PlacementGroupSchedulingStrategy(self.group.placement, 0)
        device = "cpu"  # they share device 0's bundle, whose GPU (if any) the hybrid worker holds
        threads = max(1, int(cpus))
        self.precision = self.group.precision
        if self.config.gpus_per_worker:  # the policy's choice was the GPU's: theirs is the CPU's
            self.precision = resolve_precision_on(
                share, {"num_cpus": 0}, self.config.precision, device, str(settings.model_dir), threads,
                settings.cache_dir, "hybrid.precision (CPU)")
        if self.config.critic_free is None:
            self.critic = ray.remote(CriticWorker).options(num_cpus=0, scheduling_strategy=share).remote(
                critic.resolved(self.precision.precision), threads, device)
        if self.uses_reward_model:  # a rule of functions alone needs no reward model
            self.reward = ray.remote(RewardWorker).options(num_cpus=0, scheduling_strategy=share).remote(
                reward.resolved(self.precision.precision), threads, device)
        from online_rl.hybrid.generation import generation_for

        self.engine = generation_for(settings, self.group)
        self.ppo = policy.ppo
        self.kl = AdaptiveKLController(self.ppo.kl)
        self.kl_coef = self.config.kl_coef

    def _rewards_setup(self, settings: Settings, bus: Bus | None) -> None:
        """The rule that makes a rollout's reward, the reward functions' actor, the dead-letter topic."""
        from online_rl.bus import DeadLetters
        from online_rl.flow import RewardFunctions

        self.rule = settings.rewards.rule()
        self.functions: RewardFunctions | None = None
        self.dead: DeadLetters | None = None
        self._producer: Any = None
        self.texts: dict[tuple[int, ...], str] = {}  # a prompt's text, for reward functions
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(settings.model_dir)  # the rollouts' texts
        if settings.rewards.functions:
            self.functions = RewardFunctions(settings.rewards.functions)
        if bus is not None:
            self._producer = bus.producer()
            self.dead = DeadLetters(self._producer, "hybrid", settings.topics.dlq)

    def _rehearsal_setup(self, settings: Settings) -> None:
        """The rehearsal set and its prompts in the chat template (hybrid.rehearsal_prompts > 0)."""
        from online_rl.models.chat import user_turn_ids
        from online_rl.trainer.rehearsal import load_rehearsal_set

        self.rehearsal: tuple[ProbeItem, ...] = ()
        self.rehearsal_ids: list[list[int]] = []
        if not self.config.rehearsal_prompts:
            return
        items = load_rehearsal_set(settings.trainer.rehearsal_set)
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"hybrid.rehearsal_prompts={self.config.rehearsal_prompts} asks the model "
                              f"questions in its chat template, and the model at {settings.model_dir} has "
                              "none: set hybrid.rehearsal_prompts=0")
        self.rehearsal = items
        self.rehearsal_ids = [user_turn_ids(self.tokenizer, item.prompt) for item in items]

    def _rehearsal_draw(self) -> list[int]:
        """The rehearsal prompts (indexes into the set) this iteration adds: seeded by (seed, iteration),
        so a run's draws are reproducible and leave the window's random stream alone."""
        from online_rl.trainer.rehearsal import draw_prompts

        if not self.rehearsal:
            return []
        return draw_prompts(len(self.rehearsal), self.config.rehearsal_prompts, self.settings.trainer.seed,
                            self.steps)

    # -- what the stream brings ------------------------------------------------------------------
    def observe(self, prompts: Sequence[Sequence[int]] = (), pairs: Sequence[Pair] = (),
                texts: Sequence[str] | None = None, thumbs: Sequence[Thumb] = ()) -> None:
        """Recent prompts (the newest `prompt_window` kept, repeats moved to the front), their texts
        when known (what reward functions see) and new preference pairs and thumbs (prompt, completion,
        thumbs-up) for the reward model."""
        for i, prompt in enumerate(prompts):
            key = tuple(prompt)
            if key in self.prompts:
                self.prompts.remove(key)
            elif len(self.prompts) == self.prompts.maxlen:
                self.texts.pop(self.prompts[0], None)
            self.prompts.append(key)
            if texts is not None:
                self.texts[key] = texts[i]
        self.pending.extend((list(p), list(c), list(r)) for p, c, r in pairs)
        self.pending_thumbs.extend((list(p), list(c), bool(u)) for p, c, u in thumbs)
        self.pairs_seen += len(pairs)
        self.thumbs_seen += len(thumbs)

    @property
    def uses_reward_model(self) -> bool:
        """Whether the rule weighs or gates on the learned reward model."""
        return self.rule.weights.get(REWARD_MODEL, 0.0) > 0 or REWARD_MODEL in self.rule.gates

    @property
    def ready(self) -> bool:
        """Prompts to sample from, and (when the rule uses the reward model) `min_pairs` pairs or thumbs
        seen (a thumb counts as one)."""
        return len(self.prompts) > 0 and (not self.uses_reward_model
                                          or self.pairs_seen + self.thumbs_seen >= self.config.min_pairs)

    # -- one iteration ---------------------------------------------------------------------------
    def learn_rewards(self) -> dict[str, float]:
        import ray

        pairs, self.pending = self.pending, []
        thumbs, self.pending_thumbs = self.pending_thumbs, []
        if self.reward is None:
            return {}
        return dict(ray.get(self.reward.learn.remote(pairs, self.config.reward_steps, thumbs)))

    def rollouts(self, prompts: Sequence[Sequence[int]], temperature: float | None = None,
                 seed: int | None = None) -> tuple[list[tuple[list[int], list[int]]], list[list[float]],
                                                   dict[str, float]]:
        """Switch to generation, sample a completion per prompt with the current policy, switch back."""
        start = time.perf_counter()
        moved = self.engine.sync()
        switched = time.perf_counter()
        try:
            out = self.engine.generate(prompts, self.config.max_new_tokens,
                                       self.config.temperature if temperature is None else temperature,
                                       seed=self.sample_seed + self.steps * 7919 if seed is None else seed)
            generated = time.perf_counter()
        finally:
            self.engine.release()  # the training shards come back even when generation fails
        rollouts = [(list(p), o["token_ids"]) for p, o in zip(prompts, out, strict=True)]
        tokens = sum(len(c) for _, c in rollouts)
        self.last_sync = moved
        return rollouts, [o["logprobs"] for o in out], {
            "to_generation_s": switched - start, "generate_s": generated - switched,
            "to_training_s": time.perf_counter() - generated, "generated_tokens": float(tokens),
            "generate_tokens_per_s": tokens / max(generated - switched, 1e-9),
            "adapter_sync_bytes": float(moved["adapter_sync_bytes"])}

    def rewards(self, rollouts: Sequence[tuple[list[int], list[int]]], meta: dict[str, Any] | None = None,
                texts: tuple[list[str], list[str]] | None = None
                ) -> tuple[list[float | None], dict[str, float]]:
        """Each rollout's reward by `settings.rewards`' rule (None: unscorable), and what it cost. Reward
        functions' failures go to the dead-letter topic; the rollouts they leave unscored are None."""
        import ray

        sources: dict[str, list[float | None]] = {FEEDBACK: [None] * len(rollouts)}  # fresh: no feedback yet
        if REWARD_MODEL in self.rule.sources:  # (weighted 0 and not gated: never scored)
            sources[REWARD_MODEL] = [None] * len(rollouts)
            if self.reward is not None:
                sources[REWARD_MODEL] = list(ray.get(self.reward.score.remote(rollouts)))
        metrics: dict[str, float] = {}
        if self.functions is not None:
            start = time.perf_counter()
            prompts, completions = texts or self._texts(rollouts)
            metas = [{"step": self.steps, "row": i, **(meta or {})} for i in range(len(rollouts))]
            scored = self.functions.score(prompts, completions, metas)
            sources |= scored.values
            if scored.failures and self.dead is not None:
                self._dead_letter(scored, prompts, completions, metas)
            metrics |= {"reward_fn_s": time.perf_counter() - start,
                        "reward_fn_failures": float(len(scored.failures)),
                        "reward_fn_restarts": float(self.functions.restarts)}
            for name, values in scored.values.items():
                got = [v for v in values if v is not None]
                if got:
                    metrics[f"reward_fn_{name}"] = sum(got) / len(got)
        rewards = combine(self.rule, {name: sources[name] for name in self.rule.sources})
        if self.config.critic_free is not None:
            # answers are compared within their group, so all must be on one scale: a rollout that lacks
            # a weighted source's score is not re-weighted from the others but left unscored (users'
            # feedback, which no fresh rollout has, excepted: its weight moves alike for all)
            needed = [s for s, w in self.rule.weights.items() if w > 0 and s != FEEDBACK]
            rewards = [None if any(not _finite(sources[s][i]) for s in needed) else r
                       for i, r in enumerate(rewards)]
        return rewards, metrics

    def _dead_letter(self, scored: RewardScores, prompts: list[str], completions: list[str],
                     metas: list[dict[str, Any]]) -> None:
        """The reward functions' failures to the dead-letter topic; a bus that refuses them is logged,
        never allowed to stop the step."""
        from online_rl.bus import BusError

        assert self.dead is not None
        try:
            dead_letter_failures(self.dead, scored, prompts, completions, metas)
            self.dead.flush()
        except BusError as exc:
            logger.error("hybrid step %d: %d reward-function failures could not be dead-lettered (%s)",
                         self.steps, len(scored.failures), exc, extra={"event": "dead_letter_failed"})

    def _texts(self, rollouts: Sequence[tuple[list[int], list[int]]]) -> tuple[list[str], list[str]]:
        """What reward functions read: the prompt's text (as the user wrote it, when the stream said)
        and the completion's, decoded without special tokens."""
        prompts = [self.texts.get(tuple(p)) or self.tokenizer.decode(p, skip_special_tokens=True)
                   for p, _ in rollouts]
        return prompts, [self.tokenizer.decode(c, skip_special_tokens=True) for _, c in rollouts]

    # -- one iteration, phase by phase: the rollout flow's nodes (online_rl/hybrid/runner.py) ---------
    def step(self) -> dict[str, float]:
        """One iteration on fresh rollouts (call when `ready`): its phases in order, as the rollout flow
        runs them; the iteration's metrics."""
        data: dict[str, Any] = {}
        for phase in (self.learn_phase, self.generate, self.reward_phase, self.advantage, self.update):
            phase(data)
        return self.finish(data)

    def learn_phase(self, data: dict[str, Any]) -> None:
        """The iteration starts: the reward model learns from the pairs that arrived."""
        data["started"] = time.perf_counter()
        data["metrics"] = self.learn_rewards()

    def generate(self, data: dict[str, Any]) -> None:
        """`rollout_batch` prompts from the window (× `group_size` answers critic-free), sampled with
        the current policy: `prompts`, `rollouts` (prompt, completion ids), `behaviour` (the engine's
        log-probs), `groups` (one id per prompt)."""
        data.setdefault("started", time.perf_counter())
        critic_free = self.config.critic_free
        n = critic_free.group_size if critic_free is not None else 1
        if self.pipeline is not None:
            self._pipelined(data, n)
        else:
            prompts = [list(p) for p in self.random.choices(list(self.prompts), k=self.config.rollout_batch)]
            drawn = self._rehearsal_draw()  # fact rehearsal: its prompts after the window's
            data["rehearsal"] = {len(prompts) + j: self.rehearsal[index] for j, index in enumerate(drawn)}
            prompts += [list(self.rehearsal_ids[index]) for index in drawn]
            sampled = time.time()
            rollouts, behaviour, timing = self.rollouts([p for p in prompts for _ in range(n)])
            data.setdefault("metrics", {}).update(timing | {"staleness": 0.0})
            data |= {"prompts": prompts, "rollouts": rollouts, "behaviour": behaviour,
                     "groups": [i // n for i in range(len(rollouts))],
                     "adapter": self.last_sync.get("adapter_name"), "version": self.updates,
                     "sampled": (sampled, time.time())}
        # what a reward node reads: the texts, as reward functions see them
        data["prompt_texts"], data["completions"] = self._texts(data["rollouts"])
        for row, group in enumerate(data["groups"]):  # a rehearsal prompt reads as its set writes it
            if group in data.get("rehearsal", {}):
                data["prompt_texts"][row] = data["rehearsal"][group].prompt

    def _pipelined(self, data: dict[str, Any], n: int) -> None:
        """The batch to train from the asynchronous pipeline: batches are sampled ahead with the adapter
        current when they were submitted (synced first when the policy moved), within the staleness
        bound; while this one trains, the engine samples the next."""
        import ray

        from online_rl.hybrid.generation import VllmGeneration

        engine = self.engine
        assert isinstance(engine, VllmGeneration) and self.pipeline is not None
        metrics = data.setdefault("metrics", {})
        config = self.config

        def submit(version: int) -> Batch:
            if self.synced != self.updates:  # the newest adapter for everything sampled from now on
                self.last_sync = engine.sync(wait=False)  # queued behind the batches sampling now
                self.synced = self.updates
                metrics["adapter_sync_bytes"] = float(self.last_sync["adapter_sync_bytes"])
            prompts = [list(p) for p in self.random.choices(list(self.prompts), k=config.rollout_batch)]
            seed, self.submitted = self.sample_seed + self.submitted * 7919, self.submitted + 1
            handle, name = engine.submit([p for p in prompts for _ in range(n)], config.max_new_tokens,
                                         config.temperature, seed)
            return Batch(handle, name, version, prompts, time.time())

        def collect(batch: Batch) -> Any:
            try:
                return ray.get(batch.handle)
            finally:
                engine.done(batch.adapter)

        waited = time.perf_counter()
        batch, staleness, dropped = self.pipeline.next(self.updates, submit, collect)
        if "install" in self.last_sync:  # the install queued this iteration: its figures
            self.last_sync = engine.finish(self.last_sync)
            metrics["sync_s"] = self.last_sync["sync_s"]
        out = batch.result
        prompts = batch.payload
        completions = out["completions"]
        expanded = [p for p in prompts for _ in range(n)]
        rollouts = [(list(p), c["token_ids"]) for p, c in zip(expanded, completions, strict=True)]
        tokens = sum(len(c) for _, c in rollouts)
        metrics |= {"wait_s": time.perf_counter() - waited, "staleness": float(staleness),
                    "dropped_batches": float(len(dropped)), "generated_tokens": float(tokens),
                    "generate_s": out["finished"] - out["started"],
                    "generate_tokens_per_s": tokens / max(out["finished"] - out["started"], 1e-9)}
        data |= {"prompts": prompts, "rollouts": rollouts, "behaviour": [c["logprobs"] for c in completions],
                 "groups": [i // n for i in range(len(rollouts))], "adapter": batch.adapter,
                 "version": batch.version, "sampled": (out["started"], out["finished"])}

    def reward_phase(self, data: dict[str, Any]) -> None:
        """`rewards`: one per rollout by the rule of `settings.rewards` (None: unscored)."""
        data["rewards"], metrics = self.rewards(data["rollouts"],
                                                texts=(data["prompt_texts"], data["completions"]))
        if data.get("rehearsal"):
            metrics |= self._verify(data)
        data["metrics"].update(metrics)

    def _verify(self, data: dict[str, Any]) -> dict[str, float]:
        """Fact rehearsal: `rehearsal_weight` added to the reward of each answer to a rehearsal prompt
        that holds its fact (an unscored answer stays unscored); the share of them that did."""
        from online_rl.trainer.gate import probe_correct

        rows = [i for i, group in enumerate(data["groups"]) if group in data["rehearsal"]]
        verdicts = probe_correct([data["rehearsal"][data["groups"][i]] for i in rows],
                                 [data["completions"][i] for i in rows])
        rewards: list[float | None] = data["rewards"]
        for i, right in zip(rows, verdicts, strict=True):
            reward = rewards[i]
            if right and reward is not None:
                rewards[i] = reward + self.config.rehearsal_weight
        return {"rehearsal_prompts": float(len(data["rehearsal"])),
                "rehearsal_correct": sum(verdicts) / max(1, len(verdicts))}

    def advantage(self, data: dict[str, Any]) -> None:
        """Drop the unscored rollouts; the policy's and the reference's log-probs of the rest (`old`,
        `ref`). An iteration with fewer scored rollouts than devices is `skipped`."""
        self.steps += 1
        rewards = data["rewards"]
        kept = [i for i, r in enumerate(rewards) if r is not None and math.isfinite(r)]
        data["rollouts"] = [data["rollouts"][i] for i in kept]
        data["behaviour"] = [data["behaviour"][i] for i in kept]
        data["groups"] = [data["groups"][i] for i in kept]
        data["scores"] = [float(rewards[i]) for i in kept]
        if len(kept) < self.group.world:  # too few scored rollouts to give every device one
            logger.warning("hybrid step %d: %d of %d rollouts scored, too few to train on; skipped",
                           self.steps, len(kept), len(rewards), extra={"event": "hybrid_step_skipped"})
            data["skipped"] = True
            return
        scored = self.group.score(data["rollouts"])
        data["old"], data["ref"] = [s[0] for s in scored], [s[1] for s in scored]

    def update(self, data: dict[str, Any]) -> None:
        """The PPO step: with the critic (GAE) or critic-free (GRPO, RLOO, REINFORCE++)."""
        if data.get("skipped"):
            return
        args = (data["rollouts"], data["behaviour"], data["old"], data["ref"], data["scores"])
        updating = time.time()
        if self.config.critic_free is None:
            data["metrics"].update(self._gae_update(*args))
        else:
            data["metrics"].update(self._critic_free_update(*args, data["groups"]))
        data["trained"] = True
        self.updates += 1
        data["updated"] = (updating, time.time())

    def finish(self, data: dict[str, Any]) -> dict[str, float]:
        """The iteration's metrics (and its log line)."""
        metrics: dict[str, float] = data["metrics"]
        metrics |= {"step": float(self.steps), "rollouts": float(len(data["rollouts"])),
                    "iteration_s": time.perf_counter() - data["started"]}
        if "sampled" in data:  # the timeline: when this batch was sampled (by which version), when it trained
            self.timeline.append({"step": self.steps, "version": data["version"], "adapter": data["adapter"],
                                  "sampled": list(data["sampled"]), "updated": list(data.get("updated", ()))})
        if data.get("skipped"):
            return metrics | {"skipped": 1.0}
        gap = [abs(o - b) for row, served in zip(data["old"], data["behaviour"], strict=True)
               for o, b in zip(row, served, strict=True)]
        metrics["behaviour_gap"] = sum(gap) / max(1, len(gap))
        logger.info("hybrid step %d: reward %.3f kl %.3f in %.1fs", self.steps, metrics["reward"],
                    metrics["kl"], metrics["iteration_s"],
                    extra={"event": "hybrid_step", **{k: round(v, 6) for k, v in metrics.items()}})
        return metrics

    def _gae_update(self, rollouts: list[tuple[list[int], list[int]]], behaviour: list[list[float]],
                    old: list[list[float]], ref: list[list[float]], scores: list[float]) -> dict[str, float]:
        """PPO with the critic: GAE on KL-penalised rewards; the actors' and the critic's steps."""
        import ray

        # the critic's rollouts carry the score in the trainer's Rollout shape
        full = [(p, c, b, r) for (p, c), b, r in zip(rollouts, behaviour, scores, strict=True)]
        values = ray.get(self.critic.values.remote(full))
        out = advantages_for(full, old, ref, values, self.ppo, self.kl_coef)
        critic = self.critic.train_step.remote(full, out.returns, values)
        metrics = self.group.ppo_train(rollouts, old, out.advantages, behaviour)
        metrics |= dict(ray.get(critic))
        if self.ppo.kl.target is not None:
            self.kl_coef = self.kl.update(out.sequence_kl, len(rollouts))
        return metrics | {"reward": out.mean_reward, "kl": out.sequence_kl, "kl_coef": self.kl_coef}

    def _critic_free_update(self, rollouts: list[tuple[list[int], list[int]]], behaviour: list[list[float]],
                            old: list[list[float]], ref: list[list[float]], scores: list[float],
                            groups: list[int]) -> dict[str, float]:
        """GRPO, RLOO or REINFORCE++: advantages from each prompt's answers; the actors' steps on the
        answers of groups that carry a signal."""
        from torch.nn.utils.rnn import pad_sequence

        config = self.config.critic_free
        assert config is not None
        lengths = [len(row) for row in old]
        old_padded = pad_sequence([torch.tensor(r, dtype=torch.float32) for r in old], batch_first=True)
        ref_padded = pad_sequence([torch.tensor(r, dtype=torch.float32) for r in ref], batch_first=True)
        mask = (torch.arange(old_padded.shape[1]).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()
        rewards = torch.tensor(scores)
        out = critic_free_advantages(config, rewards, torch.tensor(groups), old_padded, ref_padded, mask)
        per_token = (out.advantages.unsqueeze(-1).expand_as(old_padded) if out.advantages.dim() == 1
                     else out.advantages)
        keep = [i for i in range(len(rollouts)) if bool(out.keep[i])]
        kl = float(((old_padded - ref_padded) * mask).sum(-1).mean())
        metrics = {"reward": float(rewards.mean()), "kl": kl, "kl_coef": config.kl_coef,
                   "zero_variance_fraction": out.zero_variance_fraction, "trained_rollouts": float(len(keep))}
        if len(keep) < self.group.world:  # every group agreed: nothing to learn from this batch
            return metrics
        return metrics | self.group.ppo_train([rollouts[i] for i in keep], [old[i] for i in keep],
                                              [per_token[i, :lengths[i]].tolist() for i in keep],
                                              [behaviour[i] for i in keep],
                                              [ref[i] for i in keep] if config.beta > 0 else None)

    def evaluate(self, prompts: Sequence[Sequence[int]], samples: int = 1, seed: int = 1234,
                 texts: Sequence[str] | None = None) -> dict[str, float]:
        """On held-out prompts, with the reward model as it is now: its mean score of the policy's
        sampled completions and of the base model's (same seeds), and the policy completions' mean KL
        to the reference (the summed log-ratio per completion). With reward functions, each one's mean
        on both (`fn_<name>`, `base_fn_<name>`); `texts` are the prompts as the users wrote them."""
        import ray

        batch = [list(p) for p in prompts for _ in range(samples)]
        self.engine.sync()
        try:
            length, temperature = self.config.max_new_tokens, self.config.temperature
            policy = self.engine.generate(batch, length, temperature, seed=seed)
            base = self.engine.generate(batch, length, temperature, seed=seed, adapter=None)
        finally:
            self.engine.release()
        ours = [(p, o["token_ids"]) for p, o in zip(batch, policy, strict=True)]
        theirs = [(p, o["token_ids"]) for p, o in zip(batch, base, strict=True)]
        kl = [sum(o) - sum(r) for o, r in self.group.score(ours)]
        n = len(batch)
        out = {"kl": sum(kl) / n, "completion_tokens": sum(len(c) for _, c in ours) / n,
               "base_completion_tokens": sum(len(c) for _, c in theirs) / n}
        if self.reward is not None:  # the reward model's mean on the policy's and the base's answers
            scores = ray.get(self.reward.score.remote(ours + theirs))
            out |= {"reward": sum(scores[:n]) / n, "base_reward": sum(scores[n:]) / n}
        if self.functions is not None:  # each reward function's mean on the policy's and the base's answers
            decoded, completions = self._texts(ours + theirs)
            if texts is not None:
                decoded = [t for t in texts for _ in range(samples)] * 2
            values = self.functions.score(decoded, completions, [{"evaluation": True}] * (2 * n)).values
            for name, rows in values.items():
                for key, part in ((f"fn_{name}", rows[:n]), (f"base_fn_{name}", rows[n:])):
                    got = [v for v in part if v is not None]
                    out[key] = sum(got) / len(got) if got else float("nan")
        return out

    def save_adapter(self, folder: str) -> None:
        self.group.save_adapter(folder)

    def close(self) -> None:
        import ray

        for actor in (self.critic, self.reward):
            if actor is not None:
                ray.kill(actor)
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        if self.functions is not None:
            self.functions.close()
        if self._producer is not None:
            self._producer.close()
        group: HybridGroup | None = getattr(self, "group", None)  # absent when its start failed
        if group is not None:
            group.close()


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
