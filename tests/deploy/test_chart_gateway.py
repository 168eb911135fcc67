"""The gateway in the chart: by default one pod that routes and runs the rollout with its state on a volume;
with gateway.split.enabled, stateless proxies and leader-elected controllers (a Kubernetes Lease, the RBAC
that allows exactly it, a Service whose only ready pod is the leader), and the rollout and gateway-health
topics in both modes. The gateway's Kafka ACLs and MLflow user are checked with the others' in
test_chart_security.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest

from online_rl.bus import Bus, Topics, ensure_topics
from tests.deploy.chart import (
    CHART,
    ROOT,
    Pod,
    RenderError,
    by_kind,
    helm,
    named,
    pods,
    render,
    selects,
    settings_of,
)

MINIMAL = CHART / "ci" / "minimal-values.yaml"
DATABASE = CHART / "ci" / "database-values.yaml"  # gateway.split.enabled
EXTERNAL = CHART / "ci" / "external-values.yaml"  # a NetworkPolicy per Prometheus, a ServiceMonitor
SPLIT = "gateway.split.enabled=true"
GATEWAY = "orl-online-rl-gateway"
CONTROLLER = "orl-online-rl-gateway-controller"
LEASE = "orl-online-rl-rollout-controller"

# What KubernetesLease's HTTP calls need from RBAC (online_rl/rollout/lease.py), by method.
VERBS = {"get": "get", "post": "create", "put": "update", "patch": "patch", "delete": "delete"}


def _pod(objects: list[dict[str, Any]], component: str) -> Pod:
    (pod,) = [p for p in pods(objects) if p.component == component]
    return pod


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _budgets(objects: list[dict[str, Any]], pod: Pod) -> list[dict[str, Any]]:
    return [b for b in by_kind(objects, "PodDisruptionBudget") if selects(b["spec"]["selector"], pod.labels)]


def _behind(objects: list[dict[str, Any]], service: dict[str, Any]) -> set[str]:
    """The components whose pods `service` selects."""
    return {p.component for p in pods(objects) if selects(service["spec"]["selector"], p.labels)}


def _mounted_at(pod: Pod, container: dict[str, Any], folder: Path) -> dict[str, Any] | None:
    """The volume that holds `folder` in `container`, if any."""
    volumes = {v["name"]: v for v in pod.spec["volumes"]}
    for mount in container["volumeMounts"]:
        if folder.is_relative_to(mount["mountPath"]):
            return dict(volumes[mount["name"]])
    return None


def _admits(rule: dict[str, Any], pod: Pod) -> bool:
    """Whether a NetworkPolicy ingress rule lets `pod` (of the release's namespace) in."""
    return any("podSelector" in peer and "namespaceSelector" not in peer
               and selects(peer["podSelector"], pod.labels) for peer in rule["from"])


def _lease_rules() -> set[tuple[str, bool]]:
    """(verb, on the named Lease?) for each API call of KubernetesLease: `{path}/{name}` or the collection."""
    source = (ROOT / "online_rl" / "rollout" / "lease.py").read_text()
    calls = re.findall(r"self\._client\.(\w+)\(([^,)]*)", source)
    assert calls, "no API calls found in online_rl/rollout/lease.py: update this test"
    return {(VERBS[method], "self.name" in target) for method, target in calls}


# -- one gateway (the default) ----------------------------------------------------------------------

def test_without_split_the_gateway_is_one_pod_with_its_state_on_a_volume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(MINIMAL)
    deployment = named(objects, "Deployment", GATEWAY)
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = _pod(objects, "gateway")
    (container,) = pod.containers
    settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
    assert settings.gateway.role == "all"
    volume = _mounted_at(pod, container, settings.rollout_dir)
    assert volume is not None
    claim = named(objects, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "MLFLOW_TRACKING_USERNAME" in _env(container)  # it runs the rollout
    assert not [o for o in objects if "controller" in o["metadata"]["name"]
                and o["kind"] in ("Deployment", "Service", "ServiceAccount", "Role", "RoleBinding")]
    assert not pod.spec.get("automountServiceAccountToken")
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"
                and o["spec"]["scaleTargetRef"]["name"] == GATEWAY]


# -- split: proxies ---------------------------------------------------------------------------------

def test_split_proxies_route_by_the_bus_without_state_or_mlflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(DATABASE)
    deployment = named(objects, "Deployment", GATEWAY)  # the same name, Service and Ingress as before
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert not [c for c in by_kind(objects, "PersistentVolumeClaim") if GATEWAY in c["metadata"]["name"]]
    pod = _pod(objects, "gateway")
    (container,) = pod.containers
    settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
    assert settings.gateway.role == "proxy"
    # the relay target is pinned to the controller Service, not taken from the bus
    port = named(objects, "Service", CONTROLLER)["spec"]["ports"][0]["port"]
    assert settings.gateway.controller_url == f"http://{CONTROLLER}.ml.svc:{port}"
    env = _env(container)
    assert not [n for n in env if n.startswith("MLFLOW_")]
    assert not [e for e in env.values() if "mlflow" in e.get("valueFrom", {}).get("secretKeyRef", {})
                .get("name", "")]
    assert "checksum/mlflow-auth" not in named(objects, "Deployment", GATEWAY)["spec"]["template"][
        "metadata"]["annotations"]  # an MLflow password change does not restart them
    assert not [v for v in pod.spec["volumes"] if "persistentVolumeClaim" in v or v["name"] in ("state",
                                                                                                 "model")]
    assert not pod.spec.get("automountServiceAccountToken")  # the chart's account, without a token
    (account,) = [a for a in by_kind(objects, "ServiceAccount")
                  if a["metadata"]["name"] == pod.spec["serviceAccountName"]]
    assert account["automountServiceAccountToken"] is False
    (budget,) = _budgets(objects, pod)
    assert budget["spec"]["maxUnavailable"] == 1


def test_split_proxies_autoscale_on_cpu() -> None:
    objects = render(MINIMAL, SPLIT, "gateway.split.autoscaling.enabled=true",
                     "gateway.split.autoscaling.minReplicas=3", "gateway.split.autoscaling.maxReplicas=9",
                     "gateway.split.autoscaling.targetCPUUtilizationPercentage=60")
    hpa = named(objects, "HorizontalPodAutoscaler", GATEWAY)["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": GATEWAY}
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (3, 9)
    assert hpa["metrics"] == [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization", "averageUtilization": 60}}}]
    assert "replicas" not in named(objects, "Deployment", GATEWAY)["spec"]
    assert named(objects, "Deployment", CONTROLLER)["spec"]["replicas"] == 2  # never autoscaled


# -- split: controllers -----------------------------------------------------------------------------

def test_split_controllers_contend_for_the_lease_and_advertise_their_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(DATABASE)
    deployment = named(objects, "Deployment", CONTROLLER)
    assert deployment["spec"]["replicas"] == 2  # one leads, one stands by
    pod = _pod(objects, "gateway-controller")
    (container,) = pod.containers
    settings = settings_of(pod, container, objects, tmp_path, monkeypatch)  # a valid lease name, URL...
    api = settings.gateway
    assert (api.role, api.election, api.lease_name) == ("controller", "kubernetes", LEASE)
    # the proxies relay /rollout to the controller Service, in the release's namespace, on its port
    service = named(objects, "Service", CONTROLLER)
    (port,) = service["spec"]["ports"]
    assert api.advertise_url == f"http://{CONTROLLER}.ml.svc:{port['port']}"
    assert port["targetPort"] == "http" and pod.ports()["http"] == api.port
    # only the leader is Ready (a standby's /readyz is 503), and a standby is alive all the same
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    # a new pod is never Ready beside the old leader: all are replaced at once, and no budget holds them
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 0, "maxUnavailable": "100%"}}
    assert not _budgets(objects, pod)
    # it runs the rollout: MLflow's gateway user, and the state's local copy on a scratch volume
    user = _env(container)["MLFLOW_TRACKING_USERNAME"]["valueFrom"]["secretKeyRef"]
    assert user["key"] == "gateway-username"
    volume = _mounted_at(pod, container, settings.rollout_dir)
    assert volume is not None and volume.get("emptyDir") == {}


