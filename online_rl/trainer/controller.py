"""The trainer's single controller: read a batch, run a flow of named nodes on it — forever.

`Trainer.run` reads batches from the samples topic and runs a flow (`online_rl.flow.graph`) on each.
Two flows are built in: `feedback` (below: score → update → evaluate → publish → checkpoint →
commit) and `rollout` (`online_rl.hybrid.runner`: fresh rollouts on the hybrid engine); a user adds,
replaces or removes nodes (docs/trainer.md#flows). In the feedback flow the policy lives in a group
of data-parallel Ray actors (`WorkerGroup` of `PolicyWorker`s). One MLflow run covers the trainer's
lifetime (its resolved config as params, a metric row per step). Exactly-once effect: a batch's offsets are
committed to the bus only after the checkpoint that includes its update is durable, and a restart
resumes from the newest readable checkpoint at *its* offsets. Samples the trainer can never use go
to the dead-letter topic with the reason. Publishing (every N samples, every T seconds, or when the
held-out evaluation gains enough) seals the adapter with its lineage, logs it to the run, registers
it as a new version and points the `challenger` alias at it.

`online-rl trainer` adds Prometheus metrics and SIGTERM handling around this class.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from online_rl.algos import AdaptiveKLController, balanced_weights
from online_rl.algos.anchor import adapt_anchor_coef
from online_rl.bus import Bus, BusError, CommitFailed, DeadLetters, TopicPartition, open_bus
from online_rl.errors import ConfigError
from online_rl.events import TrainingSample
from online_rl.faults import failpoint
from online_rl.flow.errors import FlowError
from online_rl.flow.graph import Flow, Step
from online_rl.models.chat import user_turn_ids
from online_rl.registry import (
    LINEAGE_NAME,
    PublishedVersion,
    TrainingRun,
    VersionLineage,
    adapter_files,
    alias_version,
    file_sha256,
    find_published,
    folder_files,
    mlflow_outage,
    offset_ranges,
    serving_name,
)
from online_rl.stream import Batch, Stream
from online_rl.trainer.checkpoint import Checkpoint, CheckpointStore
from online_rl.trainer.errors import CheckpointAhead
from online_rl.trainer.evaluation import EvalSet, eval_gain
from online_rl.trainer.flows import (
    ENGINES,
    FlowBuilder,
    Parallel,
    build_flow,
    check_engine,
    with_layout,
    with_parallel,
)
from online_rl.trainer.gate import ABILITY_PROBE, GateVerdict, ProbeItem, judge, load_probe, probe_correct
from online_rl.trainer.metrics import TrainerMetrics
from online_rl.trainer.ppo import advantages_for
from online_rl.trainer.rehearsal import draw_prompts, edited_pairs, load_rehearsal_set, rehearsal_pairs
from online_rl.trainer.samples import (
    Routed,
    ThumbPairer,
    anchor_sequences,
    held_out,
    load_cold_start,
    route,
)
from online_rl.trainer.spec import trainer_specs

if TYPE_CHECKING:
    from online_rl.config import Settings
    from online_rl.hybrid.runner import RolloutProgram
    from online_rl.trainer.group import WorkerGroup

__all__ = ["Trainer", "TrainerState", "drop_trained"]

logger = logging.getLogger(__name__)

_REPLAY_MAX_SAMPLES = 4096  # the ability gate's retries keep at most this many samples in memory


@dataclass
class TrainerState:
    """What the loop has done; restored from the checkpoint's metadata on restart."""

    step: int = 0
    samples: int = 0  # trained on
    offsets: dict[TopicPartition, int] = field(default_factory=dict)  # next to read
    published_offsets: dict[TopicPartition, int] = field(default_factory=dict)  # at the last publish
    samples_since_publish: int = 0
    last_publish: float = field(default_factory=time.time)
    behaviour_versions: set[str] = field(default_factory=set)
    reward_mapping_versions: set[str] = field(default_factory=set)
    parent_version: str | None = None  # serving name of the last published version
    parent_version_number: str | None = None
    dead_lettered: int = 0
    skipped: int = 0
    cold_since_publish: int = 0  # cold-start samples trained since the last publish
    kl_coef: float = 0.05  # PPO's KL coefficient (adapted when trainer.kl_target is set)
    anchor_kl_coef: float = 0.0  # the cold-start KL term's weight (adapted with cold_start_kl_target)
    thumbs_up: int = 0  # KTO's thumbs trained so far, by label (for trainer.kto_balance)
    thumbs_down: int = 0
    eval_entries: list[Any] = field(default_factory=list)  # the held-out set (EvalSet.to_metadata)
    eval_gain_due: bool = False  # an evaluation beat the last published version by enough
    recent: dict[str, list[float]] = field(default_factory=dict)  # metrics since the last publish
    # a publish under way: its key (the version's `publish_key` tag), the step, samples and offsets it
    # seals; written to the checkpoint before MLflow hears of it (see Trainer._publish_node)
    pending_publish: dict[str, Any] | None = None
    lr_scale: float = 1.0  # the learning rate's multiplier (trainer.ability_backoff per refusal)
    refusals: int = 0  # versions the ability gate refused
    shrinks: int = 0  # versions the ability gate passed after shrinking their change (ability_shrink)
    # the base's answers to the gate's probe, asked once per run: {"key": what they depend on, "correct"}
    probe_base: dict[str, Any] | None = None

    def metadata(self) -> dict[str, Any]:
        return {
            "published_offsets": [[tp.topic, tp.partition, o]
                                  for tp, o in sorted(self.published_offsets.items())],
            "samples_since_publish": self.samples_since_publish,
            "behaviour_versions": sorted(self.behaviour_versions),
            "reward_mapping_versions": sorted(self.reward_mapping_versions),
            "parent_version": self.parent_version,
            "parent_version_number": self.parent_version_number,
            "dead_lettered": self.dead_lettered,
            "skipped": self.skipped,
            "last_publish": self.last_publish,
            "cold_since_publish": self.cold_since_publish,
            "kl_coef": self.kl_coef,
            "anchor_kl_coef": self.anchor_kl_coef,
            "thumbs": [self.thumbs_up, self.thumbs_down],
            "eval_set": self.eval_entries,
            "recent": self.recent,
            "pending_publish": self.pending_publish,
            "lr_scale": self.lr_scale,
            "refusals": self.refusals,
            "shrinks": self.shrinks,
            "probe_base": self.probe_base,
        }

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> TrainerState:
        meta = checkpoint.metadata
        return cls(
            step=checkpoint.step, samples=checkpoint.samples, offsets=dict(checkpoint.offsets),
            published_offsets={TopicPartition(t, p): o for t, p, o in meta.get("published_offsets", [])},
            samples_since_publish=meta.get("samples_since_publish", 0),
            behaviour_versions=set(meta.get("behaviour_versions", [])),
            reward_mapping_versions=set(meta.get("reward_mapping_versions", [])),
            parent_version=meta.get("parent_version"),
            parent_version_number=meta.get("parent_version_number"),
            dead_lettered=meta.get("dead_lettered", 0),
            skipped=meta.get("skipped", 0), last_publish=meta.get("last_publish", time.time()),
            recent={k: list(v) for k, v in meta.get("recent", {}).items()},
            cold_since_publish=meta.get("cold_since_publish", 0), eval_entries=meta.get("eval_set", []),
            kl_coef=meta.get("kl_coef", 0.0), anchor_kl_coef=meta.get("anchor_kl_coef", 0.0),
            thumbs_up=meta.get("thumbs", [0, 0])[0], thumbs_down=meta.get("thumbs", [0, 0])[1],
            pending_publish=meta.get("pending_publish"),
            lr_scale=meta.get("lr_scale", 1.0), refusals=meta.get("refusals", 0),
            shrinks=meta.get("shrinks", 0), probe_base=meta.get("probe_base"),
        )


