"""The operators' CRD schemas (test data read from ../shared/crds or $ORL_CRDS_DIR, never copied)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.chart import ROOT


@pytest.fixture(scope="session")
def operator_crds() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the served version's openAPIV3Schema, for KubeRay's and Strimzi's CRDs."""
    folder = Path(os.environ.get("ORL_CRDS_DIR") or ROOT.parent / "shared" / "crds")
    files = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    if not files:
        pytest.skip(f"no CRD schemas in {folder} (set ORL_CRDS_DIR to the KubeRay and Strimzi CRDs); "
                    "the custom resources were not checked against them")
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for file in files:
        for crd in yaml.safe_load_all(file.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas
