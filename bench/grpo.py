"""GRPO on the rollout flow with a reward function written as code, against an lr = 0 control.

    deploy/local/env.sh .venv/bin/python bench/grpo.py [--steps 24] [--prompts 4] [--group 4] \
        [--learning-rate 1e-3] [--ppo-epochs 2] [--beta 0] [--preference NAME] [--smoke]

The rollout flow (`online_rl.hybrid.loop.ColocatedPPO` with `hybrid.critic_free: {estimator: grpo}`, no
critic) trains the embedded model (SmolLM2-135M-Instruct) for `--steps` iterations: each samples
`--prompts` training prompts (the first 12 of `online_rl.simulate.PROMPTS`), `--group` answers to each,
scores them with `bench.grpo_rewards:brief_on_topic` (1 for at most 8 words that still contain the
prompt's key word, less up to 40 words; run out of process by `online_rl.flow.RewardFunctions`, the
learned reward model weighted 0) and takes GRPO's clipped step on the group-normalised advantages
(with `--beta`, plus GRPO's in-loss k3 KL to the base, weighed by the ratio). With `--preference
NAME` the reward is a suite taste's own score (`bench.grpo_rewards:taste_<name>`) and the prompts
are that taste's training and held-out ones (online_rl/simulate/suite.py).
The control run is the same command with `learning_rate: 0`: the same seeds, prompts and sampling, no
learning. The baseline of the comparison is that control (the issue's bar), not another framework.

Measured on the 12 held-out prompts (`PROMPTS[12:]`, never trained on), 2 sampled answers each at the
training temperature with one seed for both runs: the reward function's mean on the trained policy's
answers and on the control's (`reward_trained`, `reward_control`, `gain_over_control` = their
difference; `reward_base` is the base model's, from the same evaluation); the answers' mean length in
tokens; and the general-ability check of the demo (`online_rl.demo.report.ABILITY_PROMPTS`: 8 factual
questions answered greedily, correct when the answer holds the right word) for the base, the trained
and the control adapters (`ability_*`, out of 8), and the fact check (`online_rl.simulate.facts`, 190
facts, greedy: `facts_base`, and the share of those each adapter still answers, `facts_kept_trained`,
`facts_kept_control`). The sides run one after the other (control first)
in one process; both are timed (`seconds_trained`, `seconds_control`). The last line is one JSON
object with every name of `FIELDS` and the machine.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit, missing_fields
from online_rl.simulate.facts import facts_kept

FIELDS: tuple[str, ...] = (
    "steps", "prompts", "group", "learning_rate", "reward_base", "reward_trained", "reward_control",
    "gain_over_control", "gain_over_base", "tokens_trained", "tokens_control", "tokens_base",
    "ability_base", "ability_trained", "ability_control", "seconds_trained", "seconds_control",
    "zero_variance_fraction", "facts_base", "facts_kept_trained", "facts_kept_control", "preference", "smoke",
)
FUNCTION = {"name": "brief_on_topic", "target": "bench.grpo_rewards:brief_on_topic", "weight": 1.0}


def _function(preference: str | None) -> dict[str, Any]:
    """The reward: `brief_on_topic`, or a suite taste's own score (`bench.grpo_rewards:taste_<name>`)."""
    if preference is None:
        return FUNCTION
    target = f"bench.grpo_rewards:taste_{preference.replace('-', '_')}"
    return {"name": "taste", "target": target, "weight": 1.0}


def _prompts(preference: str | None) -> tuple[list[str], list[str]]:
    """(training, held-out) prompts: the first 12 of PROMPTS and the next 12, or a suite taste's split."""
    if preference is None:
        from online_rl.simulate import PROMPTS

        return list(PROMPTS[:12]), list(PROMPTS[12:24])
    from online_rl.simulate.suite import suite_entry

    entry = suite_entry(preference)
    return entry.prompts("train"), entry.prompts("eval")


def _settings(args: argparse.Namespace, work: Path, learning_rate: float) -> Any:
    from online_rl.config import load_settings

    base = load_settings()
    return base.model_copy(update={
        "hybrid": base.hybrid.model_validate({
            **base.hybrid.model_dump(), "rollout_batch": args.prompts, "max_new_tokens": args.max_new_tokens,
            "min_pairs": 0, "reward_steps": 0, "learning_rate": learning_rate,
            "ppo_epochs": args.ppo_epochs,
            "temperature": 1.0, "precision": "fp32",
            "critic_free": {"estimator": "grpo", "group_size": args.group, "beta": args.beta}}),
        "rewards": base.rewards.model_validate({"functions": [_function(args.preference)], "weights": {}}),
    })


