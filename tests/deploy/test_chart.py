"""The Helm chart: linted and rendered by the real Helm for every values file under helm/online-rl/ci/,
each object validated against the Kubernetes schemas, and the rendered objects checked to wire
together the way the code reads them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from online_rl.ingest import ApiKeyStore
from tests.deploy.chart import (
    CHART,
    ROOT,
    VALUES_FILES,
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

# The oldest cluster the chart supports (Chart.yaml's kubeVersion) and the newest kubernetes-validate knows.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
CUSTOM_GROUPS = ("ray.io/", "kafka.strimzi.io/", "monitoring.coreos.com/")
IDS = [f.stem for f in VALUES_FILES]
# The gateway's pods, and the gateway.role of each in split mode (without it there is one pod, role all).
GATEWAYS = {"gateway": "proxy", "gateway-controller": "controller"}


@pytest.fixture(scope="module", params=VALUES_FILES, ids=IDS)
def rendered(request: pytest.FixtureRequest) -> tuple[Path, list[dict[str, Any]]]:
    return request.param, render(request.param)


def test_there_is_a_values_file_for_each_way_to_install() -> None:
    assert {"minimal-values", "gpu-values", "external-values", "database-values"} <= set(IDS)


@pytest.mark.parametrize("values", VALUES_FILES, ids=IDS)
def test_helm_lint_passes_strictly(values: Path) -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(values))
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_object_is_valid_kubernetes(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    builtin = [o for o in objects if not o["apiVersion"].startswith(CUSTOM_GROUPS)]
    assert builtin
    for version in K8S_VERSIONS:
        for obj in builtin:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"Kubernetes {version}: {obj['kind']}/{obj['metadata']['name']}: "
                                     f"{exc.message} at {'.'.join(map(str, exc.path))}") from exc


def test_the_expected_objects_are_there(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    values, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds
    components = {p.component for p in pods(objects)}
    assert {"inference", "gateway", "feedback", "joiner"} <= components
    spec = yaml.safe_load(values.read_text())
    if spec.get("trainer", {}).get("enabled", True):
        assert {"trainer-head", "trainer-worker"} <= components and "RayJob" in kinds
    assert ("Kafka" in kinds) == (spec.get("kafka", {}).get("mode", "strimzi") == "strimzi")
    assert ("mlflow" in components) == (spec.get("mlflow", {}).get("mode", "internal") == "internal")


# -- wiring -----------------------------------------------------------------------------------------

def test_every_service_selects_pods_on_ports_they_have(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    templates = pods(objects)
    for service in by_kind(objects, "Service"):
        chosen = [p for p in templates if selects(service["spec"]["selector"], p.labels)]
        assert chosen, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in chosen:
                have = pod.ports()
                assert target in have or target in have.values(), (
                    f"Service {service['metadata']['name']} sends to {target}, which {pod.owner} lacks")


def test_budgets_autoscalers_monitors_and_ingress_point_at_real_things(
        rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    templates = pods(objects)
    for pdb in by_kind(objects, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"], p.labels) for p in templates), pdb["metadata"]["name"]
    for hpa in by_kind(objects, "HorizontalPodAutoscaler"):
        target = named(objects, hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
        assert "replicas" not in target["spec"], "an autoscaled Deployment must leave replicas to the HPA"
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    for ingress in by_kind(objects, "Ingress"):
        backends = {p["backend"]["service"]["name"]: p["backend"]["service"]["port"]["name"]
                    for rule in ingress["spec"]["rules"] for p in rule["http"]["paths"]}
        assert {n.rsplit("-", 1)[1] for n in backends} == {"gateway", "feedback"}  # nothing else is public
        for name, port in backends.items():
            assert port in [p["name"] for p in services[name]["spec"]["ports"]]
    for monitor in by_kind(objects, "ServiceMonitor"):
        selector = monitor["spec"]["selector"]
        watched = [s for s in services.values() if selects(selector, s["metadata"]["labels"])]
        ports = {p["name"] for s in watched for p in s["spec"]["ports"]}
        components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in watched}
        assert {"gateway", "feedback", "inference", "joiner"} <= components
        assert all(e["port"] in ports for e in monitor["spec"]["endpoints"])


def test_referenced_secrets_configmaps_and_claims_exist(rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    values, objects = rendered
    spec = yaml.safe_load(values.read_text())
    external = {spec.get("auth", {}).get("existingSecret"), spec.get("mlflow", {}).get("database", {}).get(
        "existingSecret"), spec.get("mlflow", {}).get("artifacts", {}).get("envFromSecret"),
        spec.get("ingress", {}).get("tls", {}).get("secretName"),
        spec.get("signing", {}).get("existingSecret"),
        spec.get("mlflow", {}).get("auth", {}).get("existingSecret"),
        spec.get("kafka", {}).get("external", {}).get("credentialsSecret")} - {None, ""}
    # Strimzi's operators make a Secret per KafkaUser (its password) and the cluster CA's certificate
    external |= {u["metadata"]["name"] for u in by_kind(objects, "KafkaUser")}
    external |= {f"{k['metadata']['name']}-cluster-ca-cert" for k in by_kind(objects, "Kafka")}
    have = {(o["kind"], o["metadata"]["name"]) for o in objects}
    claims = {spec.get("modelVolume", {}).get("persistentVolumeClaim", {}).get("claimName")} - {None}
    for pod in pods(objects):
        for volume in pod.spec.get("volumes", []):
            if "secret" in volume:
                secret = volume["secret"]["secretName"]
                assert ("Secret", secret) in have or secret in external, secret
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in have
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in have or claim in claims, claim
        for container in pod.containers:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ("Secret", ref["name"]) in have or ref["name"] in external, ref
                    if ("Secret", ref["name"]) in have:
                        assert ref["key"] in named(objects, "Secret", ref["name"])["stringData"]
            for source in container.get("envFrom", []):
                assert source["secretRef"]["name"] in external
            mounts = {m["name"] for m in container.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod.spec.get("volumes", [])}, pod.owner


def test_each_component_loads_its_settings_and_finds_the_others(
        rendered: tuple[Path, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values, objects = rendered
    spec = yaml.safe_load(values.read_text())
    split = spec.get("gateway", {}).get("split", {}).get("enabled", False)
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    checked = set()
    for pod in pods(objects):
        for container in pod.containers:
            if not any(e["name"] == "ORL_CONFIG" for e in container.get("env", [])):
                continue
            settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
            checked.add(pod.component)
            ports = pod.ports()
            gateway = pod.component in GATEWAYS
            section = {"inference": settings.inference, "feedback": settings.feedback_api,
                       "gateway": settings.gateway, "gateway-controller": settings.gateway}.get(pod.component)
            if section is not None:  # the service listens where its probes and Service look
                assert ports["http"] == section.port and section.host == "0.0.0.0"
                for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                    if probe in container:
                        assert container[probe]["httpGet"]["port"] in ("http", section.port)
                keys_file = settings.gateway.api_keys_file if gateway else (
                    settings.inference.api_keys_file if pod.component == "inference" else
                    settings.feedback_api.api_keys_file)
                mount = next(m for m in container["volumeMounts"] if m["name"] == "api-keys")
                assert keys_file is not None and keys_file.parent == Path(mount["mountPath"])
                secret = next(v for v in pod.spec["volumes"] if v["name"] == "api-keys")["secret"]
                assert [i["path"] for i in secret["items"]] == [keys_file.name]
                if ("Secret", secret["secretName"]) in {(o["kind"], o["metadata"]["name"]) for o in objects}:
                    stored = named(objects, "Secret", secret["secretName"])["stringData"]["api-keys"]
                    assert len(ApiKeyStore(stored.splitlines())) == len(spec["auth"]["apiKeys"])
            # Kafka: the Strimzi cluster's bootstrap Service on its plain listener, or the given one
            kafka = by_kind(objects, "Kafka")
            if kafka:
                listener = kafka[0]["spec"]["kafka"]["listeners"][0]
                assert settings.kafka.bootstrap_servers == (
                    f"{kafka[0]['metadata']['name']}-kafka-bootstrap:{listener['port']}")
                topics = {t["spec"]["topicName"] for t in by_kind(objects, "KafkaTopic")}
                prefix = settings.bus.topic_prefix
                assert topics == {f"{prefix}.{n}" for n in ("interactions", "feedback", "samples", "dlq",
                                                            "join-state", "join-pairs", "rollout",
                                                            "gateway-health")}
            else:
                assert settings.kafka.bootstrap_servers == spec["kafka"]["external"]["bootstrapServers"]
            # MLflow: the release's Service, or the given server
            uri = settings.mlflow_tracking_uri
            if spec.get("mlflow", {}).get("mode", "internal") == "internal":
                host, port = uri.removeprefix("http://").split(":")
                assert int(port) in [p["port"] for p in services[host]["spec"]["ports"]]
            else:
                assert uri == spec["mlflow"]["external"]["trackingUri"]
            if gateway:  # the replicas: every address of the inference pods' Service
                (source,) = settings.gateway.replicas
                host, port = source.removeprefix("dns+http://").split(":")
                assert services[host]["spec"]["clusterIP"] == "None"
                assert services[host]["spec"]["selector"]["app.kubernetes.io/component"] == "inference"
                inference = [p for p in pods(objects) if p.component == "inference"]
                # the name resolves to pod IPs: the port is the pods' own, not the Service's
                assert all(p.ports()["http"] == int(port) for p in inference)
                # the single gateway keeps the rollout's state on its volume; in split mode it is on the
                # bus (test_chart_gateway.py), and the proxies keep none
                assert settings.gateway.role == (GATEWAYS[pod.component] if split else "all")
                if settings.gateway.role == "all":
                    _assert_on_volume(pod, container, settings.rollout_dir)
            if pod.component == "trainer-head":
                _assert_on_volume(pod, container, settings.checkpoint_dir)
                assert settings.ray.address == "auto"  # the RayJob's driver joins its own cluster
                workers = [p for p in pods(objects) if p.component == "trainer-worker"]
                cpu = str(workers[0].containers[0]["resources"]["requests"]["cpu"])
                cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
                assert settings.trainer.cpus_per_worker == max(1.0, cores)  # each rank fits a worker pod
            if pod.component == "inference" and spec.get("inference", {}).get("gpu", {}).get("enabled"):
                assert settings.inference.engine == "vllm"
                assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
            mounted = [m for m in container["volumeMounts"] if m["name"] == "model"]
            if pod.component in ("inference", "trainer-head", "trainer-worker") and spec.get("modelVolume"):
                assert settings.model.path is not None and settings.model.path.is_relative_to(
                    mounted[0]["mountPath"])  # the model is read where the volume is
            elif pod.component in ("feedback", "joiner"):
                assert not mounted  # a read-once claim is not needed (nor attachable) everywhere
    assert {"inference", "gateway", "feedback", "joiner"} <= checked


def _assert_on_volume(pod: Pod, container: dict[str, Any], folder: Path) -> None:
    """`folder` lies on a persistent volume claim mounted in `container` (it survives a restart)."""
    claims = {v["name"] for v in pod.spec["volumes"] if "persistentVolumeClaim" in v}
    mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] in claims]
    assert any(folder.is_relative_to(m) for m in mounts), f"{pod.owner}: {folder} is on no persistent volume"


def test_only_the_gateway_and_feedback_api_are_reachable_from_outside(
        rendered: tuple[Path, list[dict[str, Any]]]) -> None:
    values, objects = rendered
    policies = by_kind(objects, "NetworkPolicy")
    settings = yaml.safe_load(values.read_text()).get("networkPolicy", {})
    scrapers = settings.get("metricsFrom", [])
    if settings.get("enabled", True) is False:
        assert not policies
        return
    release = {"app.kubernetes.io/instance": "orl"}
    for kafka in by_kind(objects, "Kafka"):  # Strimzi's listener policy: the release's pods only
        (peer,) = kafka["spec"]["kafka"]["listeners"][0]["networkPolicyPeers"]
        assert all(selects(peer["podSelector"], p.labels) for p in pods(objects))
        assert not selects(peer["podSelector"], {"app.kubernetes.io/instance": "another-release"})
    for pod in pods(objects):
        governing = [p for p in policies if selects(p["spec"]["podSelector"], pod.labels)]
        assert governing, f"{pod.owner} is open to everyone: no NetworkPolicy selects it"
        rules = [rule for p in governing for rule in p["spec"].get("ingress", [])]
        open_to_all = any("from" not in rule for rule in rules)
        if pod.component in ("gateway", "feedback"):
            assert rules
            continue
        assert not open_to_all, f"{pod.owner} accepts traffic from anywhere"
        for rule in rules:
            for peer in rule["from"]:
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    assert selects(peer["podSelector"], release | {"app.kubernetes.io/name": "online-rl"})
                elif peer in scrapers:  # Prometheus, where the values name it
                    continue
                else:  # the KubeRay operator, to the Ray head's dashboard only
                    assert pod.component.startswith("trainer")
                    assert [p["port"] for p in rule["ports"]] == [8265]


# -- custom resources -----------------------------------------------------------------------------

def test_custom_resources_are_what_the_operators_accept(
        rendered: tuple[Path, list[dict[str, Any]]],
        operator_crds: dict[tuple[str, str], dict[str, Any]]) -> None:
    import jsonschema

    _, objects = rendered
    custom = [o for o in objects if o["apiVersion"].startswith(("ray.io/", "kafka.strimzi.io/"))]
    kinds = {kind for _, kind in operator_crds}
    for obj in custom:
        key = (obj["apiVersion"], obj["kind"])
        if obj["kind"] == "KafkaUser" and "KafkaUser" not in kinds:
            # shared/crds has no KafkaUser CRD yet; its users' ACLs are checked in test_chart_security.py
            warnings.warn("KafkaUser not validated: no KafkaUser CRD in shared/crds ($ORL_CRDS_DIR)",
                          stacklevel=1)
            continue
        assert key in operator_crds, (f"{key} is not served by the operators' CRDs: a wrong apiVersion, or "
                                      "its CRD is missing from shared/crds ($ORL_CRDS_DIR); KafkaUser's is "
                                      "Strimzi's packaging/install/cluster-operator/044-Crd-kafkauser.yaml")
        schema = operator_crds[key]
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(obj), key=str)
        assert not errors, f"{obj['kind']}/{obj['metadata']['name']}: {errors[0].message} at " \
                           f"{'.'.join(map(str, errors[0].absolute_path))}"
        unknown = _unknown_fields(obj["spec"], schema["properties"]["spec"], "spec")
        assert not unknown, f"{obj['kind']}/{obj['metadata']['name']}: fields the operator drops: {unknown}"


def _unknown_fields(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    """Fields the API server would prune (kubectl --validate=strict refuses them)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(value, dict) and "properties" in schema:
        for key, item in value.items():
            if key not in schema["properties"]:
                if not schema.get("additionalProperties"):
                    found.append(f"{path}.{key}")
                continue
            found += _unknown_fields(item, schema["properties"][key], f"{path}.{key}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            found += _unknown_fields(item, schema["additionalProperties"], f"{path}.{key}")
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += _unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def test_the_service_monitor_has_what_the_prometheus_operator_needs() -> None:
    objects = render(CHART / "ci" / "external-values.yaml")
    (monitor,) = by_kind(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prometheus"  # what its Prometheus selects
    assert monitor["spec"]["selector"] and all("port" in e for e in monitor["spec"]["endpoints"])


# -- values that must be refused ------------------------------------------------------------------

KEYS = ("auth.apiKeys[0]=5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8",
        "signing.existingSecret=online-rl-signing")
EXTERNAL_KAFKA = ("kafka.mode=external", "kafka.external.bootstrapServers=kafka:9093")
REFUSED = [
    (("config.trainer.batch_size=0",), "at '/config/trainer/batch_size': minimum: got 0, want 1"),
    (("config.trainer.batchsize=3",), "at '/config/trainer': additional properties 'batchsize' not allowed"),
    (("config.inference.engine=tgi",), "at '/config/inference/engine': value must be one of 'auto', 'vllm'"),
    (("kafka.mode=external",), "at '/kafka/external/bootstrapServers': minLength: got 0, want 1"),
    (("kafka.mode=external", "kafka.external.bootstrapServers=kafka"), "does not match pattern"),
    (("mlflow.mode=somewhere",), "at '/mlflow/mode': value must be one of 'internal', 'external'"),
    (("auth.apiKeys[0]=orl_raw-key-not-a-hash",), "at '/auth/apiKeys/0'"),
    (("inference.gpu.enabled=yes",), "at '/inference/gpu/enabled': got string, want boolean"),
    (("ingress.host=Not A Host",), "at '/ingress/host'"),
    (("inference.replicaz=2",), "at '/inference': additional properties 'replicaz' not allowed"),
    (("config.kafka.bootstrap_servers=x:9092",),
     "config.kafka.bootstrap_servers is set by the chart (it wires the components together)"),
    (("config.gateway.replicas[0]=http://x:1",), "config.gateway.replicas is set by the chart"),
    (("config.gateway.role=proxy",), "config.gateway.role is set by the chart (it wires the components "
     "together); remove it from your values (see docs/deploy.md); gateway.split.enabled runs the gateway as "
     "proxies and leader-elected controllers"),
    (("config.gateway.lease_name=mine",), "config.gateway.lease_name is set by the chart"),
    (("gateway.split.enabled=true", "gateway.split.rbac.create=false"), "gateway.split.serviceAccountName is "
     "required when gateway.split.rbac.create is false: name a ServiceAccount allowed to create, get and "
     "update the controller's Lease"),
    (("gateway.split.proxies=0",), "at '/gateway/split/proxies': minimum: got 0, want 1"),
    (("config.kafka.sasl_password=x",), "config.kafka.sasl_password is set by the chart (it wires the "
     "components together); remove it from your values (see docs/deploy.md); Kafka's security comes from "
     "kafka.mode"),
    (("config.kafka.security_protocol=PLAINTEXT",), "config.kafka.security_protocol is set by the chart"),
    (("config.mlflow.trusted_signers[0]=AAAA",), "config.mlflow.trusted_signers is set by the chart (it "
     "wires the components together); remove it from your values (see docs/deploy.md); name the signing "
     "key's Secret in signing.existingSecret instead"),
    (("config.mlflow.signing_key_file=/k.pem",), "config.mlflow.signing_key_file is set by the chart"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=TLS"), "at '/kafka/external/securityProtocol': value "
     "must be one of 'PLAINTEXT', 'SSL', 'SASL_PLAINTEXT', 'SASL_SSL'"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=SASL_SSL"), "kafka.external.saslMechanism is "
     "required with kafka.external.securityProtocol=SASL_SSL: set it to what the brokers' listener speaks"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=SASL_SSL",
      "kafka.external.saslMechanism=SCRAM-SHA-512"),
     "kafka.external.credentialsSecret is required with kafka.external.securityProtocol=SASL_SSL: create a "
     "Secret with the keys username and password"),
    ((*EXTERNAL_KAFKA, "kafka.external.saslMechanism=PLAIN"), "kafka.external.saslMechanism=PLAIN needs SASL "
     "but kafka.external.securityProtocol is PLAINTEXT: set securityProtocol to SASL_SSL"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=SASL_PLAINTEXT", "kafka.external.saslMechanism=PLAIN",
      "kafka.external.credentialsSecret=c", "kafka.external.caFromSecret=true"),
     "kafka.external.caFromSecret needs TLS but kafka.external.securityProtocol is SASL_PLAINTEXT"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=SSL", "kafka.external.caFromSecret=true"),
     "kafka.external.credentialsSecret is required with kafka.external.caFromSecret: create a Secret whose "
     "key ca.crt"),
    ((*EXTERNAL_KAFKA, "kafka.external.securityProtocol=SSL", "kafka.external.credentialsSecret=c"),
     "kafka.external.credentialsSecret is set but kafka.external.securityProtocol=SSL reads nothing from it"),
    (("mlflow.replicas=2",), "mlflow.replicas > 1 needs a database backend: set mlflow.database"),
    (("kafka.strimzi.minInsyncReplicas=4",), "kafka.strimzi.minInsyncReplicas must not exceed"),
    (("ingress.enabled=true", "ingress.tls.enabled=true"), "ingress.tls.secretName is required"),
    (("config.trainer.workers=2", "config.trainer.gpus_per_worker=1", "trainer.workers.gpus=1",
      "trainer.workers.minReplicas=1", "trainer.workers.maxReplicas=1"),
     "config.trainer asks Ray for 3 GPU bundles of 1 GPU (2 workers + the PPO critic's own), but "
     "trainer.workers holds 1"),
    (("config.trainer.gpus_per_worker=2", "trainer.workers.gpus=1"), "trainer.workers holds 0"),
]


