"""The main job's benchmark: the served reward after learning from users against the base model's,
in one run of the whole loop.

    deploy/local/env.sh .venv/bin/python bench/demo.py [--budget 1200] [--measure 150] [--out DIR]
                                                       [--smoke]

Starts the loop as `make demo` does (`online-rl up --fresh` with deploy/local/demo.yaml, the cold-start
anchors and the trainer's cadence timed on this machine), runs the simulated users (`online-rl demo`:
100 users who like short answers, thumbs with 10 % noise, 10 % silent) until the last promoted version
has `--measure` answers with feedback since its promotion, writes the report and stops the loop. The
baseline is the base model serving the same users in the same run: the holdout (`gateway.holdout`,
one user in ten served by the base model all run) over the same period as the final figure. The last
line is one JSON object: `base_reward`, `final_reward` (0-1: the share of thumbs up) with
`base_interval` / `final_interval` (95 %) and `base_feedback` / `final_answers` (their counts),
`base_source` (`holdout`), `reward_ratio` (final / base), `reward_gain`, `promoted_versions`,
`freshness_s` (median: newest feedback trained on -> that version serving), `ability_base` /
`ability_final` (of 8 fixed factual prompts), `duration_s` (the simulated traffic), `up_s` (starting
the loop), `stopped_by` (goal or budget), rollbacks by verdict, restarts per component and the
machine. `--smoke` checks that the benchmark runs: 30 s of traffic from 20 users
with 8-token answers, the trainer's cadence as configured (not timed first), no promotion required,
at most 20 s of waiting for the gateway to act on the newest version. CI does not run it: the `up`
test (tests/launch/test_launch.py) runs the same loop and the same demo and checks every field of
`demo_figures` on its report (one start of the whole loop instead of two).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit
from online_rl.config import load_settings
from online_rl.demo import DemoOptions, run_demo
from online_rl.demo.anchors import write_cold_start
from online_rl.demo.tune import measure_step, tuned
from online_rl.launch import down, up

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("base_reward", "base_interval", "base_feedback", "base_source", "final_reward", "final_interval",
          "final_answers", "reward_ratio", "reward_gain", "promoted_versions", "freshness_s", "ability_base",
          "ability_final", "duration_s", "up_s", "stopped_by", "rollbacks", "restarts", "machine")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=1200.0, help="seconds of simulated traffic at most")
    parser.add_argument("--measure", type=int, default=150,
                        help="answers with feedback after the last promotion")
    parser.add_argument("--out", type=Path, default=ROOT / "demo-report", help="where the report goes")
    parser.add_argument("--smoke", action="store_true", help="a short run that checks the benchmark works")
    args = parser.parse_args()

    config = ROOT / "deploy" / "local" / "demo.yaml"
    os.environ["ORL_CONFIG"] = str(config)
    settings = load_settings(config)
    os.environ["ORL_TRAINER__COLD_START"] = str(
        write_cold_start(settings, settings.cache_dir / "demo" / "cold-start.jsonl"))
    if not args.smoke:
        os.environ.update(tuned(settings, measure_step(settings)))  # the trainer's cadence for this machine
    settings = load_settings(config)
    began = time.monotonic()
    up(settings, config, fresh=True)
    up_s = time.monotonic() - began
    # the smoke run waits 20 s, not 60, for the gateway to act on the newest version: it checks that the
    # benchmark runs, not the loop's decisions (the `up` test checks those)
    if args.smoke:
        options = DemoOptions(budget_s=30.0, measure=1, users=20, max_tokens=8, settle_s=20.0)
    else:
        options = DemoOptions(budget_s=args.budget, measure=args.measure)
    try:
        report = run_demo(settings, args.out, options)
    finally:
        down(settings)
    print(f"base model {report['base_reward']} -> after the last promotion {report['final_reward']}; "
          f"promoted {report['promoted_versions']}; freshness {report['freshness_s']} s; ability "
          f"{report['ability']['final']}/8 (base {report['ability']['base']}); report in {args.out}")
    emit(demo_figures(report, up_s), (report["machine"] or {}).get("precision"))


def demo_figures(report: dict[str, Any], up_s: float) -> dict[str, Any]:
    """The benchmark's figures (FIELDS, less the machine line that `emit` adds) from the demo's report.
    The `up` test (tests/launch/test_launch.py) checks them on the loop it runs, the same loop as
    this benchmark's (its smoke run was folded into that test: both started the whole loop)."""
    base, final = report["base_reward"], report["final_reward"]
    return {"base_reward": base, "final_reward": final, "base_interval": report["base_interval"],
            "final_interval": report["final_interval"], "base_feedback": report["base_feedback"],
            "base_source": report["base_source"],
            "reward_ratio": round(final / base, 3) if base and final is not None else None,
            "reward_gain": report["reward_gain"], "promoted_versions": report["promoted_versions"],
            "freshness_s": report["freshness_s"], "ability_base": report["ability"]["base"],
            "ability_final": report["ability"]["final"], "duration_s": report["meta"]["duration_s"],
            "up_s": round(up_s, 1), "stopped_by": report["stopped_by"],
            "final_answers": report["final_answers"], "rollbacks": report["rollbacks"],
            "restarts": report["restarts"]}


if __name__ == "__main__":
    main()
