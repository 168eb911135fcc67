"""The chart's monitoring: the Grafana dashboard (a ConfigMap for Grafana's dashboard sidecar) and the
PrometheusRule alerts, rendered by the real Helm and validated by orl-monitoring-check, which decodes
them with Grafana's and the Prometheus Operator's own models and parses every query with Prometheus'
PromQL parser. That the services export every queried metric is checked on the running loop
(tests/launch/test_launch.py); here, that the code defines each one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from tests.deploy.chart import CHART, ROOT, by_kind, named, render
from tests.deploy.monitoring import (
    ENABLED,
    check,
    checker_binary,
    dashboard,
    exposed_series,
    family,
    prometheus_rule,
    queried_metrics,
)

MINIMAL = CHART / "ci" / "minimal-values.yaml"
ALERTS = {"OnlineRLTrainerLagGrowing", "OnlineRLNoVersionPublished", "OnlineRLRolloutStuck",
          "OnlineRLReplicaLackingVersion", "OnlineRLJoinLagGrowing"}
needs_checker = pytest.mark.skipif(checker_binary() is None, reason=(
    "no orl-monitoring-check (deploy/grafana-check): `make setup-test` builds it into .venv/bin; the "
    "dashboard and the alerts were not validated against Grafana's and Prometheus' models"))


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(MINIMAL, *ENABLED)


@pytest.fixture(scope="module")
def rule() -> dict[str, Any]:
    return prometheus_rule()


def _write(tmp_path: Path, name: str, content: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(content) if name.endswith(".json") else yaml.safe_dump(content))
    return path


# -- the dashboard ---------------------------------------------------------------------------------

def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_dashboard(
        objects: list[dict[str, Any]]) -> None:
    config_map = named(objects, "ConfigMap", "orl-online-rl-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    board = json.loads(config_map["data"]["online-rl.json"])
    assert board == dashboard() and board["uid"] == "online-rl"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


def test_the_sidecar_label_and_folder_are_configurable() -> None:
    objects = render(MINIMAL, *ENABLED, "monitoring.dashboard.label=grafana.example.com/dashboard",
                     "monitoring.dashboard.labelValue=online-rl",
                     "monitoring.dashboard.annotations.grafana_folder=Learning")
    config_map = named(objects, "ConfigMap", "orl-online-rl-dashboard")
    assert config_map["metadata"]["labels"]["grafana.example.com/dashboard"] == "online-rl"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Learning"}


@needs_checker
def test_grafana_accepts_the_rendered_dashboard(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    board = json.loads(named(objects, "ConfigMap", "orl-online-rl-dashboard")["data"]["online-rl.json"])
    result = check("dashboard", _write(tmp_path, "online-rl.json", board))
    assert result.returncode == 0, result.stderr


def _unknown_field(board: dict[str, Any]) -> None:
    board["refreshEvery"] = "30s"


def _grid_as_text(board: dict[str, Any]) -> None:
    board["panels"][1]["gridPos"]["h"] = "8"


def _too_wide(board: dict[str, Any]) -> None:
    board["panels"][1]["gridPos"]["w"] = 30


def _broken_query(board: dict[str, Any]) -> None:
    board["panels"][1]["targets"][0]["expr"] = "sum(rate(orl_gateway_requests_total[5m])"


def _not_prometheus(board: dict[str, Any]) -> None:
    del board["panels"][1]["targets"][0]["datasource"]


@needs_checker
@pytest.mark.parametrize(("mutate", "said"), [
    (_unknown_field, "unexpected field 'refreshEvery'"),
    (_grid_as_text, "gridPos.h: json: cannot unmarshal string"),
    (_too_wide, "gridPos.w: must be <= 24"),
    (_broken_query, "parse error: unclosed left parenthesis"),
    (_not_prometheus, "not a Prometheus query"),
], ids=["unknown-field", "grid-as-text", "too-wide", "broken-query", "not-prometheus"])
def test_grafana_refuses_a_broken_dashboard(mutate: Any, said: str, tmp_path: Path) -> None:
    board = copy.deepcopy(dashboard())
    mutate(board)
    result = check("dashboard", _write(tmp_path, "broken.json", board))
    assert result.returncode == 1 and said in result.stderr, result.stderr


# -- the alerts ------------------------------------------------------------------------------------

def test_the_alerts_are_there_with_their_thresholds(rule: dict[str, Any]) -> None:
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == ALERTS
    assert all(r["labels"]["severity"] and r["annotations"]["summary"] for r in alerts.values())
    assert 'orl_trainer_lag_records{namespace="ml"}) > 1000' in alerts["OnlineRLTrainerLagGrowing"]["expr"]
    assert "> 3600" in alerts["OnlineRLNoVersionPublished"]["expr"]  # 60 minutes
    assert alerts["OnlineRLRolloutStuck"]["expr"].endswith("> 21600")  # no max_step_s: 6 hours
    assert alerts["OnlineRLReplicaLackingVersion"]["for"] == "10m"


def test_a_stuck_rollout_is_twice_max_step_s_unless_set() -> None:
    def stuck(*sets: str) -> str:
        rules = prometheus_rule(*sets)["spec"]["groups"][0]["rules"]
        return str(next(r["expr"] for r in rules if r["alert"] == "OnlineRLRolloutStuck"))

    assert stuck("config.gateway.rollout.max_step_s=600").endswith("> 1200")
    assert stuck("config.gateway.rollout.max_step_s=600",
                 "monitoring.prometheusRule.rolloutStuckSeconds=900").endswith("> 900")


@needs_checker
def test_prometheus_accepts_the_rendered_rules(rule: dict[str, Any], tmp_path: Path) -> None:
    result = check("rules", _write(tmp_path, "rules.yaml", rule))
    assert result.returncode == 0, result.stderr


@needs_checker
@pytest.mark.parametrize(("field", "value", "said"), [
    ("expr", "max(orl_trainer_lag_records > ", "expr: 1:31: parse error: unclosed left parenthesis"),
    ("for", "10 minutes", 'for: unknown unit " minutes" in duration "10 minutes"'),
    ("labels", {}, "an alert needs a severity label"),
])
def test_prometheus_refuses_a_broken_rule(rule: dict[str, Any], field: str, value: Any, said: str,
                                         tmp_path: Path) -> None:
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0][field] = value
    result = check("rules", _write(tmp_path, "broken.yaml", broken))
    assert result.returncode == 1 and said in result.stderr, result.stderr


@needs_checker
def test_a_field_the_operator_does_not_know_is_refused(rule: dict[str, Any], tmp_path: Path) -> None:
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["severity"] = "warning"  # belongs under labels
    result = check("rules", _write(tmp_path, "broken.yaml", broken))
    assert result.returncode == 1 and 'unknown field "spec.groups[0].rules[0].severity"' in result.stderr


# -- both ------------------------------------------------------------------------------------------

def test_disabled_renders_neither() -> None:
    objects = render(MINIMAL)
    assert not by_kind(objects, "PrometheusRule")
    assert not [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]


def test_a_metric_with_no_sample_yet_still_counts_as_exposed() -> None:
    registry = CollectorRegistry()
    Counter("orl_a", "a labelled counter, never incremented", ["reason"], registry=registry)
    Counter("orl_b", "a counter", registry=registry).inc()
    Histogram("orl_c_seconds", "a labelled histogram, never observed", ["route"], registry=registry)
    Gauge("orl_d", "a gauge", registry=registry)
    exposed = exposed_series(generate_latest(registry).decode())
    assert {"orl_a_total", "orl_b_total", "orl_c_seconds_bucket", "orl_c_seconds_count", "orl_d"} <= exposed
    assert not {"orl_a", "orl_a_total_total", "orl_c_seconds", "orl_d_total"} & exposed


def test_every_queried_metric_is_defined_by_the_code(rule: dict[str, Any]) -> None:
    queried = queried_metrics(rule)
    assert {"orl_gateway_requests_total", "orl_trainer_lag_records", "orl_joiner_lag_records"} <= queried
    sources = "".join(p.read_text() for folder in ("services", "online_rl")
                      for p in sorted((ROOT / folder).rglob("*.py")))
    undefined = sorted(name for name in queried if f'"{family(name)}"' not in sources)
    assert not undefined, f"queried but defined nowhere in services/ or online_rl/: {undefined}"
