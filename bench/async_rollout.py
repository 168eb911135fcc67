"""Synchronous against asynchronous rollouts on vLLM with in-memory LoRA sync, on the same prompts and seeds.

    deploy/local/env.sh .venv/bin/python bench/async_rollout.py [--rounds 3] [--steps 4] [--prompts 4]
        [--group 4] [--max-new-tokens 48] [--staleness 1] [--learning-rate 0] [--timeline FILE]
        [--learn STEPS [--learn-rate 1e-3] [--learn-staleness 2] [--learn-sides sync,async,control]
         [--learn-seeds 0[,1,...]] [--only-learn]] [--smoke]

Two rollout flows (`online_rl.hybrid.loop.ColocatedPPO`, `hybrid.engine: vllm`, GRPO with the reward
function of bench/grpo.py, the default LoRA of `trainer.*` on the embedded model) run side by side in
one Ray runtime, each with its own vLLM engine actor on `engine_cpus: 1` and its own training device on
`cpus_per_worker: 1` (the vLLM engine's threads bound to the last core, training's on the others), so
generation and training have separate cores on both sides:

At the default `--learning-rate 0` the adapter never moves, so batch i has the same prompts, seeds and
adapter on both sides and both sample the same tokens (`tokens_sync` = `tokens_async`): the ratio
compares the same work. (Learning moves the policies apart: a policy that learned shorter answers
samples faster, which is not the pipeline's doing.)

- `sync`: `max_staleness: 0` — each iteration syncs the adapter, samples, then trains, in turn;
- `async`: `max_staleness: --staleness` — the next batch is sampled (with the adapter of the last
  update) while the current one trains.

Both start, then run one warm-up iteration; each round then times `--steps` iterations of each side,
the sides alternating which goes first; samples/s is rollouts trained / wall time. Printed: the ratio
`async_vs_sync` (median of the rounds, with its range), `sync_ms` (the median adapter sync: gather
from the FSDP shards + install in vLLM, milliseconds), `sync_bytes_ratio` (the adapter's bytes moved
per sync / the base's bytes at the same precision), `staleness_histogram` of the async side (trained
batches per staleness), and the mean training reward of each side (`reward_sync`, `reward_async`: the
same prompts and seeds, the async side one version behind). `--timeline FILE` writes the async side's
per-batch timestamps (sampled from/to, updated from/to) as JSON for the picture in
docs/rollout-flow.md. The last line is one JSON object with those figures and the machine.

`--learn STEPS` first compares learning on the same budget: STEPS iterations at `--learn-rate` of the
synchronous flow, of the asynchronous one at `--learn-staleness`, and of an lr = 0 control, one after
the other with the same prompts and seeds, each final policy's reward function mean on 12 held-out
prompts (`learn`, `learn_gap` = async − sync); `--only-learn` stops there, as does a `--learn-sides`
without both sync and async. `--learn-seeds 0,1,2` runs every side once per trainer seed (adapter
initialisation, prompt draws and sampling; seed 0 is the single run's), alternating the sides' order:
each side's median and range of held-out reward, and the async − sync difference per seed
(`gap_per_seed`), since one run per side is swayed by which prompts collapse.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, missing_fields, put_spread

FIELDS: tuple[str, ...] = (
    "async_vs_sync", "async_vs_sync_range", "samples_per_s_sync", "samples_per_s_async", "sync_ms",
    "sync_bytes_ratio", "adapter_bytes", "base_bytes", "staleness_histogram", "reward_sync", "reward_async",
    "rounds", "steps", "rollouts_per_step", "tokens_sync", "tokens_async", "smoke",
)
FUNCTION = {"name": "brief_on_topic", "target": "bench.grpo_rewards:brief_on_topic", "weight": 1.0}


def _settings(args: argparse.Namespace, work: Path, staleness: int) -> Any:
    from online_rl.config import load_settings

    base = load_settings()
    return base.model_copy(update={
        "ray": base.ray.model_validate({**base.ray.model_dump(), "num_cpus": 4}),  # two sides' bundles
        "hybrid": base.hybrid.model_validate({
            **base.hybrid.model_dump(), "engine": "vllm", "engine_cpus": 1, "cpus_per_worker": 1,
            "max_staleness": staleness, "rollout_batch": args.prompts, "max_new_tokens": args.max_new_tokens,
            "min_pairs": 0, "reward_steps": 0, "learning_rate": args.learning_rate, "temperature": 1.0,
            "critic_free": {"estimator": "grpo", "group_size": args.group}}),
        "rewards": base.rewards.model_validate({"functions": [FUNCTION], "weights": {}}),
    })


def _base_bytes(model_dir: Path) -> int:
    """The base's parameter bytes in float32 (the adapter's precision), from the safetensors headers."""
    from safetensors import safe_open

    total = 0
    for path in model_dir.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                count = 1
                for size in f.get_slice(name).get_shape():
                    count *= size
                total += 4 * count
    return total


def draw(rows: list[dict[str, Any]], last: int = 5, per_char: float = 1.0) -> str:
    """A text picture of the last `last` batches of a timeline: one lane for sampling (the batch's step
    number while vLLM samples it) and one for updates (the step number while it trains), a character
    per `per_char` seconds."""
    rows = rows[-last:]
    # from the first batch's update (its sampling may lie before a pause, e.g. the other side's turn)
    start = min([r["sampled"][0] for r in rows[1:]] + [(rows[0]["updated"] or rows[0]["sampled"])[0]])
    end = max((r["updated"] or r["sampled"])[1] for r in rows)
    width = int((end - start) / per_char) + 1
    lanes = {"sample": [" "] * width, "update": [" "] * width}
    for r in rows:
        mark = str(r["step"] % 10)
        for lane, span in (("sample", r["sampled"]), ("update", r["updated"])):
            if span:
                first, stop = int((span[0] - start) / per_char), int((span[1] - start) / per_char)
                for i in range(max(0, first), stop + 1):
                    lanes[lane][min(i, width - 1)] = mark
    scale = "".join("|" if i % 10 == 0 else " " for i in range(width))
    return "\n".join([f"sample  {''.join(lanes['sample'])}", f"update  {''.join(lanes['update'])}",
                      f"        {scale}  ({per_char:g} s per character, | every {10 * per_char:g} s)"])


def _learn_run(args: argparse.Namespace, work: Path, prompts: list[list[int]], train: list[str],
               held: list[list[int]], held_texts: list[str], name: str, staleness: int, lr: float,
               seed: int) -> dict[str, Any]:
    """One learning run: `--learn` iterations of one side at `lr` with the trainer seed `seed` (the
    adapter's initialisation, the prompt draws and the sampling), then its held-out reward."""
    from online_rl.hybrid.loop import ColocatedPPO

    fn = f"fn_{FUNCTION['name']}"
    learn = argparse.Namespace(**{**vars(args), "learning_rate": lr})
    settings = _settings(learn, work, staleness)
    settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={"seed": seed})})
    started = time.perf_counter()
    loop = ColocatedPPO(settings)
    try:
        loop.observe(prompts, texts=train)
        curve: list[float] = []
        watch = ("staleness", "behaviour_gap", "ppo_truncated_fraction", "zero_variance_fraction", "kl")
        for _ in range(args.learn):
            metrics = loop.step()
            curve.append(metrics["reward"])
            print(f"learn {name} seed {seed} step {len(curve)}: reward {metrics['reward']:.3f} "
                  + " ".join(f"{k} {metrics[k]:.3f}" for k in watch if k in metrics), flush=True)
        evaluation = loop.evaluate(held, samples=2, seed=4321, texts=held_texts)
    finally:
        loop.close()
    out = {"held_out_reward": round(evaluation[fn], 4), "base_reward": round(evaluation["base_" + fn], 4),
           "train_reward_last4": round(statistics.fmean(curve[-4:]), 4),
           "train_rewards": [round(r, 3) for r in curve], "seconds": round(time.perf_counter() - started, 1)}
    print(f"learn {name} seed {seed}: held-out reward {out['held_out_reward']:.3f} "
          f"(base {out['base_reward']:.3f}) in {out['seconds']:.0f}s", flush=True)
    return out


