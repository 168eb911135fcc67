"""Learning-step benchmark: our DPO step against TRL's DPOTrainer, like for like, over alternated rounds.

    .venv/bin/python bench/algos.py [--steps 6] [--batch 8] [--rounds 3] [--precision auto|fp32[,bf16]]
    .venv/bin/python bench/algos.py --smoke     # 2 steps of 2 pairs, 1 round, fp32: checks the fields

Both sides train the embedded model (SmolLM2-135M-Instruct) for `--steps` steps of `--batch` pairs with
the same settings: a LoRA adapter r=8, alpha=16, dropout 0 on q,k,v,o; sigmoid DPO loss, beta 0.1;
reference = the same model with the adapter disabled (as TRL does for PEFT models); AdamW (torch's fused
kernel, TRL's default `adamw_torch_fused`), lr 5e-5 constant, no warm-up, no weight decay; gradients
clipped to norm 1.0 (TRL's `max_grad_norm`); no gradient checkpointing.
1. TRL: `DPOTrainer` with `gradient_checkpointing=False` (TRL's default is True, which recomputes the
   forward pass during the backward one; the run stops if the built trainer checkpoints anyway). Its
   batches (its shuffling with seed 0, its tokenisation, `max_length` 128 with nothing truncated), its
   loss at each step (what its `compute_loss` returns) and its adapter's initial weights are recorded.
2. Ours: `online_rl.algos.batch.dpo_batch_loss` with the same optimizer and clipping, from a fresh copy
   of the model whose adapter starts from TRL's initial weights, on exactly TRL's batches in its order.
   (Both sides seed the adapter alike, but in bf16 TRL draws it in bfloat16 before casting it to
   float32, so its start is copied rather than drawn again.)

Rounds: the sides alternate (TRL then ours, ours then TRL, ...: `bench.common.alternated`), each round
running every precision. TRL's draw is deterministic, and checked: each TRL run must draw the batches of
the first, which ours replays, also in rounds where ours runs first.

Losses: at every step of every round, ours must match TRL's within `loss_tolerance` (relative to
TRL's): 3e-5 in fp32, where only rounding differs; 0.25 / sqrt(batch) in bf16, where bfloat16
rounding noise in the policy-reference log-ratio outweighs the log-ratio itself early in training,
so that check only catches gross faults. Step 1's loss is ln 2 on both sides by construction (LoRA's B
starts at zero: the policy is the reference), so the check bites from step 2 on, once each side has
made an update; `loss_max_rel_move` (how far TRL's loss moved from ln 2) shows what it could resolve
against `loss_max_rel_diff`. If any step differs by more, `losses_match` is false and the run exits
with status 1 after the JSON line.

Speed: the first step of each run warms up and is not timed. Tokens/s counts the same tokens for both
sides: each pair's chosen and rejected sequences (prompt + completion, each) over the timed steps' wall
time; the ratio is ours / TRL within one round. Figures are medians over the rounds, with their range.
`bf16` is mixed precision on both sides: frozen base weights stored in bfloat16, LoRA weights in
float32, matrix products under bfloat16 autocast; `fp32` is float32 throughout. MFU is the model FLOP/s
of our step (forward and backward of the policy, forward of the reference; prompts counted once, as
computed) over the rate a large matrix product reaches here in the same precision (the VM hides its
clock, so the datasheet peak is unknown; `peak_gflops` reports the measured one).

`--precision auto` (the default) runs fp32, and bf16 too where `precision: auto` picks it here; fp32
always runs, as the tight like-for-like check. The last line of output is one JSON object with every
name in `FIELDS`: the sizes and `threads`; `baseline_gradient_checkpointing` (false) and
`max_grad_norm`; per precision `losses_match`, `loss_tolerance`, `loss_max_rel_diff`,
`loss_max_rel_move` and `losses` (round 1's per-step losses of each side); `ratio_vs_trl` (ours / TRL
tokens/s, median over the rounds) with `ratio_vs_trl_range` ([min, max]), and the medians `mfu`,
`ours_tokens_per_s`, `trl_tokens_per_s`, `peak_gflops`, all in `precision` (bf16 when it ran, else
fp32), the same names with `_fp32` in float32 (an fp32-only run gives both the same figures); and
`machine`. A run with bf16 adds `ratio_bf16_vs_trl_fp32` (our bf16 step against TRL in float32).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.common import alternated, emit, precisions, spread
from online_rl.algos import DPOConfig
from online_rl.algos.batch import Precision, dpo_batch_loss
from online_rl.algos.policy import LoraSpec, lora_policy, trainable_parameters
from online_rl.config import load_settings
from online_rl.models import prepare_embedded_model

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.",
             "Explain photosynthesis simply.", "List three prime numbers and say why they are prime.",
             "What is 12 times 7?",
             "Tell me a short story about a cat who learns to swim.", "How do airplanes stay in the air?",
             "Give me a recipe for pancakes.", "Why is the sky blue?", "Summarise the plot of Hamlet."]
WORDS = ["the", "answer", "is", "simple", "because", "light", "water", "air", "plants", "energy", "sun",
         "cat", "story", "flour", "eggs", "milk", "wing", "lift", "pressure", "prime", "number", "divisible",
         "only", "by", "one", "and", "itself", "blue", "scatter"]
LR = 5e-5
BETA = 0.1
MAX_GRAD_NORM = 1.0
SEED = 0
MAX_LENGTH = 128
SIDES = ("trl", "ours")
# How far apart the two sides' loss may lie at a step, relative to TRL's (see `loss_tolerance`).
FP32_LOSS_TOLERANCE = 3e-5
BF16_LOSS_TOLERANCE_BATCH_1 = 0.25  # divided by sqrt(batch)
# The JSON fields every run prints (CI's smoke test checks them with `bench.common.missing_fields`).
FIELDS: tuple[str, ...] = (
    "batch", "steps", "rounds", "threads", "precision", "precisions",
    "baseline_gradient_checkpointing", "max_grad_norm", "losses_match", "loss_tolerance",
    "loss_max_rel_diff", "loss_max_rel_move", "losses",
    "ratio_vs_trl", "ratio_vs_trl_range", "ratio_vs_trl_fp32", "ratio_vs_trl_fp32_range",
    "mfu", "mfu_fp32", "ours_tokens_per_s", "ours_tokens_per_s_fp32",
    "trl_tokens_per_s", "trl_tokens_per_s_fp32", "peak_gflops", "peak_gflops_fp32", "machine",
)
Pair = tuple[list[int], list[int], list[int]]
Adapter = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Run:
    """One side's run: each step's wall time (s) and loss."""

    times: list[float]
    losses: list[float]


@dataclass(frozen=True)
class Draw:
    """What TRL drew in a precision: its batches (token ids, in order) and its adapter's start."""

    batches: list[list[Pair]]
    adapter: Adapter


