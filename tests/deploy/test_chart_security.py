"""The chart's identities: Kafka over TLS with a SCRAM user per component whose ACLs allow exactly what
that component's code does on the bus, an existing cluster's credentials handed to every Kafka client,
and the version-signing key (only the trainer holds it; the inference pods trust its public half)."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from online_rl.bus import Bus, ensure_topics
from online_rl.config import Settings
from online_rl.stream import Joiner
from tests.deploy.chart import (
    CHART,
    ROOT,
    STAND_INS,
    VALUES_FILES,
    Pod,
    by_kind,
    pod_name,
    pods,
    render,
    settings_of,
)

MINIMAL = CHART / "ci" / "minimal-values.yaml"
EXTERNAL = CHART / "ci" / "external-values.yaml"
IDS = [f.stem for f in VALUES_FILES]

# The pods whose code opens the bus, and the component each one is on Kafka (the trainer's driver runs
# on the Ray head; its workers never touch Kafka; the gateway's proxies and controllers are one user).
KAFKA_CLIENTS = {"feedback": "feedback", "inference": "inference", "gateway": "gateway",
                 "gateway-controller": "gateway", "joiner": "joiner", "trainer-head": "trainer"}

# Consumer groups the code names at run time rather than in the settings, and where.
# the gateway's tally, one per start
ROLLOUT_GROUP_PREFIX = ("orl-rollout-", "online_rl/rollout/driver/canary.py")
# the gateway's feed of the rollout topic (split mode), one per start
ROLLOUT_FEED_GROUP_PREFIX = ("orl-rollout-", "online_rl/rollout/shared.py")
# Bus.read_all: the joiner's restore, the gateway controller's reload of the rollout topic
READ_ALL_GROUP_PREFIX = ("read-all-", "online_rl/bus/base.py")
PROBE_GROUP = ("orl-probe", "online_rl/bus/kafka.py")  # KafkaBus.end_offsets' probe consumer
# Each joiner replica's transactional id: its group, then its join.instance (the chart: the pod's name)
JOINER_TRANSACTIONAL_ID = ("{join.group_id}-{join.instance}", "online_rl/cli/bus.py")


@dataclass
class Uses:
    """What one component does on Kafka."""

    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    group_prefixes: set[str] = field(default_factory=set)
    described_groups: set[str] = field(default_factory=set)
    transactional_id_prefixes: set[str] = field(default_factory=set)

    def __or__(self, other: Uses) -> Uses:
        return Uses(*(getattr(self, f.name) | getattr(other, f.name) for f in fields(self)))


def _named_in_code(name: tuple[str, str]) -> str:
    assert name[0] in (ROOT / name[1]).read_text(), f"{name[0]!r} is no longer in {name[1]}: update this test"
    return name[0]


def _gateway_uses(settings: Settings) -> Uses:
    """The gateway's use of the bus in its role (services/gateway/main.py)."""
    topics = settings.topics
    tally = Uses(reads={topics.samples}, group_prefixes={_named_in_code(ROLLOUT_GROUP_PREFIX)})
    if settings.gateway.role == "all":  # the rollout loop's tally; its state is in a folder
        return tally
    # every proxy and controller tails the rollout topic (RolloutFeed, sized by end_offsets' probe) and
    # reports its answers' health (HealthReporter)
    proxy = Uses(reads={topics.rollout}, writes={topics.gateway_health},
                 group_prefixes={_named_in_code(ROLLOUT_FEED_GROUP_PREFIX)},
                 described_groups={_named_in_code(PROBE_GROUP)})
    if settings.gateway.role == "proxy":
        return proxy
    # the leader also tallies, reads the health reports, writes the state, heartbeat and audit
    # (BusRolloutStore) and reloads them with Bus.read_all
    return proxy | tally | Uses(reads={topics.gateway_health, topics.rollout}, writes={topics.rollout},
                                group_prefixes={_named_in_code(READ_ALL_GROUP_PREFIX)})