def test_the_controller_service_reaches_only_controller_pods() -> None:
    objects = render(DATABASE)
    service = named(objects, "Service", CONTROLLER)
    assert service["spec"]["publishNotReadyAddresses"] is False and service["spec"]["type"] == "ClusterIP"
    assert _behind(objects, service) == {"gateway-controller"}
    assert _behind(objects, named(objects, "Service", GATEWAY)) == {"gateway"}  # users reach the proxies


def test_the_controller_loads_the_model_as_the_single_gateway_does() -> None:
    sets = ("config.gateway.rollout.offpolicy_gate=true",
            "modelVolume.persistentVolumeClaim.claimName=models")
    single = _pod(render(MINIMAL, *sets), "gateway")
    objects = render(MINIMAL, *sets, SPLIT)
    controller, proxy = _pod(objects, "gateway-controller"), _pod(objects, "gateway")

    def model(pod: Pod) -> tuple[Any, ...]:
        volumes = [v for v in pod.spec["volumes"] if v["name"] == "model"]
        return (volumes, [m for m in pod.containers[0]["volumeMounts"] if m["name"] == "model"])

    assert model(controller) == model(single) and model(single)[0]
    assert model(proxy) == ([], [])  # the gate runs on the controller only


def test_the_controllers_role_allows_exactly_the_lease_and_binds_their_account_only() -> None:
    objects = render(DATABASE)
    (role,) = by_kind(objects, "Role")
    rules = role["rules"]
    assert all(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"] for r in rules)
    granted = {(verb, "resourceNames" in r) for r in rules for verb in r["verbs"]}
    assert granted == _lease_rules()  # get and update on the Lease, create (no name: Kubernetes' rule)
    assert all(r["resourceNames"] == [LEASE] for r in rules if "resourceNames" in r)
    (binding,) = by_kind(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": CONTROLLER, "namespace": "ml"}]
    # that account is the controllers' alone, and of the gateway's pods only they mount its token
    for pod in pods(objects):
        controller = pod.component == "gateway-controller"
        assert (pod.spec["serviceAccountName"] == CONTROLLER) == controller, pod.owner
        if pod.component.startswith("gateway"):
            assert (pod.spec.get("automountServiceAccountToken") is True) == controller, pod.owner
    assert named(objects, "ServiceAccount", CONTROLLER)["automountServiceAccountToken"] is False
    assert not by_kind(objects, "ClusterRole") and not by_kind(objects, "ClusterRoleBinding")


def test_an_existing_service_account_replaces_the_charts_rbac() -> None:
    objects = render(MINIMAL, SPLIT, "gateway.split.rbac.create=false",
                     "gateway.split.serviceAccountName=leases")
    assert not by_kind(objects, "Role") and not by_kind(objects, "RoleBinding")
    assert CONTROLLER not in {a["metadata"]["name"] for a in by_kind(objects, "ServiceAccount")}
    assert _pod(objects, "gateway-controller").spec["serviceAccountName"] == "leases"
    with pytest.raises(RenderError, match=r"gateway\.split\.serviceAccountName is required"):
        render(MINIMAL, SPLIT, "gateway.split.rbac.create=false")


def test_long_release_names_give_a_valid_lease_and_service(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    long = "a-very-long-release-name-for-a-team-staging"
    objects = render(MINIMAL, SPLIT, release=long)
    assert all(len(o["metadata"]["name"]) <= 63 for o in objects)
    pod = _pod(objects, "gateway-controller")
    settings = settings_of(pod, pod.containers[0], objects, tmp_path, monkeypatch)  # the name's pattern
    (role,) = by_kind(objects, "Role")
    named_rules = [r["resourceNames"] for r in role["rules"] if "resourceNames" in r]
    assert named_rules == [[settings.gateway.lease_name]]
    assert len(settings.gateway.lease_name) <= 63


# -- split: the network ----------------------------------------------------------------------------

def test_proxies_reach_the_controller_and_nothing_outside_does() -> None:
    objects = render(EXTERNAL, SPLIT)
    proxy, controller = _pod(objects, "gateway"), _pod(objects, "gateway-controller")
    governing = [p for p in by_kind(objects, "NetworkPolicy")
                 if selects(p["spec"]["podSelector"], controller.labels)]
    rules = [rule for p in governing for rule in p["spec"]["ingress"]]
    assert governing and all("from" in rule for rule in rules)  # not open to everyone
    assert any(_admits(rule, proxy) and all(p["port"] in ("http", controller.ports()["http"])
                                            for p in rule.get("ports", [])) for rule in rules)
    open_to_all = [p for p in by_kind(objects, "NetworkPolicy")
                   if any("from" not in rule for rule in p["spec"]["ingress"])]
    assert not [p for p in open_to_all if selects(p["spec"]["podSelector"], controller.labels)]
    # the leader's /metrics: scraped through its Service (the standbys are not Ready)
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert selects(monitor["spec"]["selector"], named(objects, "Service", CONTROLLER)["metadata"]["labels"])


def test_the_controllers_reach_kafka() -> None:
    objects = render(MINIMAL, SPLIT)
    (kafka,) = by_kind(objects, "Kafka")
    (peer,) = kafka["spec"]["kafka"]["listeners"][0]["networkPolicyPeers"]
    assert selects(peer["podSelector"], _pod(objects, "gateway-controller").labels)


# -- the gateway's topics --------------------------------------------------------------------------

class _Created:
    """A bus that records what `ensure_topics` asks for: name -> (partitions, compacted)."""

    def __init__(self) -> None:
        self.topics: dict[str, tuple[int, bool]] = {}

    def create_topic(self, name: str, partitions: int = 1, compact: bool = False) -> None:
        self.topics.setdefault(name, (partitions, compact))

    def partitions(self, topic: str) -> int:
        return self.topics[topic][0]


@pytest.mark.parametrize("sets", [(), (SPLIT,)], ids=["one-gateway", "split"])
def test_the_rollout_and_gateway_health_topics_are_what_ensure_topics_makes(sets: tuple[str, ...]) -> None:
    topics = Topics("orl")
    created = _Created()
    ensure_topics(cast(Bus, created), topics, 4)
    specs = {t["spec"]["topicName"]: t["spec"] for t in by_kind(render(MINIMAL, *sets), "KafkaTopic")}
    for name in (topics.rollout, topics.gateway_health):
        partitions, compact = created.topics[name]
        assert specs[name]["partitions"] == partitions == 1
        assert (specs[name]["config"].get("cleanup.policy") == "compact") == compact
    assert "retention.ms" not in specs[topics.rollout]["config"]  # the state is kept while it is current
    retention = specs[topics.gateway_health]["config"]["retention.ms"]
    assert isinstance(retention, int) and retention == 3600000  # read live: an hour is plenty
    assert specs[topics.rollout]["replicas"] == specs[topics.interactions]["replicas"]


def test_notes_say_who_leads_in_split_mode() -> None:
    result = helm("install", "orl", str(CHART), "-f", str(DATABASE), "--namespace", "ml", "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert f"kubectl -n ml get lease {LEASE}" in notes