def _learn(args: argparse.Namespace, work: Path, prompts: list[list[int]], train: list[str],
           held: list[list[int]], held_texts: list[str]) -> dict[str, Any]:
    """The learning comparison: `--learn` iterations at lr `--learn-rate` of the synchronous flow, of the
    asynchronous one at `--learn-staleness`, and of an lr = 0 control, one after the other with the same
    prompts and seeds; each final policy's reward on held-out prompts (2 answers each, one seed). With
    several `--learn-seeds`, every side runs once per seed (the order of the sides alternating from seed
    to seed), and each side reports the median and range of its held-out rewards, and the sync/async
    pairs their differences."""
    sides = {"sync": (0, args.learn_rate), "async": (args.learn_staleness, args.learn_rate),
             "control": (0, 0.0)}
    names = [name for name in sides if name in args.learn_sides.split(",")]
    seeds = [int(s) for s in str(args.learn_seeds).split(",")]
    runs: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in names}
    for i, seed in enumerate(seeds):
        for name in names if i % 2 == 0 else names[::-1]:
            staleness, lr = sides[name]
            runs[name][seed] = _learn_run(args, work, prompts, train, held, held_texts, name, staleness,
                                          lr, seed)
    if len(seeds) == 1:
        return {name: runs[name][seeds[0]] for name in names}
    out: dict[str, Any] = {}
    for name in names:
        rewards = [runs[name][seed]["held_out_reward"] for seed in seeds]
        out[name] = {"held_out_reward": round(statistics.median(rewards), 4),
                     "held_out_range": [min(rewards), max(rewards)], "held_out_rewards": rewards,
                     "seeds": seeds, "runs": {str(seed): runs[name][seed] for seed in seeds}}
    if {"sync", "async"} <= set(names):
        gaps = [round(runs["async"][s]["held_out_reward"] - runs["sync"][s]["held_out_reward"], 4)
                for s in seeds]
        out["gap_per_seed"] = gaps
        print(f"learn: async - sync held-out per seed {gaps}, median {statistics.median(gaps):+.3f}",
              flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--learning-rate", type=float, default=0.0,
                        help="0 (the default): the adapter never moves, so both sides sample the same tokens "
                        "and the ratio compares the same work; above 0 the policies drift apart")
    parser.add_argument("--timeline", type=Path, default=None)
    parser.add_argument("--learn", type=int, default=0,
                        help="also compare learning: this many iterations of sync, async, an lr = 0 control")
    parser.add_argument("--learn-rate", type=float, default=1e-3)
    parser.add_argument("--learn-staleness", type=int, default=2)
    parser.add_argument("--only-learn", action="store_true", help="skip the throughput rounds")
    parser.add_argument("--learn-seeds", default="0",
                        help="trainer seeds of the learning runs (comma-separated: each side once per seed)")
    parser.add_argument("--learn-sides", default="sync,async,control",
                        help="which of the learning runs to make (comma-separated)")
    parser.add_argument("--smoke", action="store_true", help="1 round of 1 step, 2 prompts, 8 tokens")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.steps, args.prompts, args.group, args.max_new_tokens = 1, 1, 2, 2, 8
    logging.basicConfig(level=logging.WARNING)

    from transformers import AutoTokenizer

    from online_rl.hybrid.loop import ColocatedPPO
    from online_rl.simulate import PROMPTS

    with tempfile.TemporaryDirectory(prefix="orl-bench-async-") as tmp:
        work = Path(tmp)
        sides = {"sync": _settings(args, work, 0), "async": _settings(args, work, args.staleness)}
        model_dir = sides["sync"].model_dir
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        train = list(PROMPTS)[:12]
        prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                      add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"]) for q in train]
        learned: dict[str, Any] = {}
        if args.learn:
            held_texts = list(PROMPTS)[12:24]
            held = [list(tokenizer.apply_chat_template([{"role": "user", "content": q}],
                                                       add_generation_prompt=True, tokenize=True,
                                                       return_dict=True)["input_ids"]) for q in held_texts]
            learned = _learn(args, work, prompts, train, held, held_texts)
            if args.only_learn or not {"sync", "async"} <= set(learned):
                print(json.dumps({"learn": learned, "learn_steps": args.learn}), flush=True)
                return
        loops: dict[str, ColocatedPPO] = {}
        try:
            for name, settings in sides.items():
                started = time.perf_counter()
                loops[name] = ColocatedPPO(settings)
                loops[name].observe(prompts, texts=train)
                loops[name].step()  # warm-up: the first sync, vLLM's first batches
                print(f"{name}: started and warmed up in {time.perf_counter() - started:.1f}s", flush=True)
            rates: dict[str, list[float]] = {"sync": [], "async": []}
            rewards: dict[str, list[float]] = {"sync": [], "async": []}
            tokens: dict[str, int] = {"sync": 0, "async": 0}
            syncs: list[float] = []
            ratios: list[float] = []
            for round_, order in enumerate(alternated(args.rounds, ["sync", "async"])):
                this: dict[str, float] = {}
                for name in order:
                    loop = loops[name]
                    start, rollouts = time.perf_counter(), 0
                    for _ in range(args.steps):
                        metrics = loop.step()
                        rollouts += int(metrics["rollouts"])
                        tokens[name] += int(metrics["generated_tokens"])
                        rewards[name].append(metrics["reward"])
                        if "sync_s" in metrics:
                            syncs.append(metrics["sync_s"] * 1000)
                        elif name == "sync" and loop.last_sync.get("sync_s") is not None:
                            syncs.append(loop.last_sync["sync_s"] * 1000)
                    this[name] = rollouts / (time.perf_counter() - start)
                    rates[name].append(this[name])
                ratios.append(this["async"] / this["sync"])
                print(f"round {round_ + 1}: sync {this['sync']:.2f} samples/s, async {this['async']:.2f} "
                      f"samples/s ({ratios[-1]:.2f}x)", flush=True)
            precision = loops["sync"].precision.precision
            asynchronous = loops["async"]
            assert asynchronous.pipeline is not None
            histogram = {str(k): v for k, v in sorted(asynchronous.pipeline.histogram.items())}
            adapter_bytes = int(asynchronous.last_sync["adapter_sync_bytes"])
            if args.timeline is not None:
                args.timeline.write_text(json.dumps({"async": asynchronous.timeline,
                                                     "sync": loops["sync"].timeline}, indent=1))
                for name in ("sync", "async"):
                    print(f"{name}, the last round:\n{draw(loops[name].timeline, args.steps)}", flush=True)
        finally:
            for loop in loops.values():
                loop.close()
    base_bytes = _base_bytes(model_dir)
    result: dict[str, Any] = {
        "samples_per_s_sync": round(statistics.median(rates["sync"]), 3),
        "samples_per_s_async": round(statistics.median(rates["async"]), 3),
        "sync_ms": round(statistics.median(syncs), 1), "adapter_bytes": adapter_bytes,
        "base_bytes": base_bytes,
        "sync_bytes_ratio": round(adapter_bytes / base_bytes, 5), "staleness_histogram": histogram,
        "reward_sync": round(statistics.fmean(rewards["sync"]), 4),
        "reward_async": round(statistics.fmean(rewards["async"]), 4),
        "rounds": args.rounds, "steps": args.steps, "rollouts_per_step": args.prompts * args.group,
        "staleness": args.staleness, "learning_rate": args.learning_rate, "tokens_sync": tokens["sync"],
        "tokens_async": tokens["async"], "smoke": args.smoke,
    }
    if learned:
        result |= {"learn": learned, "learn_steps": args.learn, "learn_staleness": args.learn_staleness,
                   "learn_gap": round(learned["async"]["held_out_reward"]
                                      - learned["sync"]["held_out_reward"], 4)}
    put_spread(result, "async_vs_sync", ratios)
    if missing := missing_fields(result, FIELDS):
        raise SystemExit(f"the result lacks {missing}")
    print(f"async vs sync: {result['async_vs_sync']}x samples/s (range {result['async_vs_sync_range']}); "
          f"adapter sync {result['sync_ms']} ms moving {result['sync_bytes_ratio']:.4f} of the base; "
          f"staleness {histogram}", flush=True)
    emit(result, precision)


if __name__ == "__main__":
    main()
