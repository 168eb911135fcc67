"""The demo report's figures from a run's records: base and final reward, promotions, freshness."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from online_rl.demo import AbilityAnswer, build_report, write_report
from online_rl.demo.report import ABILITY_PROMPTS, interval95
from online_rl.simulate import Answer

BASE, REG = "SmolLM2-135M-Instruct", "online-rl-policy"


def _answers() -> list[Answer]:
    out = []
    # 0-100 s: the base model, liked 3 times in 10; 100-200 s: v1 on half the users, liked 8 in 10;
    # after its promotion at 200 s: v1 for everyone, liked 9 in 10 (one silent user in 10).
    for i in range(100):
        out.append(Answer(1000 + i, f"u{i % 7}", f"b{i}", BASE, 0.3, float(i % 10 < 3),
                          1000.5 + i))
    for i in range(100):
        version = f"{REG}-v1" if i % 2 else BASE
        liked = i // 2 % 10 < (8 if i % 2 else 3)
        out.append(Answer(1100 + i, f"u{i % 7}", f"m{i}", version, 0.5, float(liked),
                          1100.5 + i))
    for i in range(100):
        out.append(Answer(1200 + i, f"u{i % 7}", f"a{i}", f"{REG}-v1", 0.9, None if i % 10 == 9 else 1.0,
                          None if i % 10 == 9 else 1200.5 + i))
    return out


HISTORY = [
    {"at": 1100.0, "version": "1", "action": "start", "reason": "rollout of version 1 at 50%", "weight": 0.5},
    {"at": 1200.0, "version": "1", "action": "promote", "reason": "no worse", "weight": 1.0},
    {"at": 1250.0, "version": "2", "action": "start", "reason": "rollout of version 2 at 50%", "weight": 0.5},
    {"at": 1280.0, "version": "2", "action": "rollback", "reason": "challenger worse", "weight": 0.0,
     "actor": "controller", "evidence": {"verdict": "worse"}},
    {"at": 1290.0, "version": "3", "action": "start", "reason": "rollout of version 3 at 50%", "weight": 0.5},
    {"at": 1295.0, "version": "3", "action": "rollback", "reason": "no verdict after 150 challenger rewards",
     "weight": 0.0, "actor": "controller", "evidence": {"verdict": "inconclusive"}},
]
META = {"preference": "length:12", "registered": REG, "stopped_by": "goal",
        "machine": {"cpu": "Some CPU", "isa": "AVX2", "cores": 2, "precision": "fp32"},
        "components": {"trainer": {"restarts": 1, "exited_during_run": True, "failed": False,
                                   "tail": "    Traceback ...\n    MemoryError", "exit_code": -9},
                       "joiner": {"restarts": 0, "exited_during_run": False, "failed": False, "tail": ""}}}
VERSIONS = [
    {"version": "1", "aliases": ["champion"], "tags": {"rollout.status": "promoted"}, "created_at": 1095.0},
    {"version": "2", "aliases": [], "tags": {"rollout.status": "rolled_back"}, "created_at": 1245.0},
]


def test_the_report_measures_base_final_promotions_and_freshness(tmp_path: Path) -> None:
    ability = [AbilityAnswer(model, prompt, "Tokyo" if i else "no idea", bool(i))
               for model in (BASE, f"{REG}-v1") for i, (prompt, _) in enumerate(ABILITY_PROMPTS)]
    # v1 trained on feedback up to request b79 (sent at 1079.5); it began serving at 1100; v2 on m40
    # (sent 1140.5), serving at 1250.
    trained = {"1": {"b3", "b79"}, "2": {"m40", "unknown"}}
    report = build_report(_answers(), HISTORY, VERSIONS, trained, ability, BASE, REG, META, bucket_s=50)
    assert report["base_reward"] == 0.3  # 100 + 50 base answers, 30 % liked
    assert report["final_reward"] == 1.0 and report["final"]["answers"] == 90  # after the promotion, v1 only
    assert report["reward_gain"] == 0.7
    assert report["promoted_versions"] == [f"{REG}-v1"]
    assert report["freshness_s_by_version"] == {f"{REG}-v1": 20.5, f"{REG}-v2": 109.5}
    assert report["freshness_s"] == 65.0
    assert report["ability"] == {**report["ability"], "base": 7, "final": 7, "asked": 8, "collapsed": False}
    assert [d["action"] for d in report["decisions"]] == ["start", "promote", "start", "rollback", "start",
                                                          "rollback"]
    # what a reader needs to trust the figure: why it stopped, how many answers the final figure rests on,
    # which machine, which components fell over, and whether rollbacks were on evidence or for its lack
    assert report["stopped_by"] == "goal" and report["final_answers"] == 90
    assert report["machine"]["precision"] == "fp32" and report["restarts"] == {"trainer": 1, "joiner": 0}
    assert [e["name"] for e in report["exited"]] == ["trainer"]
    assert report["rollbacks"] == {"worse": [f"{REG}-v2"], "inconclusive": [f"{REG}-v3"]}
    first = report["timeline"][0]
    assert first["start_s"] == 0 and first["versions"] == {BASE: {"reward": 0.3, "feedback": 50}}

    paths = write_report(report, tmp_path)
    assert json.loads(paths["json"].read_text())["final_reward"] == 1.0
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = paths["markdown"].read_text()
    assert report["base_source"] == "all"  # no holdout in this run: everything the base served
    assert "| base model's reward (everything the base model served) | 0.300 (150 feedback, 95 % interval " \
        "0.232–0.378) |" in markdown
    assert f"| promoted through the canary | {REG}-v1 |" in markdown
    assert "rollback | challenger worse" in markdown
    assert "| rolled back | v2: worse on the users' feedback; v3: for lack of evidence" in markdown
    assert "**trainer exited during the run** (1 restart(s); the watchdog restarted it)" in markdown
    assert "MemoryError" in markdown and "stopped because the goal was reached" in markdown
    assert "Machine: Some CPU, ISA AVX2, 2 cores, trainer precision fp32." in markdown


def test_without_a_promotion_there_is_no_final_reward_and_a_collapse_is_flagged() -> None:
    answers = [a for a in _answers() if a.at < 1100]
    ability = [AbilityAnswer(BASE, p, "x", True) for p, _ in ABILITY_PROMPTS]
    report = build_report(answers, HISTORY[:1], VERSIONS[:1], {}, ability, BASE, REG, {}, bucket_s=50)
    assert report["final_reward"] is None and report["reward_gain"] is None
    assert report["promoted_versions"] == [] and report["freshness_s"] is None
    collapsed = ability + [AbilityAnswer(f"{REG}-v1", p, "x", i < 2)
                           for i, (p, _) in enumerate(ABILITY_PROMPTS)]
    report = build_report(_answers(), HISTORY, VERSIONS, {}, collapsed, BASE, REG, {}, bucket_s=50)
    assert report["ability"]["final"] == 2 and report["ability"]["collapsed"] is True


def test_with_a_holdout_the_base_reward_is_the_holdouts_over_the_final_period() -> None:
    # the holdout user "h" gets the base model all along: liked 1 in 10 before the promotion (not the
    # final period) and 4 in 10 after it, when v1 serves everyone else
    holdout = [Answer(1000 + i, "h", f"h{i}", BASE, 0.3, float(i % 10 < (1 if i < 200 else 4)), 1000.5 + i,
                      "holdout") for i in range(0, 300, 2)]
    report = build_report(_answers() + holdout, HISTORY, VERSIONS, {}, [], BASE, REG, META, bucket_s=50)
    assert report["base_source"] == "holdout"
    assert report["base_feedback"] == 50 and report["base_reward"] == 0.4
    assert report["final_reward"] == 1.0 and report["final_answers"] == 90
    low, high = report["base_interval"]
    assert low < 0.4 < high and high - low < 0.3  # Wilson's interval on 50 thumbs
    assert report["final_interval"][1] == 1.0 and report["final_interval"][0] > 0.9
    assert "the holdout, the base model serving beside the versions in the same period" in \
        write_report(report, Path(tempfile.mkdtemp()))["markdown"].read_text()


def test_interval_is_wilsons_for_thumbs_and_normal_for_ratings() -> None:
    assert interval95([]) is None
    assert interval95([1.0] * 20) == [0.839, 1.0]  # Wilson's: never a zero-width interval at 20/20
    low, high = interval95([0.25, 0.5, 0.75] * 10)
    assert low == pytest.approx(0.5 - 1.96 * 0.2075 / 30 ** 0.5, abs=2e-3) and high > 0.5
