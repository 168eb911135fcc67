"""The joiner's scale-out in the chart: up to config.bus.partitions replicas in one consumer group, each
named by its pod (its transactional id follows), an optional HPA on the group's lag, the join-pairs topic
it reads and writes, and its metrics scraped like the other components'. Its Kafka ACLs are checked with
the other users' in test_chart_security.py."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from online_rl.bus import Topics
from online_rl.config import Settings
from online_rl.stream import Joiner
from tests.deploy.chart import (
    CHART,
    Pod,
    RenderError,
    by_kind,
    named,
    pod_name,
    pods,
    render,
    selects,
    settings_of,
)

MINIMAL = CHART / "ci" / "minimal-values.yaml"
DATABASE = CHART / "ci" / "database-values.yaml"  # joiner.replicas: 3
EXTERNAL = CHART / "ci" / "external-values.yaml"  # joiner.autoscaling on, 12 partitions, a ServiceMonitor
DEPLOYMENT = "orl-online-rl-joiner"


def _joiner_pod(objects: list[dict[str, Any]]) -> Pod:
    (pod,) = [p for p in pods(objects) if p.component == "joiner"]
    return pod


def test_each_replica_is_named_by_its_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(DATABASE)
    deployment = named(objects, "Deployment", DEPLOYMENT)
    assert deployment["spec"]["replicas"] == 3
    # a rollout replaces one pod at a time and never runs more pods than replicas (nor partitions)
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}
    pod = _joiner_pod(objects)
    (container,) = pod.containers
    env = {e["name"]: e for e in container["env"]}
    assert env["ORL_JOIN__INSTANCE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
    assert settings.join.instance == pod_name(pod)  # a pod's name is a valid instance name


def test_more_replicas_than_partitions_are_refused_until_the_partitions_grow() -> None:
    with pytest.raises(RenderError) as refused:
        render(MINIMAL, "joiner.replicas=5")
    message = str(refused.value)
    assert "joiner.replicas=5 is more than config.bus.partitions=4" in message
    assert "Lower joiner.replicas to 4, or raise config.bus.partitions" in message
    objects = render(MINIMAL, "joiner.replicas=5", "config.bus.partitions=5")
    assert named(objects, "Deployment", DEPLOYMENT)["spec"]["replicas"] == 5


def test_the_autoscaler_scales_on_the_groups_lag_and_owns_the_replicas() -> None:
    assert Settings().join.group_id == inspect.signature(Joiner.__init__).parameters["group_id"].default
    prefix = yaml.safe_load(EXTERNAL.read_text())["config"]["bus"]["topic_prefix"]  # prod
    group = Settings(bus={"topic_prefix": prefix}).join.group_id  # type: ignore[arg-type]
    assert group == f"{prefix}-joiner"  # the group the code joins: named after its topics
    objects = render(EXTERNAL)
    hpa = named(objects, "HorizontalPodAutoscaler", DEPLOYMENT)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": DEPLOYMENT}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (1, 12)
    assert hpa["metrics"] == [{"type": "External", "external": {
        "metric": {"name": "kafka_consumergroup_lag", "selector": {"matchLabels": {"consumergroup": group}}},
        "target": {"type": "AverageValue", "averageValue": "10000"}}}]
    assert "replicas" not in named(objects, "Deployment", DEPLOYMENT)["spec"]
    # a group set in the configuration is the one scaled on
    chosen = named(render(EXTERNAL, "config.join.group_id=joiners"), "HorizontalPodAutoscaler", DEPLOYMENT)
    selector = chosen["spec"]["metrics"][0]["external"]["metric"]["selector"]["matchLabels"]
    assert selector == {"consumergroup": "joiners"}
    tuned = render(MINIMAL, "joiner.autoscaling.enabled=true", "joiner.autoscaling.minReplicas=2",
                   "joiner.autoscaling.maxReplicas=3", "joiner.autoscaling.lagMetric=kafka_lag",
                   "joiner.autoscaling.targetLagPerReplica=500")
    hpa = named(tuned, "HorizontalPodAutoscaler", DEPLOYMENT)["spec"]
    (metric,) = hpa["metrics"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 3)
    assert metric["external"]["metric"]["name"] == "kafka_lag"
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "500"}
    assert not by_kind(render(MINIMAL), "HorizontalPodAutoscaler")  # off by default


def test_an_autoscaler_beyond_the_partitions_is_refused() -> None:
    with pytest.raises(RenderError) as refused:
        render(MINIMAL, "joiner.autoscaling.enabled=true", "joiner.autoscaling.maxReplicas=6")
    message = str(refused.value)
    assert "joiner.autoscaling.maxReplicas=6 is more than config.bus.partitions=4" in message
    assert "Lower joiner.autoscaling.maxReplicas to 4, or raise config.bus.partitions" in message
    with pytest.raises(RenderError, match=r"joiner\.autoscaling\.minReplicas must not exceed"):
        render(MINIMAL, "joiner.autoscaling.enabled=true", "joiner.autoscaling.minReplicas=3",
               "joiner.autoscaling.maxReplicas=2")
    render(MINIMAL, "joiner.autoscaling.maxReplicas=6")  # not in force while autoscaling is off


def test_join_pairs_has_the_partitions_of_the_topics_it_joins() -> None:
    topics = Topics("orl")
    objects = render(MINIMAL, "config.bus.partitions=6")
    specs = {t["spec"]["topicName"]: t["spec"] for t in by_kind(objects, "KafkaTopic")}
    pairs = specs[topics.join_pairs]
    assert pairs["partitions"] == specs[topics.interactions]["partitions"] == \
        specs[topics.feedback]["partitions"] == 6
    assert pairs["replicas"] == specs[topics.interactions]["replicas"]
    assert pairs["config"] == specs[topics.interactions]["config"]  # deleted by retention, not compacted
    retention = pairs["config"]["retention.ms"]
    assert isinstance(retention, int) and retention == 604800000  # a long, as Kafka reads it (not 6.048e+08)


def test_each_joiner_is_scraped_where_it_serves_its_metrics() -> None:
    from typer.testing import CliRunner

    from online_rl.cli.app import app

    objects = render(EXTERNAL)
    pod = _joiner_pod(objects)
    (container,) = pod.containers
    args = container["args"]
    port = int(args[args.index("--metrics-port") + 1])
    assert pod.ports()["metrics"] == port
    parsed = CliRunner().invoke(app, [*args, "--help"])  # the command takes the option
    assert parsed.exit_code == 0, parsed.output
    (monitor,) = by_kind(objects, "ServiceMonitor")
    (service,) = [s for s in by_kind(objects, "Service") if selects(monitor["spec"]["selector"],
                                                                    s["metadata"]["labels"])
                  and selects(s["spec"]["selector"], pod.labels)]
    (served,) = service["spec"]["ports"]
    assert served["targetPort"] == "metrics"
    assert {"port": served["name"], "path": "/metrics"}.items() <= next(
        e for e in monitor["spec"]["endpoints"] if e["port"] == served["name"]).items()
    # the NetworkPolicy that governs the joiner admits the scrapers the values name
    scrapers = yaml.safe_load(EXTERNAL.read_text())["networkPolicy"]["metricsFrom"]
    rules = [rule for p in by_kind(objects, "NetworkPolicy") if selects(p["spec"]["podSelector"], pod.labels)
             for rule in p["spec"].get("ingress", [])]
    assert any(rule["from"] == scrapers and "ports" not in rule for rule in rules)