def dataset(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Prompts and answers of varied length (8-60 words), deterministic."""
    rng = random.Random(seed)

    def answer() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 60))) + "."

    return [{"prompt": QUESTIONS[i % len(QUESTIONS)] + f" ({i})", "chosen": answer(), "rejected": answer()}
            for i in range(count)]


def load_model(path: Path, precision: Precision) -> Any:
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype)


def sequence_tokens(pairs: Sequence[Pair]) -> int:
    return sum(2 * len(p) + len(c) + len(r) for p, c, r in pairs)


def adapter_state(model: Any) -> Adapter:
    return {name: p.detach().float().clone() for name, p in trainable_parameters(model).items()}


def optimizer_for(parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """AdamW as TRL's default `adamw_torch_fused` builds it with TRL's defaults (no weight decay)."""
    return torch.optim.AdamW(parameters, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)


def check_like_for_like(trainer: Any, after_training: bool = False) -> None:
    """Stop unless TRL runs as our step does: no gradient checkpointing, clipping to 1.0, our optimizer."""
    checkpointing = (trainer.args.gradient_checkpointing,
                     trainer.accelerator.unwrap_model(trainer.model).is_gradient_checkpointing)
    if checkpointing != (False, False):
        raise SystemExit(f"TRL checkpoints gradients (args.gradient_checkpointing, model's "
                         f"is_gradient_checkpointing = {checkpointing}) and we do not: the sides would not "
                         "compute alike; pass gradient_checkpointing=False in trl_trainer's DPOConfig")
    if trainer.args.max_grad_norm != MAX_GRAD_NORM:
        raise SystemExit(f"TRL clips gradients to norm {trainer.args.max_grad_norm}, ours to "
                         f"{MAX_GRAD_NORM}: set max_grad_norm in trl_trainer's DPOConfig")
    if after_training:
        optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
        expected = optimizer_for([torch.zeros(1)]).defaults
        # the Trainer sets weight decay per parameter group, so compare the groups
        got = [{k: group.get(k) for k in ("lr", "betas", "eps", "weight_decay", "fused")}
               for group in optimizer.param_groups]
        if type(optimizer) is not torch.optim.AdamW or any(g != {k: expected[k] for k in g} for g in got):
            raise SystemExit(f"TRL's optimizer is {type(optimizer).__name__} with groups {got}, ours AdamW "
                             f"{expected}: align optimizer_for with TRL's")


def trl_data(model_dir: Path, rows: list[dict[str, str]]) -> tuple[Any, Any]:
    """The tokenizer and the rows as a dataset of chat-templated prompts."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                             add_generation_prompt=True) for r in rows]
    return tokenizer, Dataset.from_list([{**r, "prompt": p} for r, p in zip(rows, prompts, strict=True)])


def trl_trainer(model_dir: Path, data: tuple[Any, Any], spec: LoraSpec, batch: int, steps: int,
                precision: Precision, out: str, callbacks: list[Any]) -> Any:
    """TRL's DPOTrainer set up as our step runs (checked), its adapter seeded."""
    from peft import LoraConfig
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    tokenizer, dataset_ = data
    args = TRLConfig(output_dir=out, per_device_train_batch_size=batch, max_steps=steps,
                     max_length=MAX_LENGTH, learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0,
                     weight_decay=0.0, beta=BETA, loss_type=["sigmoid"], max_grad_norm=MAX_GRAD_NORM,
                     gradient_checkpointing=False, bf16=precision == "bf16", seed=SEED, use_cpu=True,
                     dataloader_num_workers=0, logging_steps=10_000, save_strategy="no", report_to=[],
                     disable_tqdm=True)
    peft = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                      target_modules=list(spec.targets), task_type="CAUSAL_LM")
    model = load_model(model_dir, precision)
    torch.manual_seed(SEED)  # the adapter's initial weights (ours seeds the same way)
    trainer = DPOTrainer(model=model, args=args, train_dataset=dataset_, processing_class=tokenizer,
                         peft_config=peft, callbacks=callbacks)
    check_like_for_like(trainer)
    return trainer


