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
    assert "requirements/image-${DEVICE}.txt" in text
    for device in ("cpu", "gpu"):  # both variants: the dev lock's versions, no dev tools, the server extra
        image = _pins(ROOT / "requirements" / f"image-{device}.txt")
        lock = _pins(ROOT / "requirements" / f"lock-{device}.txt")
        assert {"torch", "ray", "mlflow", "psycopg2-binary", "aiohttp-cors", "opencensus"} <= set(image)
        assert not {"pytest", "playwright", "kubernetes-validate"} & set(image)
        assert all(image[name] == version for name, version in lock.items() if name in image)
    assert "vllm" in _pins(ROOT / "requirements" / "image-gpu.txt")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored  # the context stays small


def test_the_chart_runs_the_commands_the_image_provides(parsed: DockerfileParser) -> None:
    from typer.core import TyperGroup
    from typer.main import get_command

    from online_rl.cli.app import app

    cli = get_command(app)
    objects = render(CHART / "ci" / "minimal-values.yaml")
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        spec = obj["spec"]["template"]["spec"]
        for container in [*spec["containers"], *spec.get("initContainers", [])]:
            runs = [container["args"]]
            hook = container.get("lifecycle", {}).get("postStart", {}).get("exec", {}).get("command")
            if hook:  # MLflow's users, made by online-rl in the server's container
                assert hook[0] == "online-rl"
                runs.append(hook[1:])
            if "command" in container:  # MLflow's server, from the same image
                assert container["command"] == ["mlflow"]
                runs = runs[1:]
            for words in runs:
                command, rest = cli, list(words)
                while rest and isinstance(command, TyperGroup):  # down the subcommands
                    assert rest[0] in command.commands, f"online-rl {' '.join(words)} does not exist"
                    command = command.commands[rest.pop(0)]
                options = {o for param in command.params for o in param.opts}
                unknown = [w for w in rest if w.startswith("--") and w.split("=", 1)[0] not in options]
                assert not unknown, f"online-rl {' '.join(words)}: no option {unknown}"
    linked = re.search(r"ln -s (.+) /usr/local/bin/", DOCKERFILE.read_text())
    assert linked is not None  # KubeRay's login shell finds ray and online-rl
    assert {Path(p).name for p in linked.group(1).split()} >= {"ray", "online-rl", "mlflow"}


def yaml_values() -> dict[str, Any]:
    import yaml

    return dict(yaml.safe_load((CHART / "values.yaml").read_text()))


def _pins(file: Path) -> dict[str, str]:
    lines = file.read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if re.match(r"^[A-Za-z0-9]", line) and "==" in line)