def _code_uses(settings: Settings) -> dict[str, Uses]:
    """Each component's use of the bus, from the code's own names."""
    topics = settings.topics
    joiner = inspect.signature(Joiner.__init__).parameters
    probe = _named_in_code(PROBE_GROUP)
    return {
        "feedback": Uses(writes={topics.feedback}),  # services/feedback/service.py
        "inference": Uses(writes={topics.interactions}),  # services/inference -> InteractionLogger
        "gateway": _gateway_uses(settings),
        "joiner": Uses(reads={topics.interactions, topics.feedback, topics.join_state, topics.join_pairs},
                       writes={topics.samples, topics.join_state, topics.join_pairs, topics.dlq},
                       groups={joiner["group_id"].default},
                       group_prefixes={_named_in_code(READ_ALL_GROUP_PREFIX)}, described_groups={probe},
                       transactional_id_prefixes={
                           _named_in_code(JOINER_TRANSACTIONAL_ID).split("{join.instance}")[0].format(
                               join=settings.join)}),
        "trainer": Uses(reads={topics.samples}, writes={topics.dlq}, groups={settings.trainer.group_id},
                        described_groups={probe}),
    }


class _CreatedTopics:
    """A bus that only records which topics `ensure_topics` asks for."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def create_topic(self, name: str, partitions: int = 1, compact: bool = False) -> None:
        self.counts.setdefault(name, partitions)

    def partitions(self, topic: str) -> int:
        return self.counts[topic]


def _created_at_start(settings: Settings) -> set[str]:
    """The topics every component asks to create at start (it runs `ensure_topics`)."""
    recorder = _CreatedTopics()
    ensure_topics(cast(Bus, recorder), settings.topics, settings.bus.partitions)
    return set(recorder.counts)


Acl = tuple[str, str, str, str]  # resource type, name, pattern type, operation


def _expected_acls(uses: Uses, created: set[str]) -> set[Acl]:
    acls = {("topic", t, "literal", op) for t in created for op in ("Create", "Describe")}
    acls |= {("topic", t, "literal", op) for t in uses.reads for op in ("Read", "Describe")}
    acls |= {("topic", t, "literal", op) for t in uses.writes for op in ("Write", "Describe")}
    acls |= {("group", g, "literal", "Read") for g in uses.groups}
    acls |= {("group", g, "prefix", "Read") for g in uses.group_prefixes}
    acls |= {("group", g, "literal", "Describe") for g in uses.described_groups}
    acls |= {("transactionalId", t, "prefix", op) for t in uses.transactional_id_prefixes
             for op in ("Write", "Describe")}
    if uses.writes:  # every producer is idempotent
        acls.add(("cluster", "", "literal", "IdempotentWrite"))
    return acls


def _rendered_acls(user: dict[str, Any]) -> set[Acl]:
    out = set()
    for acl in user["spec"]["authorization"]["acls"]:
        assert acl.get("type", "allow") == "allow" and acl.get("host", "*") == "*", acl
        resource = acl["resource"]
        for op in acl["operations"]:
            out.add((resource["type"], resource.get("name", ""), resource.get("patternType", "literal"), op))
    return out


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _secret_ref(container: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(_env(container)[name]["valueFrom"]["secretKeyRef"])


def _assert_file_from_secret(pod: Pod, container: dict[str, Any], path: Path | None, secret: str,
                             key: str) -> dict[str, Any]:
    """`path` is the file `key` of `secret`, mounted read-only in `container`; returns the volume item."""
    assert path is not None, f"{pod.owner}: no file set"
    volumes = {v["name"]: v for v in pod.spec["volumes"]}
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]].get("secret")
        if source and path.parent == Path(mount["mountPath"]):
            assert source["secretName"] == secret and mount.get("readOnly") is True, pod.owner
            (item,) = [i for i in source["items"] if i["path"] == path.name]
            assert item["key"] == key
            return dict(item)
    raise AssertionError(f"{pod.owner}: {path} is on no mounted Secret")


def _kafka_clients(objects: list[dict[str, Any]]) -> list[tuple[Pod, dict[str, Any]]]:
    found = []
    for pod in pods(objects):
        for container in pod.containers:
            if pod.component in KAFKA_CLIENTS:
                found.append((pod, container))
            else:
                assert not [n for n in _env(container) if n.startswith("ORL_KAFKA__")], pod.owner
    return found


# -- Strimzi: TLS, SCRAM, one user per component ----------------------------------------------------

def test_the_strimzi_listener_is_tls_with_scram_users_and_acls(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(MINIMAL)
    (kafka,) = by_kind(objects, "Kafka")
    (listener,) = kafka["spec"]["kafka"]["listeners"]  # no plaintext listener beside it
    assert listener["tls"] is True and listener["authentication"] == {"type": "scram-sha-512"}
    assert listener["port"] == 9093 and listener["networkPolicyPeers"]  # the port Strimzi's policy opens
    assert kafka["spec"]["kafka"]["authorization"] == {"type": "simple"}
    assert "userOperator" in kafka["spec"]["entityOperator"]  # it makes the users' passwords and ACLs
    for pod, container in _kafka_clients(objects):
        settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
        assert settings.kafka.bootstrap_servers == f"{kafka['metadata']['name']}-kafka-bootstrap:9093"


@pytest.mark.parametrize("values", VALUES_FILES, ids=IDS)
def test_each_kafka_client_is_its_own_user_allowed_only_what_its_code_does(
        values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(values)
    if not by_kind(objects, "Kafka"):
        pytest.skip("an external Kafka: its users are the operator's (see the external tests)")
    (kafka,) = by_kind(objects, "Kafka")
    users = {u["metadata"]["labels"]["app.kubernetes.io/component"]: u for u in by_kind(objects, "KafkaUser")}
    cluster = kafka["metadata"]["name"]
    assert all(u["metadata"]["labels"]["strimzi.io/cluster"] == cluster for u in users.values())
    expected: dict[str, set[Acl]] = {}  # a user's pods may do different things (the gateway's roles)
    for pod, container in _kafka_clients(objects):
        settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
        component = KAFKA_CLIENTS[pod.component]
        name = users[component]["metadata"]["name"]
        assert users[component]["spec"]["authentication"] == {"type": "scram-sha-512"}
        assert settings.kafka.security_protocol == "SASL_SSL"
        assert settings.kafka.sasl_mechanism == "SCRAM-SHA-512"
        assert settings.kafka.sasl_username == name  # its own user, and the password of that user
        assert _secret_ref(container, "ORL_KAFKA__SASL_PASSWORD") == {"name": name, "key": "password"}
        _assert_file_from_secret(pod, container, settings.kafka.ssl_ca_location,
                                 f"{cluster}-cluster-ca-cert", "ca.crt")
        uses = _expected_acls(_code_uses(settings)[component], _created_at_start(settings))
        expected[component] = expected.get(component, set()) | uses
    assert set(expected) == set(users), f"KafkaUsers nobody uses: {set(users) - set(expected)}"
    for component, user in users.items():
        name, rendered = user["metadata"]["name"], _rendered_acls(user)
        assert rendered == expected[component], (
            f"{name}: more than its code needs: {sorted(rendered - expected[component])}; "
            f"missing: {sorted(expected[component] - rendered)}")
    names = [u["metadata"]["name"] for u in users.values()]
    assert len(set(names)) == len(names)


def test_the_acls_follow_the_topic_prefix_and_the_trainers_group(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(MINIMAL, "config.bus.topic_prefix=team-a", "config.trainer.group_id=my-trainer")
    (trainer,) = [u for u in by_kind(objects, "KafkaUser")
                  if u["metadata"]["labels"]["app.kubernetes.io/component"] == "trainer"]
    acls = _rendered_acls(trainer)
    assert ("topic", "team-a.samples", "literal", "Read") in acls
    assert ("group", "my-trainer", "literal", "Read") in acls
    assert not [a for a in acls if a[0] == "topic" and a[1].startswith("orl.")]


def test_unset_groups_are_named_after_the_topic_prefix_in_the_code_and_the_acls() -> None:
    """Two releases with topics of their own on one Kafka do not share a consumer group."""
    objects = render(MINIMAL, "config.bus.topic_prefix=team-a")
    users = {u["metadata"]["labels"]["app.kubernetes.io/component"]: _rendered_acls(u)
             for u in by_kind(objects, "KafkaUser")}
    settings = Settings(bus={"topic_prefix": "team-a"})  # type: ignore[arg-type]
    assert (settings.trainer.group_id, settings.join.group_id) == ("team-a-trainer", "team-a-joiner")
    assert ("group", "team-a-trainer", "literal", "Read") in users["trainer"]
    assert ("group", "team-a-joiner", "literal", "Read") in users["joiner"]
    assert not [a for acls in users.values() for a in acls if a[0] == "group" and a[1] in
                ("orl-trainer", "orl-joiner")]
    # ... and so are the joiner's transactional ids: a release's joiner cannot fence another's
    replica = settings.join.model_copy(update={"instance": "p"})
    own = _named_in_code(JOINER_TRANSACTIONAL_ID).format(join=replica)
    assert own == "team-a-joiner-p"
    assert {a for a in users["joiner"] if a[0] == "transactionalId"} == {
        ("transactionalId", "team-a-joiner-", "prefix", op) for op in ("Write", "Describe")}


def test_every_joiner_replica_writes_join_pairs_under_a_transactional_id_of_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(CHART / "ci" / "database-values.yaml")  # joiner.replicas: 3
    (user,) = [u for u in by_kind(objects, "KafkaUser")
               if u["metadata"]["labels"]["app.kubernetes.io/component"] == "joiner"]
    acls = _rendered_acls(user)
    assert {("topic", "orl.join-pairs", "literal", op) for op in ("Read", "Write")} <= acls
    transactional = {a for a in acls if a[0] == "transactionalId"}
    assert transactional == {("transactionalId", "orl-joiner-", "prefix", op) for op in ("Write", "Describe")}
    (pod,) = [p for p in pods(objects) if p.component == "joiner"]
    settings = settings_of(pod, pod.containers[0], objects, tmp_path, monkeypatch)
    own = _named_in_code(JOINER_TRANSACTIONAL_ID).format(join=settings.join)
    assert own == f"orl-joiner-{pod_name(pod)}"  # one id per pod: no replica fences another
    others = [a for u in by_kind(objects, "KafkaUser") if u is not user for a in _rendered_acls(u)]
    assert not [a for a in others if a[0] == "transactionalId"]


# -- an existing cluster --------------------------------------------------------------------------

EXTERNAL_SECURITY = [
    # (the values over external-values.yaml, the protocol, SASL mechanism, and whether a CA is mounted)
    ((), "SASL_SSL", "SCRAM-SHA-512", True),
    (("kafka.external.securityProtocol=SASL_PLAINTEXT", "kafka.external.saslMechanism=PLAIN",
      "kafka.external.caFromSecret=false"), "SASL_PLAINTEXT", "PLAIN", False),
    (("kafka.external.securityProtocol=SSL", "kafka.external.saslMechanism="), "SSL", None, True),
    (("kafka.external.securityProtocol=SSL", "kafka.external.saslMechanism=",
      "kafka.external.credentialsSecret=", "kafka.external.caFromSecret=false"), "SSL", None, False),
    (("kafka.external.securityProtocol=PLAINTEXT", "kafka.external.saslMechanism=",
      "kafka.external.credentialsSecret=", "kafka.external.caFromSecret=false"), "PLAINTEXT", None, False),
]


@pytest.mark.parametrize(("sets", "protocol", "mechanism", "ca"), EXTERNAL_SECURITY,
                         ids=[f"{c[1]}-{'ca' if c[3] else 'system-ca'}" for c in EXTERNAL_SECURITY])
def test_an_external_clusters_credentials_reach_every_kafka_client(
        sets: tuple[str, ...], protocol: str, mechanism: str | None, ca: bool, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(EXTERNAL, *sets)
    assert not by_kind(objects, "KafkaUser") and not by_kind(objects, "Kafka")
    secret = yaml.safe_load(EXTERNAL.read_text())["kafka"]["external"]["credentialsSecret"]
    clients = _kafka_clients(objects)
    assert {KAFKA_CLIENTS[p.component] for p, _ in clients} == set(KAFKA_CLIENTS.values())
    for pod, container in clients:
        settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
        assert settings.kafka.security_protocol == protocol and settings.kafka.sasl_mechanism == mechanism
        if mechanism is not None:
            assert _secret_ref(container, "ORL_KAFKA__SASL_USERNAME") == {"name": secret, "key": "username"}
            assert _secret_ref(container, "ORL_KAFKA__SASL_PASSWORD") == {"name": secret, "key": "password"}
            assert settings.kafka.sasl_username == STAND_INS["username"]
            assert settings.kafka.sasl_password is not None
        else:
            assert settings.kafka.sasl_username is None and settings.kafka.sasl_password is None
        if ca:
            _assert_file_from_secret(pod, container, settings.kafka.ssl_ca_location, secret, "ca.crt")
        else:
            assert settings.kafka.ssl_ca_location is None
            assert "kafka-ca" not in {v["name"] for v in pod.spec["volumes"]}


# -- the version-signing key ----------------------------------------------------------------------

@pytest.mark.parametrize("values", VALUES_FILES, ids=IDS)
def test_only_the_trainer_holds_the_signing_key_and_inference_trusts_it(
        values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    objects = render(values)
    secret = yaml.safe_load(values.read_text())["signing"]["existingSecret"]
    checked = set()
    for pod in pods(objects):
        holders = [v for v in pod.spec["volumes"] if v.get("secret", {}).get("secretName") == secret]
        for container in pod.containers:
            env = _env(container)
            if pod.component == "trainer-head":
                settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
                item = _assert_file_from_secret(pod, container, settings.mlflow.signing_key_file, secret,
                                                "signing.pem")
                assert item["mode"] == 0o400
                checked.add(pod.component)
                continue
            assert "ORL_MLFLOW__SIGNING_KEY_FILE" not in env, pod.owner
            assert not holders, f"{pod.owner} mounts the signing key's Secret"
            if pod.component == "inference":
                settings = settings_of(pod, container, objects, tmp_path, monkeypatch)
                ref = _secret_ref(container, "ORL_MLFLOW__TRUSTED_SIGNERS")
                assert ref == {"name": secret, "key": "signing.pub"}
                assert settings.mlflow.trusted_signers == [STAND_INS["signing.pub"]]
                checked.add(pod.component)
    trainer = yaml.safe_load(values.read_text()).get("trainer", {}).get("enabled", True)
    assert checked == ({"inference", "trainer-head"} if trainer else {"inference"})


# -- MLflow's sign-in -----------------------------------------------------------------------------

# The pods whose code talks to MLflow, and the MLflow user each one is (online_rl/registry/access.py's
# roles): the trainer registers versions, the gateway's rollout controller moves the aliases (the single
# gateway, or in split mode the controllers: the proxies never talk to MLflow), serving reads.
MLFLOW_CLIENTS = {"trainer-head": "trainer", "gateway": "gateway", "gateway-controller": "gateway",
                  "inference": "inference"}
MLFLOW_USERS = sorted(set(MLFLOW_CLIENTS.values()))


def _mlflow_user(container: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    env = _env(container)
    if "MLFLOW_TRACKING_USERNAME" not in env and "MLFLOW_TRACKING_PASSWORD" not in env:
        return None
    return (_secret_ref(container, "MLFLOW_TRACKING_USERNAME"),
            _secret_ref(container, "MLFLOW_TRACKING_PASSWORD"))


def _mlflow_users_by_component(objects: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], ...]]:
    found: dict[str, tuple[dict[str, Any], ...]] = {}
    for pod in pods(objects):
        for container in [*pod.containers, *pod.spec.get("initContainers", [])]:
            user = _mlflow_user(container)
            if user is not None:
                assert pod.component not in found, f"{pod.owner}: two MLflow users"
                found[pod.component] = user
    return found


@pytest.mark.parametrize("values", VALUES_FILES, ids=IDS)
def test_each_mlflow_client_signs_in_as_its_own_user_with_only_its_rights(values: Path) -> None:
    objects = render(values)
    spec = yaml.safe_load(values.read_text())
    secret = spec.get("mlflow", {}).get("auth", {}).get("existingSecret") or "orl-online-rl-mlflow-auth"
    users = _mlflow_users_by_component(objects)
    trainer = spec.get("trainer", {}).get("enabled", True)
    split = spec.get("gateway", {}).get("split", {}).get("enabled", False)
    gateway = "gateway-controller" if split else "gateway"  # in split mode the proxies do not sign in
    assert set(users) == {"inference", gateway} | ({"trainer-head"} if trainer else set())  # nobody else does
    for component, (username, password) in users.items():
        role = MLFLOW_CLIENTS[component]
        assert username == {"name": secret, "key": f"{role}-username"}, component
        assert password == {"name": secret, "key": f"{role}-password"}, component
    # what each user may do is the code's table (online_rl/registry/access.py): serving only reads, the
    # trainer writes runs, and the two writers share the model (MLflow asks the same right to register a
    # version and to move an alias, and the gateway's rollout controller must move them)
    from online_rl.registry.access import GRANTS, MODEL

    assert set(GRANTS) == set(MLFLOW_USERS)
    assert GRANTS["inference"] == ()  # read-only: the default permission, READ
    writers = {role for role, grants in GRANTS.items() if ("registered_model", MODEL, "MANAGE") in grants}
    assert writers == {"trainer", "gateway"}  # the gateway's rollout controller moves the aliases
    assert ("experiment", "*", "EDIT") in GRANTS["trainer"]  # its runs and their artifacts
    assert all(g[0] != "experiment" for g in GRANTS["gateway"])
    if spec.get("mlflow", {}).get("mode") == "external":
        assert not [s for s in by_kind(objects, "Secret") if s["metadata"]["name"].endswith("-mlflow-auth")]


def test_an_external_mlflow_without_users_is_reached_without_signing_in() -> None:
    objects = render(EXTERNAL, "mlflow.auth.existingSecret=")
    assert _mlflow_users_by_component(objects) == {}


INTERNAL_MLFLOW = [v for v in VALUES_FILES if v != EXTERNAL]


@pytest.mark.parametrize("values", INTERNAL_MLFLOW, ids=[v.stem for v in INTERNAL_MLFLOW])
def test_the_mlflow_server_runs_the_sign_in_app_and_gives_each_user_its_rights(values: Path) -> None:
    from typer.testing import CliRunner

    from online_rl.cli.app import app

    objects = render(values)
    spec = yaml.safe_load(values.read_text())
    database = spec.get("mlflow", {}).get("database", {})
    (pod,) = [p for p in pods(objects) if p.component == "mlflow"]
    (server,) = pod.containers
    env = _env(server)
    assert "--app-name=basic-auth" in server["args"]
    # the config file the init container writes is the one the server reads, on a volume they share
    (init,) = pod.spec["initContainers"]
    config = Path(env["MLFLOW_AUTH_CONFIG_PATH"]["value"])
    assert init["args"] == ["registry", "auth-config", str(config)]
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]} == {"auth-config": str(config.parent)}
    assert mounts["auth-config"] == str(config.parent)
    user_db = _env(init)["MLFLOW_AUTH_DATABASE_URI"]
    if database.get("existingSecret"):  # the tracking store's database (replicas share it)
        assert user_db["valueFrom"]["secretKeyRef"] == {"name": database["existingSecret"],
                                                        "key": database.get("secretKey", "uri")}
    else:  # SQLite beside the tracking store's, on the volume
        assert user_db["value"] == "sqlite:////mlflow/basic_auth.db" and mounts["data"] == "/mlflow"
    # the admin's password and the app's key come from the chart's Secret, made at install
    (made,) = [s for s in by_kind(objects, "Secret") if s["metadata"]["name"] == "orl-online-rl-mlflow-auth"]
    data = made["stringData"]
    assert made["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert _secret_ref(server, "MLFLOW_AUTH_ADMIN_PASSWORD") == {"name": "orl-online-rl-mlflow-auth",
                                                                 "key": "admin-password"}
    assert _secret_ref(server, "MLFLOW_FLASK_SERVER_SECRET_KEY")["key"] == "flask-secret-key"
    passwords = [data["admin-password"], data["flask-secret-key"],
                 *(data[f"{role}-password"] for role in MLFLOW_USERS)]
    assert len(set(passwords)) == len(passwords) and min(map(len, passwords)) >= 12  # MLflow's minimum
    assert all(data[f"{role}-username"] == role for role in MLFLOW_USERS)
    # before the pod is ready, `online-rl registry grant` makes each user with its rights, from the Secret
    command = server["lifecycle"]["postStart"]["exec"]["command"]
    assert command[:3] == ["online-rl", "registry", "grant"]
    folder = Path(command[3])
    (volume,) = [v for v in pod.spec["volumes"] if v["name"] == next(
        m["name"] for m in server["volumeMounts"] if Path(m["mountPath"]) == folder)]
    assert volume["secret"]["secretName"] == "orl-online-rl-mlflow-auth"
    assert {i["key"] for i in volume["secret"]["items"]} == {
        f"{role}-{what}" for role in MLFLOW_USERS for what in ("username", "password")}
    assert all(i["path"] == i["key"] for i in volume["secret"]["items"])
    assert command[command.index("--registered-model") + 1] == spec.get("config", {}).get("mlflow", {}).get(
        "registered_model", "online-rl-policy")
    assert command[command.index("--tracking-uri") + 1] == "http://127.0.0.1:5000"
    parsed = CliRunner().invoke(app, [*command[1:], "--help"])  # the command and its options exist
    assert parsed.exit_code == 0, parsed.output


def test_mlflow_passwords_from_an_existing_secret_are_used_and_none_are_made() -> None:
    objects = render(MINIMAL, "mlflow.auth.existingSecret=my-mlflow")
    assert not [s for s in by_kind(objects, "Secret") if s["metadata"]["name"].endswith("-mlflow-auth")]
    (pod,) = [p for p in pods(objects) if p.component == "mlflow"]
    assert _secret_ref(pod.containers[0], "MLFLOW_AUTH_ADMIN_PASSWORD")["name"] == "my-mlflow"
    secrets = {ref["name"] for user in _mlflow_users_by_component(objects).values() for ref in user}
    assert secrets == {"my-mlflow"}
