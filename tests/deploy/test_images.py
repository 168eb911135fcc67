"""The container image's Dockerfile, read with a Dockerfile parser (no Docker engine runs here, so the
image is not built in the tests: docs/deploy.md says how to build it). Checks what a build would
need and what the chart relies on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from dockerfile_parse import DockerfileParser

from tests.deploy.chart import CHART, ROOT, render

DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"


@pytest.fixture(scope="module")
def parsed() -> DockerfileParser:
    parser = DockerfileParser(fileobj=DOCKERFILE.open("rb"))
    return parser


def _final(parsed: DockerfileParser) -> list[dict[str, str]]:
    stages = [i for i, line in enumerate(parsed.structure) if line["instruction"] == "FROM"]
    return parsed.structure[stages[-1]:]


def test_the_image_runs_as_a_non_root_user_with_a_health_check(parsed: DockerfileParser) -> None:
    final = _final(parsed)
    users = [line["value"] for line in final if line["instruction"] == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    uid = int(users[-1].split(":")[0])
    runs = "".join(line["value"] for line in final if line["instruction"] == "RUN")
    assert f"--uid {uid}" in runs  # the user is made in the image
    values = yaml_values()
    assert values["podSecurityContext"]["runAsUser"] == uid and values["podSecurityContext"]["runAsNonRoot"]
    (check,) = [line["value"] for line in final if line["instruction"] == "HEALTHCHECK"]
    assert '["online-rl", "healthcheck"]' in check
    assert [line["value"] for line in final if line["instruction"] == "ENTRYPOINT"] == ['["online-rl"]']


def test_what_the_build_copies_and_installs_is_in_the_repository(parsed: DockerfileParser) -> None:
    for line in parsed.structure:
        if line["instruction"] == "COPY" and "--from=" not in line["value"]:
            *sources, _ = line["value"].split()
            for source in sources:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    text = DOCKERFILE.read_text()
    for device in ("cpu", "gpu"):  # both variants install their lock file
        assert (ROOT / "requirements" / f"lock-{device}.txt").is_file()
    assert "requirements/lock-${DEVICE}.txt" in text
    lock = (ROOT / "requirements" / "lock-gpu.txt").read_text()
    assert re.search(r"^vllm==", lock, re.M) and re.search(r"^psycopg2-binary==", lock, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored  # the context stays small


def test_the_chart_runs_the_commands_the_image_provides(parsed: DockerfileParser) -> None:
    from typer.main import get_command

    from online_rl.cli.app import app

    cli = get_command(app)
    objects = render(CHART / "ci" / "minimal-values.yaml")
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        for container in obj["spec"]["template"]["spec"]["containers"]:
            if "command" in container:  # MLflow's server, from the same image
                assert container["command"] == ["mlflow"]
                continue
            words = container["args"]
            group = cli.commands[words[0]]  # type: ignore[attr-defined]
            if len(words) > 1:
                assert words[1] in group.commands, f"online-rl {' '.join(words)} does not exist"
    linked = re.search(r"ln -s (.+) /usr/local/bin/", DOCKERFILE.read_text())
    assert linked is not None  # KubeRay's login shell finds ray and online-rl
    assert {Path(p).name for p in linked.group(1).split()} >= {"ray", "online-rl", "mlflow"}


def yaml_values() -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))
