"""Every benchmark still runs: each one's `--smoke` mode (tiny sizes) finishes and its last line is one
JSON object with every field the benchmark documents (its `FIELDS`).

The figures of a smoke run mean nothing (seconds of load, a tiny model where the benchmark allows
one); what is checked is that a benchmark cannot break unseen between the runs that produce the
figures in docs/benchmarks.md.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bench.common import missing_fields
from tests.conftest import TINY_NAME

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

ROOT = Path(__file__).resolve().parents[2]
ENV_SH = ROOT / "deploy" / "local" / "env.sh"


def _fields(name: str) -> tuple[str, ...]:
    """The benchmark's FIELDS, read from its source (no import: some start services at import)."""
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        if any(getattr(t, "id", None) == "FIELDS" for t in targets):
            return tuple(ast.literal_eval(value))
    raise AssertionError(f"bench/{name}.py documents no FIELDS")


SAID: dict[str, str] = {}  # each benchmark's last output


def _run(name: str, args: list[str], env: dict[str, str] | None = None, timeout_s: float = 600,
         every_field: bool = True) -> dict:
    command = ["bash", str(ENV_SH), sys.executable, str(ROOT / "bench" / f"{name}.py"), "--smoke", *args]
    with subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # SIGTERM first: the benchmark's own clean-up stops what it started (a Kafka cluster, an
            # MLflow server: processes of their own, which a SIGKILL of the benchmark would leave behind)
            process.terminate()
            try:
                stdout, stderr = process.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, stderr = process.communicate()
            raise AssertionError(f"bench/{name}.py --smoke ran over {timeout_s} s:\n"
                                 f"{(stdout + stderr)[-3000:]}") from None
    tail = (stdout + stderr)[-3000:]
    assert process.returncode == 0, f"bench/{name}.py --smoke exited {process.returncode}:\n{tail}"
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert lines, f"bench/{name}.py --smoke printed nothing:\n{tail}"
    result = json.loads(lines[-1])
    missing = missing_fields(result, _fields(name)) if every_field else []
    assert not missing, f"bench/{name}.py --smoke lacks {missing} in its JSON line:\n{lines[-1]}"
    machine = result["machine"]
    assert machine["cpu"] and machine["isa"] and machine["cores"] >= 1, machine
    SAID[name] = stdout  # what the benchmark printed, for a failure's message
    return result


@pytest.mark.parametrize("name", ["algos", "gateway", "deploy", "inference", "hybrid"])
def test_a_benchmark_without_a_broker_runs_and_prints_its_fields(name: str) -> None:
    _run(name, [])


@pytest.mark.parametrize("name", ["bus", "feedback_api", "trainer", "scale"])
def test_a_benchmark_on_the_broker_runs_and_prints_its_fields(name: str, kafka_bootstrap: str) -> None:
    _run(name, ["--bootstrap", kafka_bootstrap])


def test_hostile_input_neither_crashes_nor_skews_nor_ships_a_forgery(kafka_bootstrap: str,
                                                                     tiny_model: Path) -> None:
    """bench/hostile.py's short schedule (200 Hypothesis records per topic; the full one is 10,000):
    unlike the other smoke runs, its figures are checked, since each is a guarantee of issue 23."""
    result = _run("hostile", ["--bootstrap", kafka_bootstrap, "--model", str(tiny_model)])
    assert result["records"] == 600 and result["rejects"] > 300  # most generated records are hostile
    assert result["crashes"] == 0 and result["dlq_share"] == 1.0 and result["dlq_extra"] == 0
    # one event dated 1e6 s ahead leaves the joined rate as it was; the control (no bound) drops
    assert result["samples_rate_after_future_event"] >= 0.75, result
    assert result["control_rate_after_future_event"] < result["samples_rate_after_future_event"], result
    assert result["forged_versions_loaded"] == 0 and result["genuine_versions_loaded"] == 1
    assert result["huge_body_sent_mib"] <= 64, result  # a 1 GiB body is refused early


# bench/chaos.py's short schedule (issue 27), one part (or two short ones) per test: the parts share
# nothing, and those whose figures have no time bound run side by side with the rest of the suite. Alone
# on the 2-core machine the parts took brokers 48 s, joiner 43, trainer 187, outage 95, serving 111,
# bus 146. Their figures are guarantees, so they are checked.
_CHAOS_FIGURES = {  # which part prints which documented field (bench/chaos.py's FIELDS); serving: the rest
    "trainer": {"samples_produced", "samples_trained", "versions", "versions_with_overlapping_offsets",
                "offset_gaps", "orphan_versions", "challenger_is_newest", "kills", "restart_to_first_step_s"},
    "joiner": {"joiner_kills", "joiner_sigkilled", "joiner_requests", "samples_duplicated", "samples_missing",
               "joiner_lifetime_s"},
    "bus": {"bus_outage_s", "ready_after_broker_s"},
    "run": {"seconds", "schedule", "part_s"},
}