def run_trl(model_dir: Path, data: tuple[Any, Any], spec: LoraSpec, batch: int, steps: int,
            precision: Precision) -> tuple[Draw, Run]:
    """Train with TRL; return what it drew and its run."""
    from transformers import TrainerCallback

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        trainer = trl_trainer(model_dir, data, spec, batch, steps, precision, out, [Clock()])
        start_adapter = adapter_state(trainer.model)
        drawn: list[list[Pair]] = []
        losses: list[torch.Tensor] = []
        collate, compute_loss = trainer.data_collator, trainer.compute_loss

        def recording_collate(examples: list[dict[str, Any]]) -> Any:
            drawn.append([(list(e["prompt_ids"]), list(e["chosen_ids"]), list(e["rejected_ids"]))
                          for e in examples])
            return collate(examples)

        def recording_loss(*args: Any, **kwargs: Any) -> Any:
            loss = compute_loss(*args, **kwargs)
            losses.append(loss.detach())
            return loss

        trainer.data_collator, trainer.compute_loss = recording_collate, recording_loss
        start = time.perf_counter()
        trainer.train()
        check_like_for_like(trainer, after_training=True)
    longest = max(len(p) + max(len(c), len(r)) for batch_ in drawn for p, c, r in batch_)
    if longest > MAX_LENGTH:
        raise SystemExit(f"a pair has {longest} tokens: TRL would truncate it to max_length {MAX_LENGTH} and "
                         "the two sides would not do the same work; shorten the answers in dataset()")
    times = [b - a for a, b in itertools.pairwise([start, *ends])]
    return Draw(drawn[:steps], start_adapter), Run(times, [loss.item() for loss in losses])


def run_ours(model_dir: Path, draw: Draw, spec: LoraSpec, precision: Precision) -> Run:
    """Train our step on TRL's batches, from TRL's initial adapter."""
    torch.manual_seed(SEED)
    policy = lora_policy(load_model(model_dir, "fp32"), spec, precision)
    lora = trainable_parameters(policy)
    with torch.no_grad():
        for name, parameter in lora.items():
            parameter.copy_(draw.adapter[name])
    policy.train()
    parameters = list(lora.values())
    optimizer = optimizer_for(parameters)
    config = DPOConfig(beta=BETA)
    times, losses = [], []
    for pairs in draw.batches:
        start = time.perf_counter()
        loss = dpo_batch_loss(policy, pairs, config, precision=precision).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(loss.detach())
    return Run(times, [loss.item() for loss in losses])


def step_flops(config: Any, pairs: Sequence[Pair], spec: LoraSpec) -> float:
    """Model FLOPs of our step: policy forward + backward (input gradients through frozen weights, LoRA
    weight gradients) + reference forward, with each prompt once and the LM head on completion tokens."""
    c = config
    d, layers, heads, kv = c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads
    head_dim = getattr(c, "head_dim", None) or d // heads
    q_size = heads * head_dim
    per_token_linear = layers * 2 * (d * q_size * 2 + d * kv * head_dim * 2 + 3 * d * c.intermediate_size)
    # LoRA on q, k, v, o: 2 r (in + out) per adapted product
    lora_per_token = layers * 2 * spec.rank * (4 * d + 2 * q_size + 2 * kv * head_dim)
    base = lora = attention = 0.0
    for p, ch, rj in pairs:
        tokens = len(p) + len(ch) + len(rj)
        # attention: each query against the keys it sees (prompt + its own branch), QK and AV
        seen = sum(range(1, len(p) + 1)) + sum(len(p) + i for b in (ch, rj) for i in range(1, len(b) + 1))
        base += tokens * per_token_linear + (len(ch) + len(rj)) * 2 * d * c.vocab_size
        lora += tokens * lora_per_token
        attention += layers * 4 * q_size * seen
    reference = base + attention  # adapter disabled
    policy = base + lora + attention
    # backward: input gradients through every product (= the forward's), attention twice (dQ, dK, dV,
    # dP), LoRA weight gradients (= the LoRA forward)
    backward = base + 2 * lora + 2 * attention
    return reference + policy + backward


def peak_flops(dtype: torch.dtype, size: int = 2048, repeats: int = 8) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(2):
        a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def loss_tolerance(precision: str, batch: int) -> float:
    """The largest relative difference between the sides' losses at one step that still counts as a match.

    fp32: the sides compute in a different order (TRL pads each sequence, we pack each prompt once), so
    their sequence log-probabilities differ by float32 rounding: at equal weights the losses differ by
    ~2e-6 (relative), and by at most ~7e-6 after six steps, the updates not drifting apart. 3e-5 allows
    for that and stays far below how much a step moves the loss (~5e-4 relative after one step of
    2 pairs; `loss_max_rel_move`), so a wrong update (sign, scale, batch) would not pass.
    bf16: rounding dominates. A pair's log-ratio log(pi / pi_ref) comes from two bfloat16 passes that
    round apart; early in training it is ~0.01-0.04 nats in float32 but 0.4-1.1 in bfloat16 on either
    side. Measured against float32 at the same weights, each side's loss is off by 3.1% (standard
    deviation) at 2 pairs and 1.2% at 8, so the sides differ by ~0.06 / sqrt(batch); the tolerance is
    about four of those. It catches gross faults only; the fp32 check, which always runs, is the tight one.
    """
    return FP32_LOSS_TOLERANCE if precision == "fp32" else BF16_LOSS_TOLERANCE_BATCH_1 / math.sqrt(batch)