@pytest.mark.parametrize(("sets", "message"), REFUSED, ids=[s[0][-1].split("=")[0] + f"-{i}"
                                                             for i, s in enumerate(REFUSED)])
def test_bad_values_fail_with_a_message_that_names_them(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(RenderError) as refused:
        render(None, *KEYS, *sets)
    assert message in str(refused.value), str(refused.value)


def test_an_install_without_any_api_key_is_refused() -> None:
    with pytest.raises(RenderError, match=r"auth\.apiKeys is empty, so every request would be refused"):
        render(None, KEYS[1])


def test_an_install_without_a_signing_key_says_how_to_make_one() -> None:
    with pytest.raises(RenderError) as refused:
        render(None, KEYS[0])
    message = str(refused.value)
    assert "signing.existingSecret is empty" in message
    assert "online-rl keys signing signing.pem" in message
    assert ("kubectl -n ml create secret generic online-rl-signing --from-file=signing.pem "
            "--from-literal=signing.pub=<key>") in message


def test_the_upstream_key_is_the_gateways_and_the_inference_pods_accept_it() -> None:
    objects = render(CHART / "ci" / "minimal-values.yaml")
    secret = named(objects, "Secret", "orl-online-rl-upstream-key")["stringData"]
    store = ApiKeyStore(json.loads(secret["entries"]))
    info = store.verify(secret["key"])
    assert info is not None and info.allows("inference") and info.allows("admin")
    digest = hashlib.sha256(f"checksum:{secret['key']}".encode()).hexdigest()  # salted: not the stored hash
    for pod in pods(objects):  # a new key restarts both sides together (no 401 between them)
        if pod.component in ("gateway", "inference"):
            deployment = named(objects, "Deployment", pod.owner.split("/", 1)[1])
            assert deployment["spec"]["template"]["metadata"]["annotations"]["checksum/upstream"] == digest
    again = render(CHART / "ci" / "minimal-values.yaml", "auth.upstreamKey=orl_fixed")
    assert named(again, "Secret", "orl-online-rl-upstream-key")["stringData"]["key"] == "orl_fixed"


def test_notes_tell_how_to_post_feedback_open_mlflow_and_control_the_rollout() -> None:
    result = helm("install", "orl", str(CHART), "-f", str(CHART / "ci" / "minimal-values.yaml"),
                  "--namespace", "ml", "--dry-run=client")
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "/v1/feedback" in notes and "port-forward svc/orl-online-rl-mlflow 5000:5000" in notes
    assert "online-rl rollout status --url" in notes and "/rollout/ui" in notes


def test_the_config_schema_is_generated_from_the_settings() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "deploy" / "helm" / "schema.py"), "--check"],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr


