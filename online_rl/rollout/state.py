"""The state of the one rollout at a time and its audit log, kept durably on disk.

`RolloutStore` replaces the state file atomically and appends the audit log with an fsync, so the
state survives a restart of whatever runs the rollout. Pure: files only; no HTTP, no registry, no bus.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["RolloutState", "RolloutStore", "Status"]

Status = Literal["running", "paused", "promoted", "rolled_back"]


@dataclass
class RolloutState:
    rollout_id: str
    registered_model: str
    challenger: str  # version number
    champion: str | None  # version number when the rollout began
    status: Status = "running"
    step: int = 0
    weight: float = 0.0
    started: float = 0.0
    step_started: float = 0.0
    history: list[dict[str, Any]] = field(default_factory=list)
    mlflow_pending: str | None = None  # a promote/rollback decided here but not yet carried out in MLflow

    @property
    def active(self) -> bool:
        return self.status in ("running", "paused")


class RolloutStore:
    """`state.json` (atomically replaced) and `audit.jsonl` (appended, fsynced) under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.state_path = self.root / "state.json"
        self.audit_path = self.root / "audit.jsonl"

    def load(self) -> RolloutState | None:
        if not self.state_path.is_file():
            return None
        return RolloutState(**json.loads(self.state_path.read_text()))

    def save(self, state: RolloutState) -> None:
        staging = self.root / f".state-{uuid.uuid4().hex}.json"
        with staging.open("w") as handle:
            json.dump(asdict(state), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(staging, self.state_path)

    def audit(self, entry: dict[str, Any]) -> None:
        with self.audit_path.open("a+b") as handle:
            if handle.tell() > 0:  # after a line a crash tore, start a line of its own
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    handle.write(b"\n")
            handle.write((json.dumps(entry, sort_keys=True) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())

    def entries(self) -> list[dict[str, Any]]:
        if not self.audit_path.is_file():
            return []
        entries = []
        for line in self.audit_path.read_text().splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:  # a line torn by a crash mid-write (the state file holds its decision)
                continue
        return [e for e in entries if isinstance(e, dict)]