def loss_rel_diff(trl: Run, ours: Run) -> float:
    """The largest relative difference between the two sides' loss at the same step."""
    if len(trl.losses) != len(ours.losses):
        raise SystemExit(f"TRL logged {len(trl.losses)} losses and ours {len(ours.losses)}: the sides did "
                         "not run the same steps")
    return max(abs(o - t) / abs(t) for t, o in zip(trl.losses, ours.losses, strict=True))


def loss_rel_move(run: Run) -> float:
    """How far the loss moved from its start, ln 2, relative: what the loss comparison can resolve."""
    return max(abs(loss - math.log(2)) for loss in run.losses) / math.log(2)


@dataclass(frozen=True)
class Round:
    """Both sides' runs in one precision in one round, and the matrix-product peak measured after them."""

    trl: Run
    ours: Run
    peak: float


def run_rounds(model_dir: Path, spec: LoraSpec, options: argparse.Namespace,
               chosen: list[Precision]) -> tuple[dict[str, Draw], dict[str, list[Round]]]:
    """Every precision in every round, the sides alternating; TRL runs first in round 1."""
    data = trl_data(model_dir, dataset(options.batch * options.steps))
    draws: dict[str, Draw] = {}
    rounds: dict[str, list[Round]] = {p: [] for p in chosen}
    for number, order in enumerate(alternated(options.rounds, SIDES), 1):
        for precision in chosen:
            runs: dict[str, Run] = {}
            for side in order:
                if side == "ours":
                    runs[side] = run_ours(model_dir, draws[precision], spec, precision)
                    continue
                draw, runs[side] = run_trl(model_dir, data, spec, options.batch, options.steps, precision)
                first = draws.setdefault(precision, draw)
                if draw.batches != first.batches or any(not torch.equal(draw.adapter[k], v)
                                                        for k, v in first.adapter.items()):
                    raise SystemExit(f"TRL drew other batches or another initial adapter in round {number} "
                                     "than in round 1 although seeded alike: ours could not replay them")
            peak = peak_flops(torch.bfloat16 if precision == "bf16" else torch.float32)
            rounds[precision].append(Round(runs["trl"], runs["ours"], peak))
            print_round(number, order, precision, runs)
    return draws, rounds


def print_round(number: int, order: list[str], precision: str, runs: dict[str, Run]) -> None:
    print(f"round {number} {precision} ({' then '.join(order)}): "
          f"TRL {[round(t, 2) for t in runs['trl'].times]} s/step, "
          f"ours {[round(t, 2) for t in runs['ours'].times]} s/step, "
          f"ratio {sum(runs['trl'].times[1:]) / sum(runs['ours'].times[1:]):.2f}x", flush=True)
    print(f"  losses TRL  {[f'{x:.7f}' for x in runs['trl'].losses]}\n"
          f"  losses ours {[f'{x:.7f}' for x in runs['ours'].losses]}\n"
          f"  largest relative difference {loss_rel_diff(runs['trl'], runs['ours']):.2e}, largest move "
          f"from ln 2 {loss_rel_move(runs['trl']):.2e}", flush=True)


def figures(batches: list[list[Pair]], rounds: list[Round], model_config: Any, spec: LoraSpec,
            suffix: str) -> dict[str, Any]:
    """Medians over the rounds (and the ratio's range), names ending in `suffix`; the first step of each
    run is not timed."""
    timed = batches[1:]
    tokens = sum(sequence_tokens(b) for b in timed)
    flops = sum(step_flops(model_config, b, spec) for b in timed)
    trl = [tokens / sum(r.trl.times[1:]) for r in rounds]
    ours = [tokens / sum(r.ours.times[1:]) for r in rounds]
    ratio = spread([o / t for o, t in zip(ours, trl, strict=True)], digits=2)
    return {
        f"ratio_vs_trl{suffix}": ratio["median"], f"ratio_vs_trl{suffix}_range": [ratio["min"], ratio["max"]],
        f"mfu{suffix}": spread([flops / sum(r.ours.times[1:]) / r.peak for r in rounds])["median"],
        f"ours_tokens_per_s{suffix}": spread(ours, digits=1)["median"],
        f"trl_tokens_per_s{suffix}": spread(trl, digits=1)["median"],
        f"peak_gflops{suffix}": spread([r.peak / 1e9 for r in rounds], digits=0)["median"],
    }