def test_long_release_names_stay_within_what_kubernetes_and_the_operators_accept() -> None:
    long = "a-very-long-release-name-for-a-team-staging"
    objects = render(CHART / "ci" / "minimal-values.yaml", release=long)
    (pool,) = by_kind(objects, "KafkaNodePool")
    (kafka,) = by_kind(objects, "Kafka")
    assert len(f"{kafka['metadata']['name']}-{pool['metadata']['name']}-0") <= 63  # Strimzi's pod names
    (job,) = by_kind(objects, "RayJob")
    assert len(job["metadata"]["name"]) <= 47  # KubeRay's limit on RayJob names
    assert all(len(o["metadata"]["name"]) <= 63 for o in objects)


def test_the_trainer_is_a_token_authenticated_ray_job_that_resumes() -> None:
    (job,) = by_kind(render(CHART / "ci" / "minimal-values.yaml"), "RayJob")
    spec = job["spec"]
    assert spec["entrypoint"].startswith("online-rl trainer")
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}  # Ray 2.60's dashboard wants one
    assert spec["backoffLimit"] >= 1 and spec["shutdownAfterJobFinishes"] is True
    assert spec["rayClusterSpec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # actors on workers


def test_a_gpu_trainer_without_ppo_needs_no_bundle_for_the_critic() -> None:
    gpu = ("config.trainer.gpus_per_worker=1", "trainer.workers.gpus=1", "trainer.workers.minReplicas=1",
           "trainer.workers.maxReplicas=1", "trainer.workers.replicas=1")
    (job,) = by_kind(render(None, *KEYS, *gpu, "config.trainer.algorithm=dpo"), "RayJob")
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["maxReplicas"] == 1
    with pytest.raises(RenderError, match="the PPO critic's own"):
        render(None, *KEYS, *gpu, "config.trainer.algorithm=ppo")