class Trainer:
    """The single controller: reads batches from the samples topic and runs a flow on each.

    `flow`: `feedback` (the data-parallel policy workers learn from users' samples: DPO, KTO, PPO),
    `rollout` (the hybrid workers learn from fresh rollouts: PPO or GRPO/RLOO/REINFORCE++, see
    `online_rl.hybrid`), `"module:attr"` or a callable `build(trainer) -> Flow` that starts from
    `trainer.default_flow(kind)` and adds, replaces or removes nodes; default `settings.trainer.flow`.
    `policy`, `parallel` and `engine` are shorthands for the settings they name (see `Parallel`)."""

    def __init__(self, settings: Settings | None = None, bus: Bus | None = None, *,
                 flow: str | FlowBuilder | None = None, policy: str | Path | None = None,
                 parallel: Parallel | None = None, engine: str | None = None) -> None:
        from online_rl.config import load_settings

        settings = settings if settings is not None else load_settings()
        self.settings = settings = with_layout(settings, policy, engine)
        self._parallel = parallel
        self.config = settings.trainer
        self.bus = bus or open_bus(settings)
        self.topics = settings.topics
        self._last_lag = 0.0  # what `_lag` reports while the bus cannot say
        self._store: CheckpointStore | None = None  # made when the feedback flow starts
        self.specs = trainer_specs(settings)  # what the workers are built from
        self.ppo_config = self.specs[0].ppo
        self.published: list[PublishedVersion] = []
        self.refused: list[GateVerdict] = []  # versions the ability gate refused, in this process
        # the DPO/KTO batches trained since the last publish, for the gate's retries (None: too many, or
        # a PPO step among them, which cannot be trained again the same way)
        self._replay: list[tuple[Routed, float | None, tuple[float, float] | None]] | None = []
        self.metrics = TrainerMetrics()
        self._group: WorkerGroup | None = None
        self._run: TrainingRun | None = None
        self.state: TrainerState | None = None  # while running: the live state (read-only for others)
        self._publish_requested = threading.Event()
        self.pairer = ThumbPairer(self.config.pair_thumbs_memory)  # trainer.pair_thumbs's waiting thumbs
        self.kind: str | None = None  # the kind of flow this trainer runs, once built
        self.rollout: RolloutProgram | None = None
        self.flow = build_flow(self, flow if flow is not None else self.config.flow)
        check_engine(self.flow.kind, engine, parallel)

    @property
    def store(self) -> CheckpointStore:
        """The feedback flow's checkpoints (`trainer.checkpoint_dir`)."""
        if self._store is None:
            self._store = CheckpointStore(self.settings.checkpoint_dir, keep=self.config.keep_checkpoints)
        return self._store

    def default_flow(self, kind: str) -> Flow:
        """A fresh copy of the built-in flow `kind` (`feedback` or `rollout`), its nodes bound to this
        trainer; one trainer runs one kind."""
        if self.kind is not None and kind != self.kind:
            raise FlowError(f"this trainer already runs a {self.kind} flow; a {kind} flow needs its own "
                            "Trainer")
        if self.kind is None and kind in ENGINES:  # the layout goes to the section this kind trains with
            self.settings = with_parallel(self.settings, kind, self._parallel)
            self.config = self.settings.trainer
        if kind == "feedback":
            flow = Flow("feedback", [("score", self._score_node), ("update", self._update_node),
                                     ("evaluate", self._evaluate_node), ("publish", self._publish_node),
                                     ("checkpoint", self._checkpoint_node), ("commit", self._commit_node)])
        elif kind == "rollout":
            from online_rl.hybrid.runner import RolloutProgram

            if self.rollout is None:
                self.rollout = RolloutProgram(self.settings, self.bus, self.metrics)
            flow = self.rollout.flow()
        else:
            raise FlowError(f"trainer.flow={kind!r} is not feedback, rollout or 'package.module:function'")
        self.kind = kind
        return flow

    # -- set-up ---------------------------------------------------------------------------------
    def _start(self) -> TrainerState:
        """Workers up, an MLflow run open, the references loaded; the state to resume from."""
        from online_rl.ray_runtime import init_ray
        from online_rl.trainer.group import WorkerGroup

        if not (self.settings.model_dir / "config.json").is_file():
            raise ConfigError(f"model.path={self.settings.model_dir} holds no model (no config.json): "
                              "run `online-rl model prepare` for the embedded default, or set model.path")
        init_ray(self.settings)
        self._group = WorkerGroup(self.settings, *self.specs)
        self.context = self._group.context_length()
        self.vocab = self._group.vocab_size()
        # the run's params: the resolved config, with what `precision` resolved to on the workers' device
        self._run = run = TrainingRun.open(self.settings, "trainer", self._group.precision)
        self.cold_start: list[TrainingSample] = []
        if self.config.cold_start is not None and self.config.cold_start_weight > 0:
            self.cold_start = load_cold_start(self.config.cold_start, self.config.algorithm,
                                              self.settings.model.name, self.context,
                                              as_anchors=self.config.cold_start_loss == "kl",
                                              vocab_size=self.vocab)
            self.cold_start_sha256 = file_sha256(self.config.cold_start)
        self.anchor_version: str | None = None
        self.kl_anchor = "base"
        state = self._resume()
        self.evalset = EvalSet(self.config.eval_size,
                               state.eval_entries if self.config.eval_holdout > 0 else [])
        if state.pending_publish is not None and self._settle_pending(state) is None:
            self._publish_requested.set()  # the crash came before MLflow registered it: publish it now
        self._refresh_anchor()
        if state.parent_version_number is not None and self.config.eval_holdout > 0:
            self._group.set_baseline(adapter_files(run.client, self.settings.mlflow.registered_model,
                                                   state.parent_version_number))
        if state.lr_scale != 1.0 and self.config.ability_gate:  # refusals before the restart lowered it
            self._group.set_learning_rate(self.config.learning_rate * state.lr_scale)
        self._start_gate(state)
        self._start_rehearsal()
        return state

    # -- the ability gate (online_rl/trainer/gate.py) ------------------------------------------------
    def _start_gate(self, state: TrainerState) -> None:
        """Load the probe and answer it with the base, once per run (a restart finds the answers in its
        checkpoint, keyed by what they depend on): what a version must keep."""
        self.probe: tuple[ProbeItem, ...] = ()
        self.probe_base: list[bool] = []
        if not self.config.ability_gate:
            return
        from transformers import AutoTokenizer

        path = self.config.ability_probe
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"trainer.ability_probe={path} is not a file: give a JSON-lines probe, or "
                              "leave it empty for the built-in one")
        try:
            self.probe = load_probe(path) if path is not None else ABILITY_PROBE
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc
        tokenizer = AutoTokenizer.from_pretrained(str(self.settings.model_dir))
        if not getattr(tokenizer, "chat_template", None):
            logger.warning("the ability gate is off: the model at %s has no chat template to ask its probe "
                           "with (set trainer.ability_gate=false to say so)", self.settings.model_dir,
                           extra={"event": "ability_gate_off", "reason": "no chat template"})
            self.probe = ()
            return
        self._probe_ids = [user_turn_ids(tokenizer, item.prompt) for item in self.probe]
        self._probe_tokens = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                              else tokenizer.eos_token_id, tokenizer.eos_token_id)
        self._tokenizer = tokenizer
        key = hashlib.sha256(json.dumps(
            [[[item.prompt, list(item.accept)] for item in self.probe], self.config.ability_max_tokens,
             self.group.precision.precision, self.mlflow_run.base_sha256]).encode()).hexdigest()[:24]
        kept = state.probe_base
        if kept is not None and kept.get("key") == key and len(kept.get("correct", [])) == len(self.probe):
            self.probe_base = [bool(c) for c in kept["correct"]]
        else:
            self.probe_base = self._probe_answers(base=True)
            state.probe_base = {"key": key, "correct": self.probe_base}
        if sum(self.probe_base) <= self.config.ability_tolerance:
            logger.warning("the ability gate is off: it could refuse nothing, as the base answers %d of the "
                           "%d probe prompts correctly and trainer.ability_tolerance is %d; give a probe the "
                           "model answers (trainer.ability_probe)", sum(self.probe_base), len(self.probe),
                           self.config.ability_tolerance, extra={"event": "ability_gate_toothless"})
            self.probe = ()  # nothing to guard: asking it at every publish would only cost time
            return
        logger.info("ability gate: the base answers %d of %d probe prompts correctly%s", sum(self.probe_base),
                    len(self.probe), " (kept in the checkpoint)" if state.probe_base is kept else "",
                    extra={"event": "ability_probe_base", "correct": sum(self.probe_base),
                           "asked": len(self.probe), "from_checkpoint": state.probe_base is kept})

    def _probe_answers(self, base: bool = False) -> list[bool]:
        pad, eos = self._probe_tokens
        answers = self.group.answer_greedy(self._probe_ids, self.config.ability_max_tokens, pad, eos, base)
        return probe_correct(self.probe, [str(self._tokenizer.decode(a, skip_special_tokens=True))
                                          for a in answers])

    # -- fact rehearsal (online_rl/trainer/rehearsal.py) --------------------------------------------
    def _start_rehearsal(self) -> None:
        """Load the rehearsal set and encode its prompts (trainer.rehearsal_prompts > 0)."""
        self.rehearsal: tuple[ProbeItem, ...] = ()
        if not self.config.rehearsal_prompts:
            return
        from transformers import AutoTokenizer

        items = load_rehearsal_set(self.config.rehearsal_set)
        tokenizer = AutoTokenizer.from_pretrained(str(self.settings.model_dir))
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError(f"trainer.rehearsal_prompts={self.config.rehearsal_prompts} asks the model "
                              f"questions in its chat template, and the model at {self.settings.model_dir} "
                              "has none: set trainer.rehearsal_prompts=0")
        self.rehearsal = items
        self._rehearsal_ids = [user_turn_ids(tokenizer, item.prompt) for item in items]
        self._rehearsal_tokens = (tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                                  else tokenizer.eos_token_id, tokenizer.eos_token_id)
        self._rehearsal_tokenizer = tokenizer
        logger.info("fact rehearsal: %d prompts of %d each step, %d answers each", min(
            self.config.rehearsal_prompts, len(items)), len(items), self.config.rehearsal_samples,
            extra={"event": "rehearsal_on", "set": len(items), "prompts": self.config.rehearsal_prompts,
                   "samples": self.config.rehearsal_samples})

    def _rehearse(self, routed: Routed, step: int) -> dict[str, float]:
        """Add step `step`'s rehearsal pairs to `routed` (sampled by the current adapter); their metrics."""
        picked = draw_prompts(len(self.rehearsal), self.config.rehearsal_prompts, self.config.seed, step)
        pad, eos = self._rehearsal_tokens
        seed = self.config.seed * 1_000_003 + step  # the step's own draws: the same after a restart
        items, prompts = [self.rehearsal[i] for i in picked], [self._rehearsal_ids[i] for i in picked]
        sampled = self.group.answer_sampled(prompts, self.config.rehearsal_samples,
                                            self.config.ability_max_tokens, pad, eos,
                                            self.config.rehearsal_temperature, seed)
        tokenizer = self._rehearsal_tokenizer
        answers = [[(ids, str(tokenizer.decode(ids, skip_special_tokens=True))) for ids in group]
                   for group in sampled]
        if self.config.rehearsal_rejected == "edited":
            draw = edited_pairs(items, prompts, answers, self.rehearsal,
                                lambda text: list(tokenizer(text, add_special_tokens=False).input_ids), eos,
                                random.Random(seed))
        else:
            draw = rehearsal_pairs(items, prompts, answers)
        routed.pairs.extend(draw.pairs)
        routed.pair_ids.extend(f"rehearsal-{step}-{i}" for i in range(len(draw.pairs)))
        routed.rehearsed += len(draw.pairs)
        return draw.as_metrics()

    def _remember(self, routed: Routed, coef: float | None, weights: tuple[float, float] | None) -> None:
        """Keep the batch for the gate's retries (only when they are on: otherwise nothing is kept)."""
        if self._replay is None or not self.config.ability_gate or self.config.ability_retries == 0:
            return
        self._replay.append((routed, coef, weights))
        if sum(r.trained for r, _, _ in self._replay) > _REPLAY_MAX_SAMPLES:
            self._replay = None

    def _gate(self, state: TrainerState) -> bool:
        """Whether the adapter may be published. When not: go back to the last published adapter (the
        base before the first) at a lower learning rate and train the batches since again, up to
        `ability_retries` times; then, if it still fails, drop them and refuse."""
        if not self.probe:
            return True
        tries = 0
        while True:
            verdict = judge(self.probe, self.probe_base, self._probe_answers(), self.config.ability_tolerance)
            self.mlflow_run.log_metrics(verdict.as_metrics() | {"ability_retries": float(tries)}, state.step)
            if verdict.passed:
                if tries == 0:
                    self._recover(state)
                return True
            files = None
            if state.parent_version_number is not None:
                files = adapter_files(self.mlflow_run.client, self.settings.mlflow.registered_model,
                                      state.parent_version_number)
            if self._shrink(state, files, verdict):
                return True
            state.lr_scale *= self.config.ability_backoff
            self.group.reset_adapter(files, self.config.learning_rate * state.lr_scale)
            if tries >= self.config.ability_retries or not self._replay:
                break
            tries += 1
            logger.warning("step %d: the ability gate found %d of the %d probe prompts the base answers "
                           "(lost: %s); training the %d batches since %s again at learning rate %.3g",
                           state.step, verdict.correct, verdict.base_correct, "; ".join(verdict.lost),
                           len(self._replay), state.parent_version or "the base",
                           self.config.learning_rate * state.lr_scale,
                           extra={"event": "ability_retry", "step": state.step, "kept": verdict.correct,
                                  "lost": list(verdict.lost), "lr_scale": state.lr_scale, "try": tries})
            for routed, coef, weights in self._replay:
                self.group.train_step(routed, coef, weights)
        self._replay = []
        state.refusals += 1
        dropped = state.samples_since_publish
        state.samples_since_publish = 0  # trained, and thrown away: nothing is due until more arrive
        state.last_publish = time.time()
        state.eval_gain_due = False
        state.recent, state.cold_since_publish = {}, 0
        self._publish_requested.clear()
        self.refused.append(verdict)
        self.metrics.ability_refusals.inc()
        logger.warning("step %d: the ability gate refused the version: it answers %d of the %d probe prompts "
                       "the base answers (lost: %s); back to %s, learning rate now %.3g",
                       state.step, verdict.correct, verdict.base_correct, "; ".join(verdict.lost),
                       state.parent_version or "the base", self.config.learning_rate * state.lr_scale,
                       extra={"event": "publish_refused", "step": state.step, "kept": verdict.correct,
                              "base_correct": verdict.base_correct, "lost": list(verdict.lost),
                              "dropped_samples": dropped, "back_to": state.parent_version or "base",
                              "lr_scale": state.lr_scale})
        return False

    def _shrink(self, state: TrainerState, files: dict[str, bytes] | None, failed: GateVerdict) -> bool:
        """`trainer.ability_shrink`: keep a smaller share of the adapter's change since the last published
        version (`files`; the base before the first), each in turn, until one passes the probe. True: the
        shrunk adapter is what gets published and trained on; False: none passed (or none configured),
        and the adapter is left at the smallest share tried, for the step back to replace."""
        kept = 1.0
        for keep in self.config.ability_shrink:
            self.group.shrink_adapter(files, keep / kept)  # of what is left: keep of the whole change
            kept = keep
            verdict = judge(self.probe, self.probe_base, self._probe_answers(), self.config.ability_tolerance)
            self.mlflow_run.log_metrics(verdict.as_metrics() | {"ability_shrink_kept": keep}, state.step)
            logger.warning("step %d: the ability gate found %d of the %d probe prompts the base answers with "
                           "the whole change since %s (lost: %s); keeping %.3g of it: %d%s", state.step,
                           failed.correct, failed.base_correct, state.parent_version or "the base",
                           "; ".join(failed.lost), keep, verdict.correct,
                           ", published" if verdict.passed else "",
                           extra={"event": "ability_shrink", "step": state.step, "keep": keep,
                                  "kept": verdict.correct, "passed": verdict.passed,
                                  "lost": list(verdict.lost)})
            if verdict.passed:
                state.shrinks += 1
                return True
        return False

    def _recover(self, state: TrainerState) -> None:
        """A version passed the gate at once: a learning rate that refusals lowered comes back
        `ability_recovery`-fold, up to the configured one."""
        if state.lr_scale >= 1.0 or self.config.ability_recovery <= 1.0:
            return
        state.lr_scale = min(1.0, state.lr_scale * self.config.ability_recovery)
        self.group.set_learning_rate(self.config.learning_rate * state.lr_scale)
        logger.info("step %d: the version passed the ability gate; learning rate back up to %.3g",
                    state.step, self.config.learning_rate * state.lr_scale,
                    extra={"event": "lr_recovered", "step": state.step, "lr_scale": state.lr_scale})

    def _resume(self) -> TrainerState:
        checkpoint = self.store.load_latest()
        if checkpoint is None:
            logger.info("trainer starting fresh (no checkpoint in %s)", self.store.root,
                        extra={"event": "start", "step": 0, "run_id": self.mlflow_run.run_id})
            return TrainerState(kl_coef=self.config.kl_coef, anchor_kl_coef=self.config.cold_start_kl_coef)
        ends = self.bus.end_offsets(self.topics.samples)
        ahead = {tp: offset for tp, offset in checkpoint.offsets.items()
                 if tp.topic == self.topics.samples and offset > ends.get(tp, 0)}
        if ahead:  # Kafka would quietly restart those partitions elsewhere: never guess
            where = ", ".join(f"partition {tp.partition} at {o} (topic ends at {ends.get(tp, 0)})"
                              for tp, o in sorted(ahead.items()))
            raise CheckpointAhead(
                f"checkpoint step {checkpoint.step} in {self.store.root} has read {self.topics.samples} "
                f"further than it exists: {where}. The topic was recreated or truncated; restore it, or "
                "give trainer.checkpoint_dir a fresh folder to train the topic from its start")
        self.group.restore(checkpoint)
        logger.info("trainer resumed from step %d at offsets %s", checkpoint.step, checkpoint.offsets,
                    extra={"event": "resume", "step": checkpoint.step, "samples": checkpoint.samples,
                        "run_id": self.mlflow_run.run_id, "offsets": _offsets_field(checkpoint.offsets)})
        state = TrainerState.from_checkpoint(checkpoint)
        if self.config.kl_target is None or not state.kl_coef:  # fixed (or never adapted): the config's
            state.kl_coef = self.config.kl_coef
        if self.config.cold_start_kl_target is None or not state.anchor_kl_coef:
            state.anchor_kl_coef = self.config.cold_start_kl_coef
        return state

    # -- the loop -------------------------------------------------------------------------------
    def run(self, max_steps: int | None = None, stop: threading.Event | None = None,
            idle_exit_s: float | None = None) -> Any:
        """Run the flow on every batch until `stop` is set, `max_steps` steps were taken in this call,
        or (with `idle_exit_s`) nothing was trained that long. Returns the flow's final state (a
        `TrainerState`; the rollout flow's `HybridRun`)."""
        program: Any = self.rollout if self.kind == "rollout" else self
        stream: Any = None
        failed = True
        try:
            stream = program.open()
            taken, idle_since = 0, time.monotonic()
            for batch in stream.batch(program.batch_size, timeout=program.batch_timeout_s,
                                      idle_batches=True):
                step = Step(number=program.steps, batch=batch, stopping=stop is not None and stop.is_set())
                step.data["stream"] = stream
                # A step may outlast max.poll.interval.ms: the consumer keeps polling (its partitions
                # paused) meanwhile, so the group does not evict the trainer mid-step.
                with self._held(stream) if program.busy(batch) else nullcontext():
                    self.flow.run(step)
                if step.trained:
                    idle_since = time.monotonic()
                taken += step.counts
                if ((stop is not None and stop.is_set()) or (max_steps is not None and taken >= max_steps)
                        or (idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s)):
                    break
            failed = False
        finally:
            if stream is not None:
                stream.close()
            program.close(failed)
        return program.state

    # -- the feedback flow: what `run` needs of it, then its nodes ------------------------------------
    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    @property
    def batch_timeout_s(self) -> float:
        return self.config.batch_timeout_s

    @property
    def steps(self) -> int:
        return self.state.step if self.state is not None else 0

    def open(self) -> Stream[TrainingSample]:
        """Workers up, the run open, the state resumed; the samples stream to read from."""
        self.state = state = self._start()
        # Where to (re)start each partition: always the last durable checkpoint's offsets, kept
        # up to date below and read at every assignment, so a rebalance cannot replay trained
        # records; a partition the checkpoint never saw starts at its beginning.
        self._durable = dict(state.offsets)
        stream: Stream[TrainingSample] = Stream.from_topic(
            self.topics.samples, self.bus, group_id=self.config.group_id, start_offsets=self._durable,
            start_missing_at=0, dlq_topic=self.topics.dlq)
        if self.cold_start:  # against forgetting: a fixed share of every batch from a known set
            stream = stream.mix(self.cold_start, self.config.cold_start_weight,
                                seed=self.config.seed + state.step)
        self._dead = DeadLetters(self.bus.producer(), "trainer", self.topics.dlq)
        return stream

    def busy(self, batch: Batch[TrainingSample]) -> bool:
        """Whether a pass on `batch` does work (the consumer is held while it does)."""
        return bool(batch.items or batch.offsets) or (self.state is not None and self._due(self.state))

    @property
    def _live(self) -> TrainerState:
        if self.state is None:
            raise RuntimeError("the trainer is not running (call run)")
        return self.state

    def _score_node(self, step: Step) -> None:
        """Route the batch's samples to their losses (`routed`), hold some out for evaluation,
        dead-letter the unusable; a batch with nothing new is `idle`."""
        state, batch = self._live, step.batch
        drop_trained(batch, state.offsets)
        if not (batch.items or batch.offsets):
            step.data["idle"] = True  # only time can make something due: a publish, and its checkpoint
            step.data["routed"] = Routed()  # nothing to train: a node may still read (and filter) it
            return
        step.counts = True
        routed, held = self._score(batch.items, batch.records, self._dead)
        self.evalset.add(held)
        state.skipped += routed.skipped
        state.dead_lettered += len(routed.unusable)
        self.metrics.dead_letters.inc(len(routed.unusable))
        for tp, offset in batch.offsets.items():
            state.offsets[tp] = max(offset, state.offsets.get(tp, 0))
        step.data["routed"] = routed

    def _update_node(self, step: Step) -> None:
        """One update on `routed` (DPO/KTO, PPO on rollouts); a non-finite loss or gradient skips it
        and sends the batch's trained samples to the dead-letter topic for inspection."""
        state, routed = self._live, step.data.get("routed")
        if routed is None or not routed.trained:
            return
        step.trained = True
        if self._update(state, routed):
            state.cold_since_publish += step.batch.cold_start
            step.data["updated"] = True
            return
        trained = routed.sample_ids
        skipped = [record for sample, record in zip(step.batch.items, step.batch.records, strict=True)
                   if record is not None and sample.sample_id in trained]
        for record in skipped:
            self._dead.send(record, "the trainer's step on this batch had a non-finite loss or gradient; "
                                    "the update was skipped")
        self._dead.flush()
        state.dead_lettered += len(skipped)
        self.metrics.dead_letters.inc(len(skipped))

    def _evaluate_node(self, step: Step) -> None:
        """The held-out score, every `eval_every_steps` updates."""
        state = self._live
        if step.data.get("updated") and self.evalset and state.step % self.config.eval_every_steps == 0:
            step.metrics |= self._evaluate(state)

    def _publish_node(self, step: Step) -> None:
        """A new version when one is due (samples, time, a request, an evaluation's gain).

        Exactly one version per publish, whatever kills the trainer when: a write-ahead checkpoint
        records a fresh key first, the version is registered with that key as a tag, and a restart
        that finds the key in its checkpoint adopts the version the registry has under it (or
        publishes, if it has none) instead of training the same offsets into a second version. An
        MLflow outage fails the publish, not the trainer: it stays due and is tried again next step."""
        state = self._live
        if not self._due(state):
            return
        try:
            if state.pending_publish is not None and self._settle_pending(state) is not None:
                return  # an earlier try's version was registered after all: adopted
            if not self._gate(state):
                step.data["refused"] = True
                return
            state.pending_publish = {"key": uuid.uuid4().hex, "step": state.step, "samples": state.samples,
                                     "offsets": [[tp.topic, tp.partition, o]
                                                 for tp, o in sorted(state.offsets.items())]}
            self._checkpoint(state)  # write-ahead: from here on a restart finds the key
            failpoint("trainer.before_publish")
            step.data["published"] = self._publish(state, state.pending_publish["key"])
            failpoint("trainer.after_publish")
            self._refresh_anchor()
        except Exception as error:
            if not mlflow_outage(error):
                raise
            self.metrics.publish_failures.inc()
            logger.warning("step %d: the publish failed (%s); the trainer carries on and tries again at the "
                           "next step", state.step, error,
                           extra={"event": "publish_failed", "step": state.step, "reason": str(error)[:500]})

    def _settle_pending(self, state: TrainerState) -> PublishedVersion | None:
        """Settle `state.pending_publish`: the version registered under its key, adopted as published
        (its alias moved if the crash came before), or None when the registry has none."""
        pending = state.pending_publish
        assert pending is not None
        registered = self.settings.mlflow.registered_model
        client = self.mlflow_run.client
        found = find_published(client, registered, pending["key"])
        if found is None:
            state.pending_publish = None
            logger.info("the publish under way at step %d never reached the registry; it is published again",
                        pending["step"], extra={"event": "publish_not_found", "step": pending["step"]})
            return None
        current = alias_version(client, registered, "challenger")
        if current is None or int(current) < int(found.version):
            client.set_registered_model_alias(registered, "challenger", found.version)
        published = PublishedVersion(registered, found.version, "challenger", found.source)
        state.parent_version, state.parent_version_number = published.serving_name, published.version
        state.published_offsets = {TopicPartition(t, p): o for t, p, o in pending["offsets"]}
        state.samples_since_publish = state.samples - int(pending["samples"])
        if state.samples_since_publish == 0:  # (a restart: what fed that version is in its lineage)
            state.behaviour_versions, state.reward_mapping_versions, state.recent = set(), set(), {}
        state.eval_gain_due = False
        state.last_publish = time.time()
        state.cold_since_publish = 0
        state.pending_publish = None
        self._replay = None  # which of the batches in memory that version holds is not known: no retries
        self.published.append(published)
        self.metrics.published_version.set(int(published.version))
        self.metrics.published_at.set(state.last_publish)
        logger.warning("adopted %s (version %s), registered under the key of the publish at step %d before "
                       "the trainer stopped", published.serving_name, published.version, pending["step"],
                       extra={"event": "publish_adopted", "step": pending["step"],
                              "version": published.version, "serving_name": published.serving_name})
        if self.config.eval_holdout > 0:
            self.group.set_baseline(adapter_files(client, registered, published.version))
        return published

    def _checkpoint_node(self, step: Step) -> None:
        """Make the step durable: adapter, optimizer, RNG, offsets and state on disk."""
        if step.data.get("idle") and "published" not in step.data and "refused" not in step.data:
            return
        self._checkpoint(self._live)
        self._durable.update(self._live.offsets)  # where any (re)assigned partition starts from now on

    def _commit_node(self, step: Step) -> None:
        """Then commit the batch's offsets (after the checkpoint that holds its update)."""
        if not step.data.get("idle"):
            failpoint("trainer.before_commit")
            self._commit(step.batch, self._live)

    @staticmethod
    def _held(stream: Stream[Any]) -> AbstractContextManager[None]:
        return stream.consumer.hold() if stream.consumer is not None else nullcontext()

    def _commit(self, batch: Batch[TrainingSample], state: TrainerState) -> None:
        """Commit the batch's offsets where this trainer still owns the partition. A commit the group
        refuses (a rebalance moved partitions, or the group evicted this member) loses nothing: the
        checkpoint holds the offsets, the consumer re-joins on its next poll and every partition it gets
        back starts from them. So the trainer carries on."""
        if batch.consumer is None or not batch.offsets:
            return
        try:
            refused: object = batch.consumer.commit_owned(batch.offsets)
        except CommitFailed as exc:
            refused = exc
        if not refused:
            return
        self.metrics.commits_refused.inc()
        logger.warning("step %d: the group refused the commit (%s); the checkpoint holds offsets %s, and the "
                       "trainer re-joins and resumes from them", state.step, refused,
                       _offsets_field(state.offsets),
                       extra={"event": "commit_refused", "step": state.step, "reason": str(refused)})

    def close(self, failed: bool = False) -> None:
        """End the MLflow run and stop the policy workers (their CPUs go back to Ray)."""
        try:
            if self._run is not None:
                self._run.close(failed)
        finally:
            if self._group is not None:
                self._group.close()
                self._group = None

    @property
    def group(self) -> WorkerGroup:
        if self._group is None:
            raise RuntimeError("the trainer's workers are not running (call run)")
        return self._group

    @property
    def mlflow_run(self) -> TrainingRun:
        """This lifetime's MLflow run (kept, finished, after `run` returns)."""
        if self._run is None:
            raise RuntimeError("the trainer has not opened its MLflow run (call run)")
        return self._run

    @property
    def config_hash(self) -> str:
        """The hash of the resolved config its versions carry (known once the run is open)."""
        return self.mlflow_run.config_hash

    def _score(self, items: list[TrainingSample], records: list[Any],
               dead: DeadLetters) -> tuple[Routed, Routed]:
        """(to train, held out for evaluation); unusable samples are dead-lettered."""
        anchors: list[TrainingSample] = []
        if self.config.cold_start_loss == "kl":  # cold-start items (no record) only hold the KL term
            anchors = [s for s, r in zip(items, records, strict=True) if r is None]
            items, records = ([s for s, r in zip(items, records, strict=True) if r is not None],
                              [r for r in records if r is not None])
        routed = route(items, self.config.algorithm, self.settings.model.name, self.context, self.vocab)
        routed.anchors = anchor_sequences(anchors)
        live_held = {s.sample_id for s, r in zip(items, records, strict=True)
                     if r is not None and held_out(s.sample_id, self.config.eval_holdout)}
        if routed.unusable:
            by_id = {id(sample): record for sample, record in zip(items, records, strict=True)}
            for sample, reason in routed.unusable:
                record = by_id.get(id(sample))
                if record is not None:
                    dead.send(record, f"trainer cannot use sample {sample.sample_id}: {reason}")
                logger.warning("dead-lettered sample %s: %s", sample.sample_id, reason,
                               extra={"event": "dead_letter", "sample_id": sample.sample_id,
                                      "reason": reason})
            dead.flush()  # the dead letters are durable before their offsets are committed
        kept, held = routed.split(live_held.__contains__)
        if self.config.pair_thumbs:  # live thumbs only: the cold-start set keeps its own role
            cold = {s.sample_id for s, r in zip(items, records, strict=True) if r is None}
            kept = self.pairer.pair(kept, cold)
        return kept, held

    def _update(self, state: TrainerState, routed: Routed) -> bool:
        """One update on `routed`; False (and nothing counted) when its loss or gradient was not finite."""
        logger.info("step %d started: %d samples", state.step + 1, routed.trained,
                    extra={"event": "step_started", "step": state.step + 1, "batch": routed.trained})
        metrics: dict[str, float] = {}
        adaptive = self.config.cold_start_kl_target is not None
        ups = sum(1 for _, _, up in routed.thumbs if up)
        weights = self._kto_weights(state.thumbs_up + ups, state.thumbs_down + len(routed.thumbs) - ups)
        coef = state.anchor_kl_coef if adaptive else None
        rehearsal: dict[str, float] = {}
        if self.rehearsal and (routed.pairs or routed.thumbs) and not routed.rehearsed:
            rehearsal = self._rehearse(routed, state.step + 1)
        if routed.pairs or routed.thumbs:
            metrics = self.group.train_step(routed, coef, weights) | rehearsal
        if routed.rollouts:
            self._replay = None
        if weights is not None and routed.thumbs:
            metrics |= {"kto_desirable_weight": weights[0], "kto_undesirable_weight": weights[1]}
        if self.config.pair_thumbs and metrics:
            metrics |= {"thumb_pairs": float(len(routed.paired_thumb_ids)),
                        "thumbs_awaiting_pair": float(len(self.pairer))}
        if routed.rollouts and not metrics.get("nonfinite"):
            metrics = _merge_steps(metrics, self._ppo(state, routed))
        failpoint("trainer.mid_step")
        if metrics.get("nonfinite"):
            logger.error("step %d: the loss or the gradient was not finite (loss %s); update skipped, the "
                         "batch dead-lettered", state.step + 1, metrics.get("loss"),
                         extra={"event": "step_nonfinite", "step": state.step + 1, "batch": routed.trained})
            return False
        if routed.pairs or routed.thumbs:  # a step that counts: the gate's retries may train it again
            self._remember(routed, coef, weights)
        if routed.anchors and (routed.pairs or routed.thumbs):
            metrics["anchor_kl_coef"] = state.anchor_kl_coef  # the weight this step trained with
            if adaptive and "anchor_kl" in metrics:
                state.anchor_kl_coef = adapt_anchor_coef(
                    state.anchor_kl_coef, metrics["anchor_kl"], self.config.cold_start_kl_target or 0.0,
                    self.config.cold_start_kl_coef, self.config.cold_start_kl_rate)
        state.thumbs_up += ups
        state.thumbs_down += len(routed.thumbs) - ups
        state.step += 1
        users = routed.trained - routed.rehearsed  # rehearsal pairs are not users' samples
        state.samples += users
        state.samples_since_publish += users
        state.behaviour_versions |= routed.behaviour_versions
        state.reward_mapping_versions |= routed.reward_mapping_versions
        for name, value in metrics.items():
            state.recent.setdefault(name, []).append(value)
        metrics |= {"samples": state.samples, "lag": self._lag(state)}
        self.metrics.steps.inc()
        self.metrics.samples.inc(users)
        self.metrics.lag.set(metrics["lag"])
        self.metrics.loss.set(metrics["loss"])
        self.metrics.step_seconds.observe(metrics["step_s"])
        self.metrics.stepped_at.set(time.time())
        self.mlflow_run.log_metrics(metrics, state.step)
        self.metrics.metrics_waiting.set(self.mlflow_run.metrics_waiting)
        logger.info("step %d: %d samples, loss %.4f, %.0f tokens/s", state.step, routed.trained,
                    metrics["loss"], metrics["tokens_per_s"],
                    extra={"event": "step", "step": state.step, "batch": routed.trained} | metrics)
        return True

    def _kto_weights(self, ups: int, downs: int) -> tuple[float, float] | None:
        """KTO's (desirable, undesirable) weights for a step when trainer.kto_balance is set (from the
        thumbs trained so far, this batch's included); None: the spec's, fixed."""
        if self.config.kto_balance is None:
            return None
        config = balanced_weights(ups, downs, self.specs[0].kto, self.config.kto_balance)
        return config.desirable_weight, config.undesirable_weight

    def _ppo(self, state: TrainerState, routed: Routed) -> dict[str, float]:
        """PPO on the batch's rollouts: score (policy ranks + critic), advantages here, then update."""
        scored, values = self.group.ppo_score(routed)
        old, ref = [o for o, _ in scored], [r for _, r in scored]
        out = advantages_for(routed.rollouts, old, ref, values, self.ppo_config, state.kl_coef)
        metrics = self.group.ppo_train(routed, old, out.advantages, out.returns, values)
        if self.config.kl_target is not None and not metrics.get("nonfinite"):
            controller = AdaptiveKLController(self.ppo_config.kl)
            controller.value = state.kl_coef
            state.kl_coef = controller.update(out.sequence_kl, len(routed.rollouts))
        tokens = sum(len(completion) + len(prompt) for prompt, completion, _, _ in routed.rollouts)
        return metrics | {"ppo_reward": out.mean_reward, "ppo_kl": out.sequence_kl, "kl_coef": state.kl_coef,
                          "ppo_tokens": float(tokens), "rollouts": float(len(routed.rollouts))}

    def _lag(self, state: TrainerState) -> float:
        """Samples on the topic not trained yet; while the bus cannot say (it is away), the last figure:
        a metric never ends a step."""
        try:
            ends = self.bus.end_offsets(self.topics.samples)
        except BusError as exc:
            logger.warning("trainer lag unknown (%s); reporting the last figure, %.0f", exc, self._last_lag)
            return self._last_lag
        self._last_lag = float(sum(max(0, end - state.offsets.get(tp, 0)) for tp, end in ends.items()))
        return self._last_lag

    def request_publish(self) -> None:
        """Publish a version after the current step (or at once when idle), if anything was trained since
        the last one; safe from any thread."""
        self._publish_requested.set()

    def _due(self, state: TrainerState) -> bool:
        if state.samples_since_publish == 0:
            return False
        return (self._publish_requested.is_set() or state.eval_gain_due
                or state.samples_since_publish >= self.config.publish_every_samples
                or time.time() - state.last_publish >= self.config.publish_every_s)

    def _checkpoint(self, state: TrainerState) -> None:
        state.eval_entries = self.evalset.to_metadata()
        snapshot = self.group.snapshot()
        self.store.save(Checkpoint(step=state.step, samples=state.samples, offsets=dict(state.offsets),
                                   adapter=snapshot["adapter"], optimizer=snapshot["optimizer"],
                                   rng=snapshot["rng"], metadata=state.metadata(), critic=snapshot["critic"]))
        logger.debug("checkpoint at step %d", state.step,
                     extra={"event": "checkpoint", "step": state.step,
                            "offsets": _offsets_field(state.offsets)})

    def _publish(self, state: TrainerState, key: str | None = None) -> PublishedVersion:
        offsets = offset_ranges(state.offsets, state.published_offsets)
        evaluation = {f"train_{k}": sum(v) / len(v) for k, v in state.recent.items()
                      if k in ("dpo_accuracy", "dpo_margin", "kto_reward", "loss")}
        if self.evalset:  # the version's own held-out figures
            evaluation |= self._evaluate(state, publishing=True)
        lineage = VersionLineage(offsets=offsets, behaviour_versions=state.behaviour_versions,
                                 reward_mapping_versions=state.reward_mapping_versions,
                                 parent_version=state.parent_version, eval=evaluation,
                                 cold_start=self._cold_start_lineage(state), kl_anchor=self.kl_anchor)

        def save(folder: Path) -> None:
            self.group.save_adapter(str(folder))

        def compare_with(folder: Path) -> None:  # the next evaluations compare with this version
            self.group.set_baseline(folder_files(folder))

        published = self.mlflow_run.publish(save, lineage, artifact_path=f"adapters/step-{state.step:09d}",
                                            then=compare_with if self.config.eval_holdout > 0 else None,
                                            publish_key=key)
        state.pending_publish = None
        state.parent_version, state.parent_version_number = published.serving_name, published.version
        state.eval_gain_due = False
        self._publish_requested.clear()
        state.published_offsets = dict(state.offsets)
        state.samples_since_publish = 0
        state.last_publish = time.time()
        state.behaviour_versions, state.reward_mapping_versions, state.recent = set(), set(), {}
        state.cold_since_publish = 0
        self._replay = []
        self.published.append(published)
        self.metrics.published_version.set(int(published.version))
        self.metrics.published_at.set(state.last_publish)
        logger.info("published %s (version %s) at step %d", published.serving_name, published.version,
                    state.step, extra={"event": "published", "step": state.step, "version": published.version,
                                    "serving_name": published.serving_name, "offsets": offsets})
        return published

    def _evaluate(self, state: TrainerState, publishing: bool = False) -> dict[str, float]:
        """Score the held-out set; log it; flag a publish when the gain over the last version is enough."""
        result = self.group.evaluate(self.evalset.pairs, self.evalset.thumbs)
        gain = eval_gain(result)
        threshold = self.config.publish_on_eval_gain
        if not publishing and threshold is not None and gain >= threshold:
            state.eval_gain_due = True
        self.mlflow_run.log_metrics(result | {"eval_gain": gain}, state.step)
        logger.info("step %d: held-out score %.4f (%+.4f over the last version) on %d samples", state.step,
                    result["eval_score"], gain, len(self.evalset),
                    extra={"event": "eval", "step": state.step, "eval_gain": gain} | result)
        return result | {"eval_gain": gain}

    def _refresh_anchor(self) -> None:
        """With `kl_anchor: champion`, hold the KL term to the version the `champion` alias names now."""
        if self.config.kl_anchor != "champion":
            return
        client = self.mlflow_run.client
        registered = self.settings.mlflow.registered_model
        version = alias_version(client, registered, "champion")
        if version == self.anchor_version:
            return
        files = adapter_files(client, registered, version) if version is not None else None
        if files is not None:
            base = json.loads(files[LINEAGE_NAME]).get("base_model")
            if base != self.settings.model.name:
                logger.error("champion %s was trained on %r, not on %r: the KL anchor stays where it was",
                             serving_name(registered, version or ""), base, self.settings.model.name)
                return
        self.group.set_anchor(files)
        self.anchor_version = version
        self.kl_anchor = serving_name(registered, version) if version is not None else "base"
        logger.info("KL anchor: %s", self.kl_anchor, extra={"event": "kl_anchor", "anchor": self.kl_anchor})


    def _cold_start_lineage(self, state: TrainerState) -> dict[str, str | float | int] | None:
        if not self.cold_start:
            return None
        lineage: dict[str, str | float | int] = {
            "sha256": self.cold_start_sha256, "weight": self.config.cold_start_weight,
            "loss": self.config.cold_start_loss, "kl_coef": self.config.cold_start_kl_coef,
            "file_samples": len(self.cold_start), "mixed_in": state.cold_since_publish}
        if self.config.cold_start_kl_target is not None:  # adapted: the target and the weight reached
            lineage |= {"kl_target": self.config.cold_start_kl_target, "kl_coef_now": state.anchor_kl_coef}
        return lineage


