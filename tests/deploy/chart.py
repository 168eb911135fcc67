"""Rendering the chart with the real Helm CLI, and reading what it rendered (for the chart tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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