def _chaos_part_of(field: str) -> str:
    if field.startswith("outage_"):
        return "outage"
    if field.startswith(("broker_", "feedback_")):
        return "brokers"
    return next((part for part, named in _CHAOS_FIGURES.items() if field in named), "serving")


def _chaos(kafka_bootstrap: str, tiny_model: Path, parts: str) -> dict:
    result = _run("chaos", ["--bootstrap", kafka_bootstrap, "--model", str(tiny_model),
                            "--model-name", TINY_NAME, "--parts", parts], timeout_s=780, every_field=False)
    assert set(result["part_s"]) == set(parts.split(",")), result
    # a part prints its own documented fields (and the run's): every one of them
    owed = [f for f in _fields("chaos") if _chaos_part_of(f) in {"run", *parts.split(",")}]
    missing = missing_fields(result, owed)
    assert not missing, f"bench/chaos.py --smoke --parts {parts} lacks {missing}:\n{result}"
    return result


def test_chaos_a_kafka_node_and_the_joiner_killed_lose_and_duplicate_nothing(kafka_bootstrap: str,
                                                                             tiny_model: Path) -> None:
    """The leader of a three-node Kafka cluster SIGKILLed while users post feedback through the real API;
    the joiner SIGKILLed 3 times inside or right after its transaction while users chat and give thumbs."""
    result = _chaos(kafka_bootstrap, tiny_model, "brokers,joiner")
    # every event the API acknowledged is on the topic (a retried one may be there twice: same event id,
    # which the joiner counts once); the client's retries hid the failover from its caller
    assert result["broker_cycles"] == 1 and result["broker_leader_kills"] == 1
    assert result["feedback_acked"] > 50 and result["feedback_on_topic"] == result["feedback_acked"], result
    assert result["feedback_client_errors"] == 0, result
    assert result["joiner_sigkilled"] == result["joiner_kills"] == 3 and result["joiner_requests"] > 100
    assert result["samples_duplicated"] == 0 and result["samples_missing"] == 0, result


def test_chaos_trainer_killed_at_its_publishing_points_trains_every_sample_once(kafka_bootstrap: str,
                                                                                tiny_model: Path) -> None:
    """The trainer SIGKILLed after a publish's write-ahead checkpoint, between register and alias, and
    between publish and checkpoint, each in a lifetime of its own, then one that finishes."""
    result = _chaos(kafka_bootstrap, tiny_model, "trainer")
    assert [k["point"] for k in result["kills"]] == ["trainer.before_publish", "registry.after_register",
                                                      "trainer.after_publish"]
    assert all(k["sigkill"] for k in result["kills"]), result["kills"]  # each lifetime died at its point
    assert result["samples_trained"] == result["samples_produced"]  # every sample once, none twice
    assert result["versions"] >= 3 and result["challenger_is_newest"], result
    assert result["versions_with_overlapping_offsets"] == 0 and result["offset_gaps"] == 0, result
    assert result["orphan_versions"] == 0, result


def test_chaos_mlflow_down_the_trainer_trains_on_and_loses_no_metric(kafka_bootstrap: str,
                                                                     tiny_model: Path) -> None:
    """A fresh trainer with the MLflow server down for 10 s after its first version."""
    result = _chaos(kafka_bootstrap, tiny_model, "outage")
    # the trainer trained on, failed its publishes without stopping, published after
    assert result["outage_trainer_exit"] == 0 and result["outage_steps"] > 0, result
    assert result["outage_publish_failures"] >= 1 and result["outage_first_publish_after_s"] is not None
    assert result["outage_metric_rows_missing"] == 0, result  # the outbox delivered what waited
    assert result["outage_samples_trained"] == result["outage_samples_produced"], result
    assert result["outage_versions_with_overlapping_offsets"] == 0 and result["outage_offset_gaps"] == 0
    assert result["outage_orphan_versions"] == 0, result