def _merge_steps(step: dict[str, float], ppo: dict[str, float]) -> dict[str, float]:
    """One row of metrics for a batch that had a DPO/KTO step, a PPO step, or both."""
    seconds = step.get("step_s", 0.0) + ppo["step_s"]
    tokens = step.get("tokens_per_s", 0.0) * step.get("step_s", 0.0) + ppo["ppo_tokens"]
    samples = step.get("samples_per_s", 0.0) * step.get("step_s", 0.0) + ppo["rollouts"]
    merged = ppo | step | {"step_s": seconds, "tokens_per_s": tokens / seconds,
                           "samples_per_s": samples / seconds, "ppo_grad_norm": ppo["grad_norm"]}
    merged["loss"] = step.get("loss", 0.0) + ppo["ppo_loss"]
    return merged


def drop_trained(batch: Batch[Any], trained_up_to: Mapping[TopicPartition, int]) -> None:
    """Remove from `batch` the items already trained on (re-read after a rebalance, below the
    partition's trained offset) and second reads of a record within the batch."""
    seen: set[tuple[TopicPartition, int]] = set()
    items, records = [], []
    for item, record in zip(batch.items, batch.records, strict=True):
        if record is not None:
            key = (record.tp, record.offset)
            if record.offset < trained_up_to.get(record.tp, 0) or key in seen:
                continue
            seen.add(key)
        items.append(item)
        records.append(record)
    batch.items, batch.records = items, records


def _offsets_field(offsets: Mapping[TopicPartition, int]) -> dict[str, int]:
    return {f"{tp.topic}/{tp.partition}": offset for tp, offset in sorted(offsets.items())}