def parse_options() -> tuple[argparse.Namespace, list[Precision]]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6,
                        help="steps per side and run (the first is a warm-up)")
    parser.add_argument("--batch", type=int, default=8, help="pairs per step")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds, the sides alternating which runs first")
    parser.add_argument("--precision", default="auto",
                        help="auto (fp32, and bf16 where auto picks it here) or comma-separated: fp32, bf16")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes (2 steps of 2 pairs, 1 round, fp32) that still print every field")
    options = parser.parse_args()
    if options.smoke:
        options.steps, options.batch, options.rounds, options.precision = 2, 2, 1, "fp32"
    if options.steps < 2 or options.batch < 1 or options.rounds < 1:
        parser.error("--steps must be at least 2 (the first is not timed), --batch and --rounds at least 1")
    chosen = precisions(options.precision)
    if "fp32" not in chosen or not set(chosen) <= {"fp32", "bf16"}:
        parser.error(f"--precision {options.precision}: give fp32 or fp32,bf16 (fp32 always runs: it is "
                     "the like-for-like baseline every result line reports)")
    return options, [p for p in ("fp32", "bf16") if p in chosen]


def loss_fields(rounds: dict[str, list[Round]], batch: int) -> dict[str, Any]:
    """The loss comparison: per precision the tolerance, the largest difference and move over the rounds,
    the first round's losses, and whether every step of every round matched."""

    def short(value: float) -> float:
        return float(f"{value:.2e}")

    tolerance = {p: short(loss_tolerance(p, batch)) for p in rounds}
    differences = {p: short(max(loss_rel_diff(r.trl, r.ours) for r in runs)) for p, runs in rounds.items()}
    moves = {p: short(max(loss_rel_move(r.trl) for r in runs)) for p, runs in rounds.items()}
    return {
        "losses_match": all(differences[p] <= tolerance[p] for p in rounds),
        "loss_tolerance": tolerance,
        "loss_max_rel_diff": differences,
        "loss_max_rel_move": moves,
        "losses": {p: {side: [round(x, 7) for x in getattr(runs[0], side).losses] for side in SIDES}
                   for p, runs in rounds.items()},
    }


def main() -> None:
    from transformers import AutoConfig

    options, chosen = parse_options()
    model_dir = prepare_embedded_model(load_settings().model_dir).path
    spec = LoraSpec(rank=8, alpha=16, dropout=0.0)
    draws, rounds = run_rounds(model_dir, spec, options, chosen)
    model_config = AutoConfig.from_pretrained(model_dir)
    headline = chosen[-1]  # bf16 when it ran (auto runs it where auto picks it), else fp32
    result: dict[str, Any] = {
        "batch": options.batch, "steps": options.steps, "rounds": options.rounds,
        "threads": torch.get_num_threads(), "precision": headline, "precisions": chosen,
        "baseline_gradient_checkpointing": False, "max_grad_norm": MAX_GRAD_NORM,
        **loss_fields(rounds, options.batch),
    }
    for precision, suffix in [("fp32", "_fp32"), (headline, "")]:
        result.update(figures(draws[precision].batches, rounds[precision], model_config, spec, suffix))
    if "bf16" in chosen:  # what a TRL user on float32 would see switching to our bfloat16 step
        ours, trl = result["ours_tokens_per_s"], result["trl_tokens_per_s_fp32"]
        result["ratio_bf16_vs_trl_fp32"] = round(ours / trl, 2)
    if not result["losses_match"]:
        print(f"the two sides' losses differ by more than the tolerance: {result['loss_max_rel_diff']} > "
              f"{result['loss_tolerance']}; they did not compute the same step", flush=True)
    emit(result, "+".join(chosen))
    if not result["losses_match"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
