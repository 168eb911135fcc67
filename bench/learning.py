"""Learning that generalises: for each preference of the suite, what the loop learns from a fixed budget
of simulated feedback, against the base model and a no-learning control.

    deploy/local/env.sh .venv/bin/python bench/learning.py [--preferences all|shorter,numbers,...]
        [--events 500] [--rounds 5] [--kind thumbs] [--eval-samples 4] [--control shuffled|lr0|none]
        [--config deploy/local/demo.yaml] [--anchors short|neutral] [--set trainer.beta=0.1 ...]
        [--bootstrap HOST:PORT]
        [--record DIR] [--smoke]

On a real Kafka broker (started for the run unless `--bootstrap`), a real MLflow store and a local Ray
runtime, with the trainer settings of `--config` (the demo's by default, with its cold-start anchors,
`--anchors` picking the set: online_rl/demo/anchors.py) changed by `--set`: per preference, users
with that taste (32 users, 10 % silent, 10 % of the feedback flipped) ask the suite's training
prompts of its topics and send `--events` feedback events through the bus, the real joiner and
trainer learn in `--rounds` rounds, and every published version answers the next round and is
measured on the held-out prompts (online_rl/simulate/learning.py). The
baseline is the base model measured the same way, and the control one run of the same loop without
the signal, whose final version is measured on every preference's held-out prompts with the same
seeds: `--control shuffled` (the default) trains on the labels of the suite's first preference
shuffled across the answers (the same steps, anchors and learning rate: what training alone does to
each taste's rate), `--control lr0` runs at learning rate 0 (its adapter stays the identity, so it
answers as the base). `--record DIR` keeps every finished part: the same command continues a run
that did not finish (the whole suite takes longer than a working session on a 2-core machine).
With `--set trainer.flow=rollout` the trainer runs the rollout flow instead (the users' thumbs teach
its reward model; GRPO or PPO on fresh rollouts scored by it, `--set hybrid.*` for its settings): each
round, once it has read the round's samples, it is granted `hybrid.publish_every_steps` iterations
and publishes after the last, so a run trains as many iterations per feedback event on any machine.

Prints a table, then the machine line, then one JSON object: `per_preference` (base, final and
control liked rates, `gain` over the base, `gain_over_control`, the final version's general ability
and `ability_missed`, the prompts of the check it answers wrongly (its answers are in the record),
the rate of every version, and `facts_kept`: the share of the fact check's facts the base answers
that the final version still answers, online_rl/simulate/facts.py), `median_gain`, `min_gain`,
`ability_min` (of 8), `ability_base`, `facts_kept_min`, `facts_base` (facts the base answers, of
the check's), `control_facts_kept`,
`holdout` (the preferences kept out of the medians), and the settings that differ from the config.
`--smoke` checks that the benchmark runs (one preference, 8 events in 1 round, 1 answer per
held-out prompt, 8 facts of the fact check, the lr = 0 control); CI runs it on a tiny model
(`--config` with `model.path`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml

from bench.common import emit, kafka_broker
from online_rl.config import Settings, load_settings
from online_rl.hardware import resolve_precision
from online_rl.simulate.facts import facts_kept
from online_rl.simulate.learning import Evaluation, Lab, LearnConfig
from online_rl.simulate.suite import SUITE, SuiteEntry, suite_entry

ROOT = Path(__file__).resolve().parents[1]
FIELDS = ("per_preference", "median_gain", "min_gain", "ability_min", "ability_base", "facts_kept_min",
          "facts_base", "holdout", "min_gain_over_control", "control_ability", "control_facts_kept", "events",
          "rounds", "control", "duration_s", "machine")


def overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """['trainer.beta=0.1'] -> {'trainer': {'beta': 0.1}} (values read as YAML)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot or not name:
            raise SystemExit(f"--set {pair!r}: write SECTION.FIELD=VALUE, e.g. --set trainer.beta=0.1")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


