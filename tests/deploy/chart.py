"""Rendering the chart with the real Helm CLI, and reading what it rendered (for the chart tests): the
objects, their pod templates, and the settings each container will load."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from online_rl.config import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "online-rl"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))


def helm_binary() -> str:
    """`$ORL_HELM`, the one `make setup` builds into .venv/bin, or helm on PATH."""
    for candidate in (os.environ.get("ORL_HELM"), str(ROOT / ".venv" / "bin" / "helm"), shutil.which("helm")):
        if candidate and Path(candidate).is_file():
            return candidate
    raise RuntimeError("no helm CLI: `make setup` builds it with `go install` into .venv/bin/helm "
                       "(or set ORL_HELM)")


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def render(values: Path | None = None, *sets: str, release: str = "orl",
           namespace: str = "ml") -> list[dict[str, Any]]:
    """The rendered objects (`helm template`); raises with Helm's message when it refuses."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if values is not None:
        args += ["-f", str(values)]
    for item in sets:
        args += ["--set", item]
    result = helm(*args)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


class RenderError(Exception):
    """Helm refused the values; the message is what the user sees."""


@dataclass(frozen=True)
class Pod:
    """A pod template of a workload (Deployment or a RayJob's head/worker group)."""

    owner: str
    component: str
    spec: dict[str, Any]
    labels: dict[str, str]

    @property
    def containers(self) -> list[dict[str, Any]]:
        return list(self.spec["containers"])

    def ports(self) -> dict[str, int]:
        return {p["name"]: p["containerPort"] for c in self.containers for p in c.get("ports", [])}


def pods(objects: list[dict[str, Any]]) -> list[Pod]:
    found = []
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "Deployment":
            templates = [obj["spec"]["template"]]
        elif obj["kind"] == "RayJob":
            cluster = obj["spec"]["rayClusterSpec"]
            templates = [cluster["headGroupSpec"]["template"],
                         *(g["template"] for g in cluster["workerGroupSpecs"])]
        else:
            continue
        for template in templates:
            labels = template["metadata"]["labels"]
            found.append(Pod(name, labels["app.kubernetes.io/component"], template["spec"], labels))
    return found


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert matches, f"no {kind} named {name}"
    return matches[0]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels/matchExpressions, or a plain map) against labels."""
    plain = {k: v for k, v in selector.items() if k not in ("matchLabels", "matchExpressions")}
    required = {**plain, **selector.get("matchLabels", {})}
    if any(labels.get(k) != v for k, v in required.items()):
        return False
    for expression in selector.get("matchExpressions", []):
        value, operator = labels.get(expression["key"]), expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and value in expression["values"]:
            return False
        if operator == "Exists" and value is None:
            return False
        if operator == "DoesNotExist" and value is not None:
            return False
    return True


# What the tests read from the Secrets the chart names but does not make (the operator's, and those of
# Strimzi's User Operator), by key.
STAND_INS = {
    "username": "stand-in-user",
    "password": "stand-in-password",
    "signing.pub": base64.b64encode(bytes(range(32))).decode(),  # an Ed25519 public key's form
}


def pod_name(pod: Pod) -> str:
    """A name Kubernetes could give one of the workload's pods (a Deployment's: <name>-<hash>-<suffix>)."""
    return f"{pod.owner.split('/', 1)[1]}-5d8f9c7b6-x2x4q"


def field_value(pod: Pod, field_path: str) -> str:
    """What a fieldRef gives the container (the downward API), for the fields the chart uses."""
    assert field_path == "metadata.name", f"{pod.owner}: no stand-in for fieldRef {field_path}"
    return pod_name(pod)


def secret_value(objects: list[dict[str, Any]], ref: dict[str, str]) -> str:
    """What a secretKeyRef gives: the rendered Secret's value, else the stand-in for its key."""
    made = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == ref["name"]]
    if made:
        return str(made[0]["stringData"][ref["key"]])
    assert ref["key"] in STAND_INS, f"no stand-in for key {ref['key']!r} of Secret {ref['name']}"
    return STAND_INS[ref["key"]]


# Environment variables the command line reads itself (everything else ORL_* is a setting).
PROCESS_ENV = {"ORL_CONFIG": "online_rl/config.py", "ORL_LOG_FORMAT": "online_rl/cli/app.py",
               "ORL_HEARTBEAT_FILE": "online_rl/cli/health.py", "ORL_HEALTH_FILE": "online_rl/cli/health.py"}


def setting_exists(env_name: str) -> bool:
    """Whether ORL_<SECTION>__<FIELD>... names a field of the settings tree."""
    model: Any = Settings
    for part in env_name.removeprefix("ORL_").lower().split("__"):
        fields = getattr(model, "model_fields", None)
        if fields is None or part not in fields:
            return False
        annotation = fields[part].annotation
        model = annotation if isinstance(annotation, type) else None
    return True


def settings_of(pod: Pod, container: dict[str, Any], objects: list[dict[str, Any]], tmp: Path,
                monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings this container will load: the mounted ConfigMap as ORL_CONFIG plus its env (values
    from Secrets the chart does not make are `STAND_INS`; the pod's name is `pod_name`)."""
    env = {e["name"]: e for e in container.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
    volume = next(v for v in pod.spec["volumes"] if v["name"] == "config")
    config_path = Path(env["ORL_CONFIG"]["value"])
    assert config_path.parent == Path(mounts["config"]), f"{pod.owner}: ORL_CONFIG is not the mounted file"
    config = named(objects, "ConfigMap", volume["configMap"]["name"])["data"][config_path.name]
    (tmp / "config.yaml").write_text(config)
    for name in [n for n in os.environ if n.startswith("ORL_")]:
        monkeypatch.delenv(name)
    for name, item in env.items():
        if name in PROCESS_ENV:  # read by the command line, not settings: check that it is read
            assert name in (ROOT / PROCESS_ENV[name]).read_text(), f"{name} is read nowhere"
            continue
        if not name.startswith("ORL_"):
            continue
        assert setting_exists(name), f"{pod.owner}: {name} names no setting of online_rl/config.py"
        source = item.get("valueFrom", {})
        if "secretKeyRef" in source:
            value = secret_value(objects, source["secretKeyRef"])
        elif "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        else:
            value = item["value"]
        monkeypatch.setenv(name, str(value))
    return load_settings(tmp / "config.yaml")