@pytest.mark.serial  # bounds on how soon a replica serves again
def test_chaos_replicas_and_the_gateway_killed_no_answer_lost_and_every_decision_once(
        kafka_bootstrap: str, tiny_model: Path) -> None:
    """While users chat through the gateway: a replica SIGKILLed mid hot swap, the gateway SIGKILLed
    after saving a promotion and again in the middle of telling MLflow, a replica SIGKILLed while
    serving, and a replica on a full adapter disk."""
    result = _chaos(kafka_bootstrap, tiny_model, "serving")
    # every answer a user received is on the interactions topic; no request failed beyond the
    # client's retry budget through two replica kills and two gateway kills
    assert result["interactions_answered"] > 50, result
    assert result["interactions_logged"] == result["interactions_answered"], result
    assert result["serving_client_errors"] == 0, result
    assert result["killed_right_after_answering_logged"], result  # the answer waited for its record
    assert result["replica_killed_mid_swap"], result  # it died with the version's files on its disk...
    assert result["replica_copies_after_restart"] == {"before": 1, "after": 1}, result  # ...swept on restart
    # a restarted replica serves what it should within two controller intervals (plus the load itself)
    assert result["replica_reload_s"] < 2 * result["interval_s"] + 5, result
    assert result["replica_restart_to_champion_s"] < 2 * result["interval_s"] + 5, result
    points = [k["point"] for k in result["gateway_kills"]]
    assert points == ["rollout.after_state_write", "rollout.mid_mlflow"], points
    assert all(k["sigkill"] for k in result["gateway_kills"]), result["gateway_kills"]
    first, second = (k["state"] for k in result["gateway_kills"])
    assert first == {"status": "promoted", "mlflow_pending": "promote", "champion_in_mlflow": "1"}, first
    assert second == {"champion_in_mlflow": "2", "challenger_in_mlflow": "2"}, second
    assert result["gateway_recovered"], result["gateway_recovery"]  # aliases, tags, each decision once
    disk = result["disk_full"]
    if "skipped" not in disk:  # needs a mount namespace for its small tmpfs
        assert not disk["loaded_while_full"] and disk["files_left_on_disk"] == [], disk
        assert disk["error_named_the_disk"] and disk["replica_logged_it"], disk
        assert disk["disk_freed_to_champion_s"] < 2 * result["interval_s"] + 5, disk


@pytest.mark.serial  # each component back within 30 s of the brokers' return
def test_chaos_every_kafka_node_down_at_once_each_component_is_back_within_30_s(kafka_bootstrap: str,
                                                                                tiny_model: Path) -> None:
    """Every Kafka node of a three-node cluster down at once for 30 s under the whole loop."""
    result = _chaos(kafka_bootstrap, tiny_model, "bus")
    # each component works again on its own within the issue's 30 s of the nodes' return (measured
    # 0.4-22.6 s, docs/reliability.md)
    ready = result["ready_after_broker_s"]
    assert set(ready) == {"feedback_api", "inference", "joiner", "trainer"}, ready
    # (over the target, the part printed the component's log and, stuck, its threads' stacks)
    said = SAID["chaos"]
    told = said[said.find("bus outage"):][-12000:]
    assert all(s is not None and s <= 30 for s in ready.values()), (ready, told)


def test_the_interaction_log_benchmark_measures_both_sides_and_loses_no_record(kafka_bootstrap: str,
                                                                              tiny_model: Path) -> None:
    result = _run("interaction_log", ["--bootstrap", kafka_bootstrap, "--model", str(tiny_model),
                                      "--model-name", TINY_NAME])
    assert result["logged_confirm"] == result["logged_at_once"] == result["requests_per_side"] == 5, result
    assert result["confirm_p50_ms"] > 0 and result["at_once_p50_ms"] > 0, result


def test_the_learning_benchmark_runs_on_a_tiny_model(kafka_bootstrap: str, tiny_model: Path,
                                                     tmp_path: Path) -> None:
    demo = yaml.safe_load((ROOT / "deploy" / "local" / "demo.yaml").read_text())
    demo["model"] = {"name": TINY_NAME, "path": str(tiny_model)}
    demo["trainer"]["cold_start_weight"] = 0.0  # no anchors to write with the embedded model
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(demo))
    result = _run("learning", ["--bootstrap", kafka_bootstrap, "--config", str(config)],
                  {"ORL_CACHE_DIR": str(tmp_path / "cache")})
    row = result["per_preference"]["numbers"]
    assert len(row["versions"]) == 1 and 0 <= row["final"] <= 1 and "gain_over_control" in row
    assert len(row["ability_missed"]) == 8 - row["ability"], row  # which prompts of the check were lost


def test_the_grpo_benchmark_runs_on_a_tiny_model(tiny_model: Path) -> None:
    result = _run("grpo", ["--preference", "enthusiastic"],
                  {"ORL_MODEL__PATH": str(tiny_model), "ORL_MODEL__NAME": TINY_NAME})
    assert result["smoke"] and result["steps"] == 2 and 0 <= result["reward_control"] <= 1
    assert result["preference"] == "enthusiastic" and result["facts_base"].endswith("/8")


def test_the_ideal_signal_benchmark_runs_on_a_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    result = _run("ideal", ["--rehearse", "1"],
                  {"ORL_MODEL__PATH": str(tiny_model), "ORL_MODEL__NAME": TINY_NAME,
                   "ORL_CACHE_DIR": str(tmp_path / "cache")})
    assert result["smoke"] and result["preference"] == "enthusiastic" and result["rehearse"] == 1
    assert [row["step"] for row in result["checkpoints"]] == [1, 2], result  # --save 1 and the last
    assert result["facts_base"].endswith("/8") and 0 <= result["final"] <= 1