def bench_settings(config: Path, bootstrap: str, work: Path, changes: dict[str, dict[str, Any]],
                   anchors: str = "short") -> Settings:
    """The config's settings on this run's broker and MLflow store, the embedded model prepared when the
    config names none, the cold-start anchors written where the config asks for them (as make demo does),
    the join window short (feedback comes at once)."""
    from online_rl.demo.anchors import write_cold_start
    from online_rl.models import prepare_embedded_model

    base = load_settings(config)
    if base.model.path is None:  # the embedded default, converted once from its PyPI package (as make demo)
        base = base.model_copy(update={"model": base.model.model_copy(
            update={"path": prepare_embedded_model(base.model_dir).path})})
    update: dict[str, Any] = {
        "kafka": base.kafka.model_copy(update={"bootstrap_servers": bootstrap}),
        "mlflow": base.mlflow.model_copy(update={"tracking_uri": f"sqlite:///{work / 'mlflow.db'}"}),
        "join": base.join.model_copy(update={"window_s": 2.0}),
    }
    trainer: dict[str, Any] = {"batch_timeout_s": 2.0}
    if base.trainer.cold_start_weight > 0 and base.trainer.cold_start is None:
        trainer["cold_start"] = write_cold_start(base, work / "cold-start.jsonl", anchors)  # type: ignore[arg-type]
    update["trainer"] = base.trainer.model_copy(update=trainer)
    settings = base.model_copy(update=update)
    for section, fields in changes.items():
        current = getattr(settings, section, None)
        if current is None:
            raise SystemExit(f"--set {section}.*: no settings section {section!r}")
        checked = type(current).model_validate(current.model_dump() | fields)
        settings = settings.model_copy(update={section: checked})
    return settings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preferences", default="all", help="'all' or suite names, comma-separated")
    parser.add_argument("--events", type=int, default=500, help="feedback events per preference")
    parser.add_argument("--rounds", type=int, default=5, help="versions published per preference")
    parser.add_argument("--kind", choices=["thumbs", "rating", "pairwise"], default="thumbs")
    parser.add_argument("--eval-samples", type=int, default=4, help="answers per held-out prompt")
    parser.add_argument("--control", choices=["shuffled", "lr0", "none"], default="shuffled",
                        help="shuffled: one run that trains on labels shuffled across answers (the same "
                             "steps, anchors and learning rate, no signal); lr0: one run at learning rate 0")
    parser.add_argument("--config", type=Path, default=ROOT / "deploy" / "local" / "demo.yaml")
    parser.add_argument("--anchors", choices=["short", "neutral"], default="short",
                        help="the cold-start set written when the config asks for one "
                             "(online_rl/demo/anchors.py)")
    parser.add_argument("--set", dest="changes", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engine", default="transformers", help="the serving engine that answers")
    parser.add_argument("--bootstrap", default=None, help="an existing Kafka broker (else one is started)")
    parser.add_argument("--record", type=Path, default=None,
                        help="a folder that keeps each finished part (base, each run, the control and its "
                             "adapter): the same command again continues where it stopped")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        args.preferences, args.events, args.rounds = "numbers", 8, 1
        args.eval_samples, args.control = 1, "lr0"

    entries = (
        list(SUITE)
        if args.preferences == "all"
        else [suite_entry(n.strip()) for n in args.preferences.split(",") if n.strip()]
    )
    config = LearnConfig(
        events=args.events, rounds=args.rounds, kind=args.kind, eval_samples=args.eval_samples,
        seed=args.seed, facts=8 if args.smoke else None,
    )
    changes = overrides(args.changes)
    began = time.monotonic()
    work = Path("/tmp") / f"orl-bench-learning-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    with kafka_broker(args.bootstrap) as bootstrap:
        settings = bench_settings(args.config, bootstrap, work, changes, args.anchors)
        lab = Lab(settings, engine=args.engine)
        try:
            record = Record(args.record, fingerprint(settings, config, args.control, args.engine),
                            base_fingerprint(settings, config, args.engine))
            result = run_suite(lab, entries, config, args.control, print, record)
        finally:
            lab.close()
    result |= {
        "events": args.events,
        "rounds": args.rounds,
        "kind": args.kind,
        "eval_samples": args.eval_samples,
        "control": args.control,
        "config": str(args.config.relative_to(ROOT))
        if args.config.is_relative_to(ROOT)
        else str(args.config),
        "set": args.changes,
        "anchors": args.anchors,
        "seed": args.seed,
        "duration_s": round(time.monotonic() - began, 1),
    }
    print_table(result)
    emit(result, trained_precision(settings))


class Record:
    """The finished parts of a bench run (base, each preference's run, the control), kept in
    DIR/results.jsonl under the run's fingerprint, with the control's and each run's final adapter: a
    run longer than one sitting continues where it stopped (`--record DIR`). The base model's parts
    (its rates, its ability and which facts of the fact check it answers) are kept under
    `base_key` (what they depend on: the model, the traffic and the engine, not the trainer's
    settings), so every study of settings in one folder shares one base measurement. Without a
    folder nothing is kept."""

    def __init__(self, folder: Path | None, key: str, base_key: str | None = None) -> None:
        self.folder, self.key, self.base_key = folder, key, base_key or key
        self.parts: dict[tuple[str, str], Any] = {}
        if folder is not None and (folder / "results.jsonl").exists():
            for line in (folder / "results.jsonl").read_text().splitlines():
                item = json.loads(line)
                if item.get("key") == self._key(item["part"], item["name"]):
                    self.parts[(item["part"], item["name"])] = item["data"]

    def _key(self, part: str, name: str) -> str:
        base = part == "base" or (part, name) in (("ability", "base"), ("facts", "base"))
        return self.base_key if base else self.key

    def get(self, part: str, name: str) -> Any:
        return self.parts.get((part, name))

    def put(self, part: str, name: str, data: Any) -> None:
        self.parts[(part, name)] = data
        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            with (self.folder / "results.jsonl").open("a") as out:
                out.write(json.dumps({"key": self._key(part, name), "part": part, "name": name,
                                      "data": data}) + "\n")

    @property
    def control_adapter(self) -> Path | None:
        return None if self.folder is None else self.folder / f"control-{self.key}"

    def run_adapter(self, name: str) -> Path | None:
        """Where the final version of preference `name`'s run is kept."""
        return None if self.folder is None else self.folder / f"run-{self.key}-{name}"


def trained_precision(settings: Any) -> str:
    """The precision the flow trains in on this machine (the rollout flow: `hybrid.precision`)."""
    chosen = settings.hybrid.precision if settings.trainer.flow == "rollout" else settings.trainer.precision
    return resolve_precision(chosen, log_choice=False).precision


def fingerprint(settings: Any, config: LearnConfig, control: str, engine: str) -> str:
    """What makes two bench runs' parts comparable: every setting, the traffic, the control, the engine
    and the machine's precision choice (not the broker's address, the paths or the run's seed-free
    bookkeeping)."""
    trainer = settings.trainer.model_dump(mode="json", exclude={"cold_start", "checkpoint_dir"})
    if settings.trainer.cold_start is not None:
        lines = Path(settings.trainer.cold_start).read_text().splitlines()  # by content, not write time
        ids = sorted(json.loads(line)["sample_id"] for line in lines if line.strip())
        trainer["cold_start_ids"] = hashlib.sha256("\n".join(ids).encode()).hexdigest()
    described = {
        "trainer": trainer,
        "join": settings.join.model_dump(mode="json"),
        "model": settings.model.name,
        # (the fact check's size only when cut: records from before it still match)
        "config": {k: v for k, v in asdict(config).items() if not (k == "facts" and v is None)},
        "control": control,
        "engine": engine,
        "precision": trained_precision(settings),
    }
    if settings.trainer.flow == "rollout":  # what that flow trains with (absent before it: records match)
        described |= {"hybrid": settings.hybrid.model_dump(mode="json", exclude={"group_id"}),
                      "rewards": settings.rewards.model_dump(mode="json")}
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def base_fingerprint(settings: Any, config: LearnConfig, engine: str) -> str:
    """What the base model's measurement depends on: the model, the evaluation's sampling and seeds,
    and the serving engine."""
    described = {"model": settings.model.name, "engine": engine, "eval_samples": config.eval_samples,
                 "seed": config.seed, "temperature": config.temperature, "max_tokens": config.max_tokens}
    if config.facts is not None:  # a cut fact check has its own base answers (records before it: whole)
        described["facts"] = config.facts
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_suite(
    lab: Lab, entries: list[SuiteEntry], config: LearnConfig, control: str, say: Any = print,
    record: Record | None = None,
) -> dict[str, Any]:
    """Base, learning runs and one control run (`shuffled` labels or learning rate 0), measured per
    preference; parts already in `record` are taken from it, new ones added to it."""
    record = record or Record(None, "")

    def measured(entry: SuiteEntry, adapter: str | None) -> Evaluation:
        return lab.evaluate(entry, adapter, config.eval_samples, config.seed, config.temperature,
                            config.max_tokens)

    base: dict[str, Evaluation] = {}
    for entry in entries:
        kept = record.get("base", entry.name)
        base[entry.name] = Evaluation(**kept) if kept else measured(entry, None)
        if not kept:
            record.put("base", entry.name, base[entry.name].as_dict())
    ability_base = record.get("ability", "base")
    if ability_base is None:
        ability_base = lab.ability(None)
        record.put("ability", "base", ability_base)
    facts_base = record.get("facts", "base")
    if facts_base is None:
        facts_base = lab.facts(None, config.facts)
        record.put("facts", "base", facts_base)
    say(f"base: ability {ability_base}/8, facts {sum(facts_base)}/{len(facts_base)}; "
        + ", ".join(f"{n} {b.liked_rate:.3f}" for n, b in base.items()))
    rows: dict[str, dict[str, Any]] = {}
    for entry in entries:
        kept = record.get("run", entry.name)
        if kept is None:
            run = lab.learn(entry, config, progress=say)
            if run.final_adapter is not None:
                lab.unload(run.final_adapter)
            kept_final = record.run_adapter(entry.name)
            if kept_final is not None and run.final_folder is not None:  # to study it again later
                shutil.copytree(run.final_folder, kept_final, dirs_exist_ok=True)
            final = run.final
            assert final is not None
            kept = {
                "final": final.as_dict(),
                "ability": run.ability,
                "ability_missed": run.ability_missed,
                "liked_feedback": round(run.liked_feedback, 4),
                "versions": [round(v["evaluation"].liked_rate, 4) for v in run.versions],
                "refused": run.refused,
                "facts_kept": facts_kept(facts_base, run.facts),
                "duration_s": round(run.duration_s, 1),
            }
            record.put("run", entry.name, kept)
        else:
            say(f"{entry.name}: taken from the record")
        rows[entry.name] = kept
    controls: dict[str, Evaluation] = {}
    control_ability = record.get("ability", "control")
    control_facts = record.get("facts", "control")
    missing = [e for e in entries if record.get("control", e.name) is None]
    for entry in entries:
        if entry not in missing:
            controls[entry.name] = Evaluation(**record.get("control", entry.name))
    if control in ("lr0", "shuffled") and missing:
        kept_adapter = record.control_adapter
        if kept_adapter is not None and kept_adapter.is_dir():
            name = f"control-{record.key}"
            lab.load(name, kept_adapter)
            if control_facts is None:  # a record from before the fact check
                control_facts = facts_kept(facts_base, lab.facts(name, config.facts))
                record.put("facts", "control", control_facts)
        else:
            if control == "lr0":
                control_run = lab.learn(SUITE[0], config, learning_rate=0.0, label="control-lr0",
                                        progress=say)
            else:
                shuffled = replace(config, shuffle_labels=True)
                control_run = lab.learn(SUITE[0], shuffled, label="control-shuffled", progress=say)
            # every version refused by the ability gate: the control answers as the base
            name, control_ability = control_run.final_adapter, control_run.ability
            record.put("ability", "control", control_ability)
            control_facts = facts_kept(facts_base, control_run.facts)
            record.put("facts", "control", control_facts)
            if kept_adapter is not None and control_run.final_folder is not None and name is not None:
                shutil.copytree(control_run.final_folder, kept_adapter, dirs_exist_ok=True)
        for entry in missing:
            controls[entry.name] = measured(entry, name)
            record.put("control", entry.name, controls[entry.name].as_dict())
        if name is not None:
            lab.unload(name)
    per: dict[str, Any] = {}
    for entry in entries:
        kept = rows[entry.name]
        final_rate = kept["final"]["liked_rate"]
        row: dict[str, Any] = {
            "kind": entry.kind,
            "holdout": entry.holdout,
            "base": round(base[entry.name].liked_rate, 4),
            "final": final_rate,
            "gain": round(final_rate - base[entry.name].liked_rate, 4),
            "ability": kept["ability"],
            "ability_missed": sorted(kept.get("ability_missed", {})),  # the prompts (answers: the record)
            "liked_feedback": kept["liked_feedback"],
            "versions": kept["versions"],
            "refused": kept.get("refused", 0),
            "facts_kept": kept.get("facts_kept"),  # None: a record from before the fact check
            "duration_s": kept["duration_s"],
        }
        if entry.name in controls:
            row["control"] = round(controls[entry.name].liked_rate, 4)
            row["gain_over_control"] = round(final_rate - controls[entry.name].liked_rate, 4)
        per[entry.name] = row
    scored = [r for r in per.values() if not r["holdout"]] or list(per.values())
    gains = [r["gain"] for r in scored]
    abilities = [r["ability"] for r in per.values() if r["ability"] is not None]
    kept_facts = [r["facts_kept"] for r in per.values() if r["facts_kept"] is not None]
    out: dict[str, Any] = {
        "per_preference": per,
        "median_gain": round(statistics.median(gains), 4),
        "min_gain": round(min(gains), 4),
        "ability_min": min(abilities) if abilities else None,
        "ability_base": ability_base,
        "facts_kept_min": min(kept_facts) if kept_facts else None,
        "facts_base": f"{sum(facts_base)}/{len(facts_base)}",
        "holdout": [n for n, r in per.items() if r["holdout"]],
    }
    if all("gain_over_control" in r for r in scored) and controls:
        out["control_ability"] = control_ability
        out["control_facts_kept"] = control_facts
        out["min_gain_over_control"] = round(min(r["gain_over_control"] for r in scored), 4)
    return out


def print_table(result: dict[str, Any]) -> None:
    print()
    print(
        f"{'preference':14s} {'kind':26s} {'base':>6s} {'control':>8s} {'final':>6s} {'gain':>7s} "
        f"{'ability':>7s} {'facts':>6s}  versions"
    )
    for name, row in result["per_preference"].items():
        control = f"{row['control']:.3f}" if "control" in row else "-"
        print(
            f"{name + (' (h)' if row['holdout'] else ''):14s} {row['kind']:26s} {row['base']:6.3f} "
            f"{control:>8s} "
            f"{row['final']:6.3f} {row['gain']:+7.3f} {str(row['ability']) + '/8':>7s} "
            f"{'-' if row['facts_kept'] is None else format(row['facts_kept'], '.3f'):>6s}  "
            + " ".join(f"{v:.2f}" for v in row["versions"])
        )
    print(
        f"median gain {result['median_gain']:+.3f}, min gain {result['min_gain']:+.3f}, ability min "
        f"{result['ability_min']}/8 (base {result['ability_base']}/8), facts kept min "
        f"{result['facts_kept_min']} (the base answers {result['facts_base']})"
    )


if __name__ == "__main__":
    main()