def _greedy(model_dir: Path, adapter: Path | None, questions: list[str],
            max_new_tokens: int = 48) -> list[str]:
    """Greedy answers (float32, transformers, batched with left padding)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    model.eval()
    answers: list[str] = []
    for start in range(0, len(questions), 32):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               tokenize=False) for q in questions[start:start + 32]]
        ids = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id)
        answers += [str(tokenizer.decode(row[ids["input_ids"].shape[1]:], skip_special_tokens=True))
                    for row in out]
    return answers


def _checks(model_dir: Path, adapter: Path | None, facts: int | None) -> tuple[int, list[bool]]:
    """The demo's general-ability check (8 factual questions) and which facts of the fact check
    (online_rl/simulate/facts.py; `facts`: the first this many) the model answers, greedy, one load."""
    from online_rl.demo.report import ABILITY_PROMPTS, correct
    from online_rl.simulate.facts import FACT_CHECK
    from online_rl.trainer.gate import probe_correct

    asked = FACT_CHECK[:facts]
    answers = _greedy(model_dir, adapter, [q for q, _ in ABILITY_PROMPTS] + [f.prompt for f in asked])
    ability = sum(correct(a, accepted) for a, (_, accepted) in zip(answers, ABILITY_PROMPTS, strict=False))
    return ability, probe_correct(asked, answers[len(ABILITY_PROMPTS):])


def _run(args: argparse.Namespace, work: Path, learning_rate: float) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from online_rl.hybrid.loop import ColocatedPPO

    settings = _settings(args, work, learning_rate)
    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir)

    def ids(question: str) -> list[int]:
        rendered: Any = tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                      add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)
        return list(rendered["input_ids"])

    train, held = _prompts(args.preference)
    start = time.perf_counter()
    loop = ColocatedPPO(settings)
    try:
        loop.observe([ids(q) for q in train], texts=train)
        flat = []
        for step in range(args.steps):
            metrics = loop.step()
            flat.append(metrics.get("zero_variance_fraction", 0.0))
            print(f"lr {learning_rate:g} step {step + 1}: reward {metrics['reward']:.3f} trained "
                  f"{metrics.get('trained_rollouts', 0):.0f} in {metrics['iteration_s']:.1f}s", flush=True)
        evaluation = loop.evaluate([ids(q) for q in held], samples=args.eval_samples, seed=4321, texts=held)
        adapter = work / f"adapter-{learning_rate:g}"
        loop.save_adapter(str(adapter))
    finally:
        loop.close()
    seconds = time.perf_counter() - start
    return {"eval": evaluation, "adapter": adapter, "seconds": seconds,
            "zero_variance_fraction": sum(flat) / max(1, len(flat)), "model_dir": settings.model_dir}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    parser.add_argument("--ppo-epochs", type=int, default=2)
    parser.add_argument("--beta", type=float, default=0.0,
                        help="GRPO's in-loss k3 KL to the base (0: none; 0.04 is TRL's older default)")
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--preference", default=None,
                        help="a suite taste (online_rl/simulate/suite.py) as the reward, on its own prompts "
                             "(default: brief_on_topic on the first 24 of PROMPTS)")
    parser.add_argument("--smoke", action="store_true",
                        help="2 steps, 2 prompts, 16 tokens: checks the fields")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.prompts, args.group, args.max_new_tokens, args.eval_samples = 2, 2, 2, 16, 1
    logging.basicConfig(level=logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="orl-bench-grpo-") as tmp:
        work = Path(tmp)
        control = _run(args, work, 0.0)
        trained = _run(args, work, args.learning_rate)
        model_dir = trained["model_dir"]
        count = 8 if args.smoke else None
        checks = {side: _checks(model_dir, adapter, count) for side, adapter in
                  (("base", None), ("trained", trained["adapter"]), ("control", control["adapter"]))}
        ability = {side: right for side, (right, _) in checks.items()}
        facts = {side: answered for side, (_, answered) in checks.items()}
    fn = f"fn_{_function(args.preference)['name']}"
    result = {
        "steps": args.steps, "prompts": args.prompts, "group": args.group,
        "learning_rate": args.learning_rate, "beta": args.beta,
        "reward_base": round(trained["eval"]["base_" + fn], 4),
        "reward_trained": round(trained["eval"][fn], 4),
        "reward_control": round(control["eval"][fn], 4),
        "gain_over_control": round(trained["eval"][fn] - control["eval"][fn], 4),
        "gain_over_base": round(trained["eval"][fn] - trained["eval"]["base_" + fn], 4),
        "tokens_trained": round(trained["eval"]["completion_tokens"], 2),
        "tokens_control": round(control["eval"]["completion_tokens"], 2),
        "tokens_base": round(trained["eval"]["base_completion_tokens"], 2),
        "ability_base": ability["base"], "ability_trained": ability["trained"],
        "ability_control": ability["control"],
        "seconds_trained": round(trained["seconds"], 1), "seconds_control": round(control["seconds"], 1),
        "zero_variance_fraction": round(trained["zero_variance_fraction"], 3), "smoke": args.smoke,
        "preference": args.preference, "facts_base": f"{sum(facts['base'])}/{len(facts['base'])}",
        "facts_kept_trained": facts_kept(facts["base"], facts["trained"]),
        "facts_kept_control": facts_kept(facts["base"], facts["control"]),
    }
    if missing := missing_fields(result, FIELDS):
        raise SystemExit(f"the result lacks {missing}")
    print(f"GRPO with a reward function: held-out reward {result['reward_trained']:.3f} trained, "
          f"{result['reward_control']:.3f} lr=0 control, {result['reward_base']:.3f} base "
          f"({result['gain_over_control']:+.3f} over the control); ability {ability}", flush=True)
    emit(result, "fp32")


if __name__ == "__main__":
    main()
