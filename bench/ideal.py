"""The ideal signal: GRPO on a suite taste's own score, measured as bench/learning.py measures.

    deploy/local/env.sh .venv/bin/python bench/ideal.py --preference enthusiastic [--steps 24] \
        [--learning-rate 3e-4] [--beta 0.1] [--rehearse 1.0] [--save 16,20] [--smoke]

What the feedback loop learns of a taste from 500 users' thumbs is bounded by what the model can learn
of it at all without forgetting. This benchmark measures that bound: the rollout flow (GRPO,
`hybrid.critic_free`, no critic, the in-loss k3 KL to the base at `--beta`) trains the embedded model
with the taste's own noise-free score as the reward (`bench.grpo_rewards:taste_<name>`) on the taste's
training prompts, `--prompts` prompts and `--group` answers each per step. With `--rehearse W` the
trainer's 16 probe facts (`online_rl.trainer.gate.ABILITY_PROBE`) join the training prompts, and a
verifier (`bench.grpo_rewards:probe_facts`: 1 when the answer holds the fact) is added to the reward at
weight W: the model rehearses answering facts while it learns the taste.

The adapter after each step of `--save` and after the last is then served by the same engine, prompts
and sampling seeds as `bench/learning.py` uses (`online_rl.simulate.learning.Lab`): its liked rate on
the taste's held-out prompts, the general-ability check (8 prompts, greedy) and the fact check (190
facts, `facts_kept`). The baseline is the base model, measured in the same run; at learning rate 0 the
adapter is the identity, so an lr = 0 control answers exactly as the base (`bench/learning.py
--control lr0` showed it: 0.361 and 0.361). The last line is one JSON object with every name of
`FIELDS` and the machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, kafka_broker, missing_fields

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("preference", "steps", "learning_rate", "beta", "rehearse", "base", "ability_base", "facts_base",
          "checkpoints", "final", "gain", "ability", "facts_kept", "seconds_training", "smoke")


def _settings(args: argparse.Namespace) -> Any:
    from online_rl.config import load_settings

    base = load_settings()
    functions = [{"name": "taste", "weight": 1.0,
                  "target": f"bench.grpo_rewards:taste_{args.preference.replace('-', '_')}"}]
    if args.rehearse:
        functions.append({"name": "facts", "target": "bench.grpo_rewards:probe_facts",
                          "weight": args.rehearse})
    return base.model_copy(update={
        "hybrid": base.hybrid.model_validate({
            **base.hybrid.model_dump(), "rollout_batch": args.prompts, "max_new_tokens": args.max_new_tokens,
            "min_pairs": 0, "reward_steps": 0, "learning_rate": args.learning_rate, "ppo_epochs": 2,
            "temperature": 1.0, "precision": "fp32",
            "critic_free": {"estimator": "grpo", "group_size": args.group, "beta": args.beta}}),
        "rewards": base.rewards.model_validate({"functions": functions, "weights": {}}),
    })


def _train(args: argparse.Namespace, work: Path, train: list[str]) -> dict[int, Path]:
    """GRPO for `--steps`; the adapters kept, by step."""
    from transformers import AutoTokenizer

    from online_rl.hybrid.loop import ColocatedPPO
    from online_rl.models.chat import user_turn_ids

    settings = _settings(args)
    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)
    keep = {int(s) for s in args.save.split(",") if s.strip()} | {args.steps}
    adapters: dict[int, Path] = {}
    loop = ColocatedPPO(settings)
    try:
        loop.observe([user_turn_ids(tokenizer, q) for q in train], texts=train)
        for step in range(1, args.steps + 1):
            metrics = loop.step()
            print(f"step {step}: reward {metrics['reward']:.3f}, kl {metrics.get('kl', float('nan')):.3f}, "
                  f"zero-variance groups {metrics.get('zero_variance_fraction', 0.0):.2f}, "
                  f"{metrics['iteration_s']:.1f} s", flush=True)
            if step in keep:
                adapters[step] = work / f"adapter-{step}"
                loop.save_adapter(str(adapters[step]))
    finally:
        loop.close()
    return adapters


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preference", default="enthusiastic",
                        help="a suite taste (online_rl/simulate/suite.py)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=4, help="prompts per step")
    parser.add_argument("--group", type=int, default=4, help="answers per prompt")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--beta", type=float, default=0.1, help="GRPO's in-loss k3 KL to the base")
    parser.add_argument("--rehearse", type=float, default=0.0,
                        help="weight of the probe-fact verifier, its 16 prompts trained beside (0: none)")
    parser.add_argument("--save", default="", help="comma-separated steps whose adapters are measured too")
    parser.add_argument("--eval-samples", type=int, default=2, help="answers per held-out prompt")
    parser.add_argument("--bootstrap", default=None, help="an existing Kafka broker (else one is started)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.prompts, args.group, args.max_new_tokens, args.eval_samples = 2, 2, 2, 16, 1
        args.save = "1"
    from online_rl.simulate.suite import suite_entry

    try:  # bad input is refused before Ray and the model start
        entry = suite_entry(args.preference)
        saved = [int(s) for s in args.save.split(",") if s.strip()]
    except ValueError as error:
        parser.error(f"--preference/--save: {error}")
    if any(not 1 <= s <= args.steps for s in saved):
        parser.error(f"--save {args.save}: steps lie in 1..--steps ({args.steps}), e.g. --save 16,20")
    logging.basicConfig(level=logging.WARNING)

    from bench.learning import bench_settings
    from online_rl.simulate.facts import facts_kept
    from online_rl.simulate.learning import Lab
    from online_rl.trainer.gate import ABILITY_PROBE

    train = entry.prompts("train") + ([item.prompt for item in ABILITY_PROBE] if args.rehearse else [])
    facts = 8 if args.smoke else None
    with tempfile.TemporaryDirectory(prefix="orl-bench-ideal-") as tmp:
        work = Path(tmp)
        began = time.monotonic()
        adapters = _train(args, work, train)
        seconds = time.monotonic() - began
        with kafka_broker(args.bootstrap, port=19392) as bootstrap:
            settings = bench_settings(ROOT / "deploy" / "local" / "demo.yaml", bootstrap, work, {})
            lab = Lab(settings, engine="transformers")
            try:
                base = lab.evaluate(entry, None, samples=args.eval_samples)
                ability_base, facts_base = lab.ability(None), lab.facts(None, facts)
                print(f"base: liked {base.liked_rate:.3f}, ability {ability_base}/8, facts "
                      f"{sum(facts_base)}/{len(facts_base)}", flush=True)
                checkpoints: list[dict[str, Any]] = []
                for step, folder in sorted(adapters.items()):
                    name = f"ideal-{uuid.uuid4().hex[:6]}-{step}"
                    lab.load(name, folder)
                    measured = lab.evaluate(entry, name, samples=args.eval_samples)
                    row = {"step": step, "liked": round(measured.liked_rate, 4),
                           "gain": round(measured.liked_rate - base.liked_rate, 4),
                           "ability": lab.ability(name),
                           "facts_kept": facts_kept(facts_base, lab.facts(name, facts))}
                    lab.unload(name)
                    checkpoints.append(row)
                    print(f"step {step}: liked {row['liked']:.3f} ({row['gain']:+.3f}), ability "
                          f"{row['ability']}/8, facts kept {row['facts_kept']}", flush=True)
            finally:
                lab.close()
    final = checkpoints[-1]
    result = {
        "preference": args.preference, "steps": args.steps, "learning_rate": args.learning_rate,
        "beta": args.beta, "rehearse": args.rehearse, "base": round(base.liked_rate, 4),
        "ability_base": ability_base, "facts_base": f"{sum(facts_base)}/{len(facts_base)}",
        "checkpoints": checkpoints, "final": final["liked"], "gain": final["gain"],
        "ability": final["ability"],
        "facts_kept": final["facts_kept"], "seconds_training": round(seconds, 1), "smoke": args.smoke,
    }
    if missing := missing_fields(result, FIELDS):
        raise SystemExit(f"the result lacks {missing}")
    emit(result, "fp32")


if __name__ == "__main__":
    main()
