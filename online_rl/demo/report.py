"""The demo's report: what the users said of each version over time, what the canary decided, what
MLflow holds, how fresh the served model was, and whether general ability held.

`build_report` is pure (the run's records in, a JSON-able dict out); `write_report` renders it as
`report.json`, `report.md` and `reward.png`. The reward is the users' feedback on the 0-1 scale
(thumbs: the share of thumbs up; ratings normalised), with their noise, as the canary saw it.

The base model's reward is the concurrent holdout's (`gateway.holdout`: users the base model serves
through the whole run) over the same period as the final figure, so both come from the same hour's
traffic (`base_source: "holdout"`; `"holdout_whole_run"` when none of its feedback fell in that
period); without a holdout it falls back to everything the base model served (mostly early traffic,
`base_source: "all"`). Both carry their counts and 95 % intervals.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from online_rl.simulate import Answer

__all__ = ["ABILITY_PROMPTS", "AbilityAnswer", "build_report", "correct", "interval95", "write_report"]

# Fixed factual prompts outside the simulated users' prompt set and unlike the cold-start anchors
# (online_rl/demo/anchors.py), each with the words a correct answer contains; the base model answers
# every one of them correctly at temperature 0.
ABILITY_PROMPTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Who wrote Hamlet?", ("shakespeare",)),
    ("Who discovered gravity?", ("newton",)),
    ("How many hours are in a day?", ("24", "twenty-four")),
    ("What is the chemical symbol for water?", ("h2o",)),
    ("Who painted the Mona Lisa?", ("leonardo", "da vinci")),
    ("What is the tallest mountain in the world?", ("everest",)),
    ("Which ocean lies between Europe and America?", ("atlantic",)),
    ("How many sides does a triangle have?", ("3", "three")),
)


@dataclass(frozen=True)
class AbilityAnswer:
    model: str
    prompt: str
    answer: str
    correct: bool


def correct(answer: str, accepted: Sequence[str]) -> bool:
    text = answer.lower()
    return any(word in text for word in accepted)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def interval95(values: Sequence[float]) -> list[float] | None:
    """A 95 % interval for the mean reward: Wilson's for thumbs (every value 0 or 1), else the normal
    approximation; None without values."""
    n = len(values)
    if n == 0:
        return None
    mean, z = sum(values) / n, 1.96
    if all(v in (0.0, 1.0) for v in values):
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(mean * (1 - mean) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    else:
        centre, half = mean, z * (statistics.stdev(values) / math.sqrt(n) if n > 1 else 1.0)
    return [round(max(0.0, centre - half), 3), round(min(1.0, centre + half), 3)]


def _version_name(registered: str, version: str) -> str:
    """The name a published version serves under."""
    return f"{registered}-v{version}"


def _final_period(
    rated: Sequence[Answer], promotions: Sequence[dict[str, Any]], start: float, registered: str
) -> tuple[dict[str, Any], list[float], float]:
    """The final figure: the last promoted version, how long after the first answer it was promoted and its
    rewards since (the holdout's aside); with the start of that period. Without a promotion, no version
    and the whole run."""
    if not promotions:
        return {"version": None, "since": None, "answers": 0}, [], start
    last = promotions[-1]
    since, name = last["at"], _version_name(registered, last["version"])
    rewards = [float(a.reward) for a in rated  # type: ignore[arg-type]
               if a.version == name and a.at >= since and a.arm != "holdout"]
    return {"version": name, "since": since - start, "answers": len(rewards)}, rewards, since


def _baseline(rated: Sequence[Answer], since: float, base_model: str) -> tuple[list[float], str]:
    """The base model's rewards and where they come from (`base_source`, see the module docstring)."""
    held = [a for a in rated if a.arm == "holdout"]
    base = [float(a.reward) for a in held if a.at >= since]  # type: ignore[arg-type]
    if base:
        return base, "holdout"
    if held:  # none of the holdout's feedback fell in that period: its whole run
        return [float(a.reward) for a in held], "holdout_whole_run"  # type: ignore[arg-type]
    return [float(a.reward) for a in rated if a.version == base_model], "all"  # type: ignore[arg-type]


def _timeline(
    rated: Sequence[Answer], start: float, bucket_s: float, served_versions: Sequence[str]
) -> list[dict[str, Any]]:
    """Reward per version over time, in buckets of `bucket_s` seconds from the first answer."""
    cells: dict[tuple[int, str], list[float]] = defaultdict(list)
    overall: dict[int, list[float]] = defaultdict(list)
    for a in rated:
        bucket = int((a.at - start) // bucket_s)
        cells[(bucket, a.version)].append(float(a.reward))  # type: ignore[arg-type]
        overall[bucket].append(float(a.reward))  # type: ignore[arg-type]
    return [
        {
            "bucket": b,
            "start_s": b * bucket_s,
            "served_reward": _round(_mean(overall[b])),
            "feedback": len(overall[b]),
            "versions": {
                v: {"reward": _round(_mean(cells[(b, v)])), "feedback": len(cells[(b, v)])}
                for v in served_versions
                if cells.get((b, v))
            },
        }
        for b in sorted(overall)
    ]


def _freshness(
    answers: Sequence[Answer], history: Sequence[dict[str, Any]], trained_on: dict[str, set[str]],
    registered: str,
) -> dict[str, float]:
    """Per version: from the newest feedback it was trained on to its serving traffic, in seconds."""
    sent_at = {a.request_id: a.feedback_at for a in answers if a.feedback_at is not None}
    first_served: dict[str, float] = {}
    for entry in history:
        if entry["action"] == "start":
            first_served.setdefault(str(entry["version"]), entry["at"])
    freshness: dict[str, float] = {}
    for version, requests in trained_on.items():
        times = [sent_at[r] for r in requests if r in sent_at]
        if times and version in first_served:
            freshness[_version_name(registered, version)] = round(first_served[version] - max(times), 1)
    return freshness


def _per_version(answers: Sequence[Answer], served_versions: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per version served: its answers, feedback, mean reward and mean taste score."""
    out = {}
    for v in served_versions:
        mine = [a for a in answers if a.version == v]
        rewards = [float(a.reward) for a in mine if a.reward is not None]
        out[v] = {
            "answers": len(mine),
            "feedback": len(rewards),
            "reward": _round(_mean(rewards)),
            "taste_score": _round(_mean([a.score for a in mine])),
        }
    return out


def _ability_summary(
    ability: Sequence[AbilityAnswer], base_model: str, final_version: str | None
) -> dict[str, Any]:
    """The general-ability check: the base model's and the final version's correct answers, whether the
    final one collapsed (two or more fewer), and every model's answers."""
    by_model: dict[str, dict[str, Any]] = defaultdict(lambda: {"correct": 0, "asked": 0, "answers": []})
    for item in ability:
        entry = by_model[item.model]
        entry["asked"] += 1
        entry["correct"] += int(item.correct)
        entry["answers"].append({"prompt": item.prompt, "answer": item.answer, "correct": item.correct})
    base_correct = by_model.get(base_model, {}).get("correct", 0)
    final_correct = by_model.get(final_version, {}).get("correct") if final_version else None
    return {
        "base": base_correct,
        "final": final_correct,
        "asked": len(ABILITY_PROMPTS),
        "collapsed": final_correct is not None and final_correct < base_correct - 1,
        "models": dict(by_model),
    }


def _rolled_back(history: Sequence[dict[str, Any]], registered: str) -> dict[str, list[str]]:
    """The versions rolled back or rejected, by why: the canary's verdict, "manual" or "rejected"."""
    out: dict[str, list[str]] = defaultdict(list)
    for e in history:
        if e["action"] in ("rollback", "reject"):
            verdict = (e.get("evidence") or {}).get("verdict") or ("manual" if e["action"] == "rollback"
                                                                  and e.get("actor") != "controller"
                                                                  else "rejected")
            out[verdict].append(_version_name(registered, str(e["version"])))
    return dict(out)


def _decisions(history: Sequence[dict[str, Any]], start: float, registered: str) -> list[dict[str, Any]]:
    """The gateway's rollout decisions, timed from the first answer."""
    return [
        {
            "t_s": round(e["at"] - start, 1),
            "version": _version_name(registered, str(e["version"])),
            "action": e["action"],
            "weight": e.get("weight"),
            "reason": e.get("reason", ""),
            "actor": e.get("actor"),
            "verdict": (e.get("evidence") or {}).get("verdict"),
        }
        for e in history
    ]


def build_report(
    answers: Sequence[Answer],
    history: Sequence[dict[str, Any]],
    versions: Sequence[dict[str, Any]],
    trained_on: dict[str, set[str]],
    ability: Sequence[AbilityAnswer],
    base_model: str,
    registered: str,
    meta: dict[str, Any],
    bucket_s: float = 60.0,
) -> dict[str, Any]:
    """The report (see the module docstring). `history`: the gateway's rollout decisions; `versions`:
    MLflow's versions (`version`, `aliases`, `tags`, `created_at`); `trained_on`: per version number,
    the request ids of the feedback its training samples carried."""
    start = min((a.at for a in answers), default=meta.get("started_at", 0.0))
    promotions = [e for e in history if e["action"] == "promote"]
    rated = [a for a in answers if a.reward is not None]
    final, final_rewards, since = _final_period(rated, promotions, start, registered)
    base, base_source = _baseline(rated, since, base_model)
    base_reward, final_reward = _mean(base), _mean(final_rewards)
    gain = None if final_reward is None or base_reward is None else _round(final_reward - base_reward)
    served_versions = sorted({a.version for a in answers}, key=lambda v: (v != base_model, len(v), v))
    freshness = _freshness(answers, history, trained_on, registered)
    components = meta.get("components", {})
    return {
        "base_reward": _round(base_reward),
        "base_interval": interval95(base),
        "base_source": base_source,
        "final_reward": _round(final_reward),
        "final_interval": interval95(final_rewards),
        "reward_gain": gain,
        "stopped_by": meta.get("stopped_by"),
        "final_answers": final["answers"],
        "machine": meta.get("machine"),
        "restarts": {n: c.get("restarts", 0) for n, c in components.items()},
        "exited": [dict(c, name=n) for n, c in components.items() if c.get("exited_during_run")],
        "rollbacks": _rolled_back(history, registered),
        "promoted_versions": [_version_name(registered, e["version"]) for e in promotions],
        "freshness_s": statistics.median(freshness.values()) if freshness else None,
        "freshness_s_by_version": freshness,
        "final": final,
        "base_feedback": len(base),
        "ability": _ability_summary(ability, base_model, final["version"]),
        "versions": _per_version(answers, served_versions),
        "timeline": _timeline(rated, start, bucket_s, served_versions),
        "decisions": _decisions(history, start, registered),
        "mlflow_versions": [dict(v) for v in versions],
        "meta": {**meta, "bucket_s": bucket_s},
    }


def _plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bucket = report["meta"]["bucket_s"]
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=110)
    series: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for row in report["timeline"]:
        for version, cell in row["versions"].items():
            if cell["reward"] is not None and cell["feedback"] >= 3:
                series[version][0].append((row["start_s"] + bucket / 2) / 60)
                series[version][1].append(cell["reward"])
    for version, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", linewidth=1.2, markersize=3.5, label=version, alpha=0.85)
    xs = [(r["start_s"] + bucket / 2) / 60 for r in report["timeline"] if r["served_reward"] is not None]
    ys = [r["served_reward"] for r in report["timeline"] if r["served_reward"] is not None]
    ax.plot(xs, ys, color="black", linewidth=2.4, label="all traffic")
    for decision in report["decisions"]:
        if decision["action"] in ("promote", "rollback"):
            colour = "tab:green" if decision["action"] == "promote" else "tab:red"
            ax.axvline(decision["t_s"] / 60, color=colour, linestyle="--", linewidth=1)
            ax.text(
                decision["t_s"] / 60,
                1.02,
                f"{decision['action']} {decision['version'].rsplit('-', 1)[-1]}",
                rotation=90,
                fontsize=7,
                color=colour,
                va="bottom",
                ha="center",
            )
    if report["base_reward"] is not None:
        ax.axhline(report["base_reward"], color="grey", linestyle=":", linewidth=1, label="base model")
    ax.set_ylim(0, 1.0)
    ax.set_xlabel("minutes since the first request")
    ax.set_ylabel(f"reward (users' feedback, 0-1; per {bucket:.0f}s)")
    ax.set_title(f"Served reward per version — {report['meta'].get('preference', '')}", fontsize=10)
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _span(report: dict[str, Any], key: str) -> str:
    """The 95 % interval under `key`, as the text that follows a figure ("" without one)."""
    bounds = report.get(key)
    return "" if not bounds else f", 95 % interval {bounds[0]:.3f}–{bounds[1]:.3f}"


def _summary(report: dict[str, Any], image: str) -> list[str]:
    """The title, the run in a sentence, the machine, the picture and the table of headline figures."""
    meta = report["meta"]
    ability = report["ability"]
    fresh_text = "—" if report["freshness_s"] is None else f"{report['freshness_s']:.0f} s"
    machine = report.get("machine") or {}
    stopped = {"goal": "the goal was reached (the promotions, then the measured answers)",
               "budget": "the time budget ran out before the goal"}.get(report.get("stopped_by") or "", "—")
    base_how = {"holdout": "the holdout, the base model serving beside the versions in the same period",
                "holdout_whole_run": "the holdout over the whole run"}.get(report.get("base_source") or "",
                                                                           "everything the base model served")
    return [
        "# online-rl demo report",
        "",
        f"Users: {meta.get('users')} simulated, taste `{meta.get('preference')}`, {meta.get('kind')}, "
        f"noise {meta.get('noise')}, silent {meta.get('silent')}; {meta.get('requests')} requests in "
        f"{meta.get('duration_s', 0) / 60:.1f} min; stopped because {stopped}.",
        "",
        f"Machine: {machine.get('cpu', '?')}, ISA {machine.get('isa', '?')}, {machine.get('cores', '?')} "
        f"cores, trainer precision {machine.get('precision', '?')}.",
        "",
        f"![reward per version]({image})",
        "",
        "| | value |",
        "|---|---|",
        f"| base model's reward ({base_how}) | {_fmt(report['base_reward'])} ({report['base_feedback']} "
        f"feedback{_span(report, 'base_interval')}) |",
        f"| final reward (after the last promotion, {report['final']['version'] or '—'}) | "
        f"{_fmt(report['final_reward'])} ({report['final']['answers']} feedback"
        f"{_span(report, 'final_interval')}) |",
        f"| gain | {_fmt(report['reward_gain'])} |",
        f"| promoted through the canary | {', '.join(report['promoted_versions']) or 'none'} |",
        f"| freshness (feedback → a version trained on it serving), median | "
        f"{fresh_text} |",
        f"| general ability (fixed factual prompts correct) | base {ability['base']}/{ability['asked']}, "
        f"final {'—' if ability['final'] is None else ability['final']}/{ability['asked']}"
        f"{' — COLLAPSED' if ability['collapsed'] else ''} |",
        f"| rolled back | {_rollbacks(report.get('rollbacks') or {})} |",
        "",
    ]


def _exits(report: dict[str, Any]) -> list[str]:
    """Each component that exited during the run, with the end of its log."""
    lines: list[str] = []
    for exited in report.get("exited") or []:
        state = "gave up on it" if exited.get("failed") else "restarted it"
        lines += [f"**{exited['name']} exited during the run** ({exited.get('restarts', 0)} restart(s); the "
                  f"watchdog {state}). The end of its log when it exited:", "", "```",
                  *(line.removeprefix("    ") for line in str(exited.get("tail", "")).splitlines()),
                  "```", ""]
    return lines


def _timeline_table(report: dict[str, Any]) -> list[str]:
    """Reward per version over time: a row per bucket, a column per version."""
    versions = list(report["versions"])
    lines = [
        "## Reward per version over time",
        "",
        "| minute | all traffic | " + " | ".join(versions) + " |",
        "|---|---|" + "---|" * len(versions),
    ]
    for row in report["timeline"]:
        cells = []
        for v in versions:
            cell = row["versions"].get(v)
            cells.append(f"{cell['reward']:.2f} ({cell['feedback']})" if cell else "")
        lines.append(
            f"| {row['start_s'] / 60:.0f} | {_fmt(row['served_reward'])} ({row['feedback']}) | "
            + " | ".join(cells)
            + " |"
        )
    return lines


def _versions_table(report: dict[str, Any]) -> list[str]:
    """Each version served: answers, feedback, reward and taste score."""
    lines = ["", "## Versions served", "",
             "| version | answers | feedback | reward | taste score (no noise) |", "|---|---|---|---|---|"]
    for v, s in report["versions"].items():
        lines.append(
            f"| {v} | {s['answers']} | {s['feedback']} | {_fmt(s['reward'])} | {_fmt(s['taste_score'])} |"
        )
    return lines


def _decisions_table(report: dict[str, Any]) -> list[str]:
    """The canary gateway's decisions in order, with their reasons."""
    lines = ["", "## Rollout decisions (the canary gateway)", "", "| t | version | action | reason |",
             "|---|---|---|---|"]
    for d in report["decisions"]:
        reason = d["reason"].replace("|", "\\|")
        lines.append(f"| {d['t_s'] / 60:.1f} min | {d['version']} | {d['action']} | {reason} |")
    return lines


def _mlflow_table(report: dict[str, Any]) -> list[str]:
    """MLflow's versions: aliases, rollout status and freshness."""
    lines = ["", "## MLflow versions", "", "| version | aliases | rollout status | freshness |",
             "|---|---|---|---|"]
    fresh = report["freshness_s_by_version"]
    for v in report["mlflow_versions"]:
        served = f"{report['meta'].get('registered')}-v{v['version']}"
        lines.append(
            f"| {v['version']} | {', '.join(v['aliases']) or ''} | {v['tags'].get('rollout.status', '')} | "
            f"{'' if served not in fresh else f'{fresh[served]:.0f} s'} |"
        )
    return lines


def _ability_answers(report: dict[str, Any]) -> list[str]:
    """Each model's answers to the general-ability prompts, marked right or wrong."""
    lines = ["", "## General ability", ""]
    for model, entry in report["ability"]["models"].items():
        lines.append(f"**{model}**: {entry['correct']}/{entry['asked']} correct")
        lines.append("")
        for item in entry["answers"]:
            mark = "✓" if item["correct"] else "✗"
            lines.append(f"- {mark} {item['prompt']} — {item['answer'].strip()[:120]!r}")
        lines.append("")
    return lines


def _look_around(report: dict[str, Any]) -> list[str]:
    """Where to look next: MLflow, the rollout page, the CLI."""
    meta = report["meta"]
    return [
        "## Look around",
        "",
        f"- MLflow UI (versions, aliases, lineage, training runs): {meta.get('mlflow_url')}",
        f"- the rollout page: {meta.get('gateway_url')}/rollout/ui "
        f"(the admin key in {meta.get('keys_file')})",
        "- `.venv/bin/online-rl status`; stop everything with `.venv/bin/online-rl down`",
        "",
    ]


def _markdown(report: dict[str, Any], image: str) -> str:
    """report.md: the headline figures, then a section per table, then where to look next."""
    return "\n".join(
        _summary(report, image) + _exits(report) + _timeline_table(report) + _versions_table(report)
        + _decisions_table(report) + _mlflow_table(report) + _ability_answers(report) + _look_around(report)
    )


def _rollbacks(by_verdict: dict[str, list[str]]) -> str:
    words = {"worse": "worse on the users' feedback", "inconclusive": "for lack of evidence (no verdict "
             "within the step's limit)", "guardrail": "a guardrail (errors, latency, KL)",
             "rejected": "before any exposure (load failure or the off-policy gate)", "manual": "by hand"}
    parts = [f"{', '.join(v.rsplit('-', 1)[-1] for v in versions)}: {words.get(verdict, verdict)}"
             for verdict, versions in by_verdict.items()]
    return "; ".join(parts) or "none"


def write_report(report: dict[str, Any], folder: Path) -> dict[str, Path]:
    """report.json, report.md and reward.png in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / "report.json", "markdown": folder / "report.md", "plot": folder / "reward.png"}
    paths["json"].write_text(json.dumps(report, indent=2, default=str))
    _plot(report, paths["plot"])
    paths["markdown"].write_text(_markdown(report, paths["plot"].name))
    return paths
