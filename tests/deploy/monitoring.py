"""The chart's monitoring objects as the tests read them: the Grafana dashboard, the PrometheusRule, the
metric names their queries use, the series a /metrics page exposes, and orl-monitoring-check (the Go
checker over Grafana's and Prometheus' own libraries, deploy/grafana-check) to run on them.

It knows no component: tests/launch compares `queried_metrics()` with the running services' pages."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.deploy.chart import CHART, ROOT, by_kind, render

DASHBOARD_FILE = CHART / "dashboards" / "online-rl.json"
ENABLED = ("monitoring.dashboard.enabled=true", "monitoring.prometheusRule.enabled=true")

# Quoted strings (label values, Grafana's variables inside them) hold no metric names.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_METRIC = re.compile(r"(?<![A-Za-z0-9_:])orl_[A-Za-z0-9_:]*")
# The series a metric family of each type gives Prometheus (prometheus_client's text format).
_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
             "summary": ("", "_sum", "_count", "_created")}  # gauge, untyped, unknown: the name itself


def checker_binary() -> str | None:
    """`$ORL_MONITORING_CHECK`, the one `make setup-test` builds into .venv/bin, or one on PATH."""
    name = "orl-monitoring-check"
    built = str(ROOT / ".venv" / "bin" / name)
    for candidate in (os.environ.get("ORL_MONITORING_CHECK"), built, shutil.which(name)):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def check(kind: str, path: Path) -> subprocess.CompletedProcess[str]:
    """`orl-monitoring-check dashboard|rules PATH` (exit 0: valid; 1: the problems on stderr)."""
    binary = checker_binary()
    assert binary is not None, "no orl-monitoring-check: `make setup-test` builds it"
    return subprocess.run([binary, kind, str(path)], capture_output=True, text=True, timeout=60)


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD_FILE.read_text()))


def prometheus_rule(*sets: str) -> dict[str, Any]:
    """The PrometheusRule the chart renders (the minimal values with monitoring on, plus `sets`)."""
    objects = render(CHART / "ci" / "minimal-values.yaml", *ENABLED, *sets)
    rules = by_kind(objects, "PrometheusRule")
    assert len(rules) == 1, "the chart rendered no PrometheusRule with monitoring.prometheusRule.enabled"
    return rules[0]


def dashboard_exprs(board: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: its panels' targets (in rows too) and its query variables."""
    panels = [p for item in board["panels"] for p in (item, *item.get("panels", []))]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    variables = board["templating"]["list"]
    return exprs + [v["query"] for v in variables if v["type"] == "query" and isinstance(v["query"], str)]


def rule_exprs(rule: dict[str, Any]) -> list[str]:
    return [str(r["expr"]) for group in rule["spec"]["groups"] for r in group["rules"]]


def metric_names(expr: str) -> set[str]:
    """The online-rl series an expression selects (`orl_*` identifiers outside quoted strings)."""
    return set(_METRIC.findall(_STRING.sub('""', expr)))


def queried_metrics(rule: dict[str, Any] | None = None) -> set[str]:
    """Every series name the dashboard and the alerts query, as written (`orl_x_total`, `orl_y_bucket`)."""
    exprs = dashboard_exprs(dashboard()) + rule_exprs(rule if rule is not None else prometheus_rule())
    return {name for expr in exprs for name in metric_names(expr)}


def exposed_series(text: str) -> set[str]:
    """The series names a /metrics page gives Prometheus: its samples' names, and those its `# TYPE`
    lines imply (a counter `x` is stored as `x_total`; a histogram as `x_bucket`, `x_sum`, `x_count`), so
    a labelled metric with no sample yet still counts."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            if kind.strip() == "counter":  # prometheus_client names a counter's family with `_total` or not
                name = name.removesuffix("_total")
            names |= {name + suffix for suffix in _SUFFIXES.get(kind.strip(), ("",))}
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def family(series: str) -> str:
    """The metric's name in the code (prometheus_client adds `_total` to counters, and histograms'
    `_bucket`, `_sum`, `_count`)."""
    for suffix in ("_total", "_bucket", "_sum", "_count"):
        if series.endswith(suffix):
            return series.removesuffix(suffix)
    return series
