"""Learning-step benchmark: our DPO step against TRL's DPOTrainer, same model, data, batch and LoRA.

    .venv/bin/python bench/algos.py [--steps 6] [--batch 8] [--precision auto|bf16,fp32]

On the embedded model (SmolLM2-135M-Instruct) with LoRA r=8 on q,k,v,o, for each precision:
1. TRL's `DPOTrainer` trains `--steps` batches of `--batch` pairs (sigmoid loss, beta 0.1, AdamW,
   reference = the same model with the adapter disabled, as TRL does for PEFT models). The batches it
   draws (its own shuffling and tokenisation) are recorded.
2. Our step (`online_rl.algos.batch.dpo_batch_loss` + AdamW) trains on exactly those batches in the
   same order from a fresh copy of the model.
The first step of each is a warm-up and is not timed. Tokens are counted the same way for both: the
tokens of each pair's chosen and rejected sequences (prompt + completion, each). `bf16` is mixed
precision on both sides: frozen base weights stored in bfloat16, LoRA weights in float32, matrix
products under bfloat16 autocast. MFU is the model FLOP/s of our step (forward and backward of
the policy, forward of the reference; prompts counted once, as computed) over the best rate a large
matrix product reaches here in the same precision (the VM hides its clock, so the datasheet peak is
unknown; `peak_gflops` reports the measured figure).
`--precision auto` (the default) runs float32, and bfloat16 too where `precision: auto` picks it here.
The last line is one JSON object: `ratio_vs_trl` (tokens/s ours / TRL, both bf16), `ratio_vs_trl_fp32`
(both fp32), `ratio_bf16_vs_trl_fp32`, `mfu` (bf16), `mfu_fp32`, tokens/s per side and precision, and
the machine (CPU model, ISA, cores).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.common import emit, precisions
from online_rl.algos import DPOConfig
from online_rl.algos.batch import Precision, dpo_batch_loss
from online_rl.algos.policy import LoraSpec, lora_policy
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
Pair = tuple[list[int], list[int], list[int]]


def dataset(count: int, seed: int = 0) -> list[dict[str, str]]:
    """Chat-templated prompts and answers of varied length (8-60 words), deterministic."""
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


def run_trl(model_dir: Path, rows: list[dict[str, str]], spec: LoraSpec, batch: int, steps: int,
            precision: Precision) -> tuple[list[list[Pair]], list[float]]:
    """Train with TRL; return the batches it drew (as token ids) and each step's wall time."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], tokenize=False,
                                             add_generation_prompt=True) for r in rows]
    data = Dataset.from_list([{**r, "prompt": p} for r, p in zip(rows, prompts, strict=True)])
    ends: list[float] = []

    class Clock(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            ends.append(time.perf_counter())

    with tempfile.TemporaryDirectory() as out:
        args = TRLConfig(output_dir=out, per_device_train_batch_size=batch, max_steps=steps, max_length=128,
                         learning_rate=LR, beta=0.1, loss_type=["sigmoid"], logging_steps=10_000,
                         save_strategy="no", report_to=[], use_cpu=True, bf16=precision == "bf16",
                         dataloader_num_workers=0, seed=0, warmup_steps=0, lr_scheduler_type="constant",
                         disable_tqdm=True)
        peft = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                          target_modules=list(spec.targets), task_type="CAUSAL_LM")
        trainer = DPOTrainer(model=load_model(model_dir, precision), args=args, train_dataset=data,
                             processing_class=tokenizer, peft_config=peft, callbacks=[Clock()])
        drawn: list[list[Pair]] = []
        collate = trainer.data_collator

        def recording(examples: list[dict[str, Any]]) -> Any:
            drawn.append([(list(e["prompt_ids"]), list(e["chosen_ids"]), list(e["rejected_ids"]))
                          for e in examples])
            return collate(examples)

        trainer.data_collator = recording
        start = time.perf_counter()
        trainer.train()
    longest = max(len(p) + max(len(c), len(r)) for batch_ in drawn for p, c, r in batch_)
    if longest > 128:
        raise SystemExit(f"a pair has {longest} tokens: TRL would truncate it to max_length 128 and the "
                         "two sides would not do the same work; shorten the answers in dataset()")
    marks = [start, *ends]
    return drawn[:steps], [b - a for a, b in itertools.pairwise(marks)]


def run_ours(model_dir: Path, batches: list[list[Pair]], spec: LoraSpec, precision: Precision) -> list[float]:
    policy = lora_policy(load_model(model_dir, "fp32"), spec, precision)
    policy.train()
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=LR)
    config = DPOConfig(beta=0.1)
    times = []
    for pairs in batches:
        start = time.perf_counter()
        loss = dpo_batch_loss(policy, pairs, config, precision=precision).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def step_flops(model: Any, pairs: Sequence[Pair], spec: LoraSpec) -> float:
    """Model FLOPs of our step: policy forward + backward (input gradients through frozen weights, LoRA
    weight gradients) + reference forward, with each prompt once and the LM head on completion tokens."""
    c = model.config
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="steps per side (the first is a warm-up)")
    parser.add_argument("--batch", type=int, default=8, help="pairs per step")
    parser.add_argument("--precision", default="auto",
                        help="auto (fp32, and bf16 where auto picks it here) or comma-separated: bf16, fp32")
    options = parser.parse_args()
    model_dir = prepare_embedded_model(load_settings().model_dir).path
    spec = LoraSpec(rank=8, alpha=16, dropout=0.0)
    rows = dataset(options.batch * options.steps)
    result: dict[str, Any] = {"batch": options.batch, "steps": options.steps,
                              "threads": torch.get_num_threads()}
    chosen = precisions(options.precision)
    for precision in chosen:
        batches, trl_times = run_trl(model_dir, rows, spec, options.batch, options.steps, precision)  # type: ignore[arg-type]
        ours_times = run_ours(model_dir, batches, spec, precision)  # type: ignore[arg-type]
        timed = batches[1:]
        tokens = sum(sequence_tokens(b) for b in timed)
        trl_rate, ours_rate = tokens / sum(trl_times[1:]), tokens / sum(ours_times[1:])
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        flops = sum(step_flops(type("M", (), {"config": config}), b, spec) for b in timed)
        peak = peak_flops(torch.bfloat16 if precision == "bf16" else torch.float32)
        mfu = flops / sum(ours_times[1:]) / peak
        suffix = "" if precision == "bf16" else "_fp32"
        result.update({
            f"ratio_vs_trl{suffix}": round(ours_rate / trl_rate, 2),
            f"mfu{suffix}": round(mfu, 3),
            f"ours_tokens_per_s{suffix}": round(ours_rate, 1),
            f"trl_tokens_per_s{suffix}": round(trl_rate, 1),
            f"peak_gflops{suffix}": round(peak / 1e9),
        })
        print(f"{precision}: ours {ours_rate:.0f} tok/s ({[round(t, 2) for t in ours_times]} s/step), "
              f"TRL {trl_rate:.0f} tok/s ({[round(t, 2) for t in trl_times]} s/step), "
              f"ratio {ours_rate / trl_rate:.2f}x, MFU {mfu:.1%} of {peak / 1e9:.0f} GFLOP/s", flush=True)
    if "ours_tokens_per_s" in result and "trl_tokens_per_s_fp32" in result:
        # what a TRL user on its default (float32) would see switching to our bfloat16 step
        ours, trl = result["ours_tokens_per_s"], result["trl_tokens_per_s_fp32"]
        result["ratio_bf16_vs_trl_fp32"] = round(ours / trl, 2)
    emit(result, "+".join(chosen))


if __name__ == "__main__":
    main()
