"""A flow: the named nodes one training step passes through, in order.

The single controller (`online_rl.trainer.controller.Trainer`) reads a batch from the samples topic,
makes a `Step` of it and runs the flow's nodes on it one after the other. A node is any callable
`node(step) -> None`: it reads what earlier nodes left in `step.data` (by name: `routed`, `rollouts`,
`rewards`, ...), adds its own, adds metrics, or ends the pass early (`step.stop()`). The two built-in
flows, `feedback` (score → update → evaluate → publish → checkpoint → commit) and `rollout` (observe
→ reward_model → generate → reward → advantage → update → log → publish → commit), are built from
the trainer's own nodes; a user adds a node (a filter, an evaluation, a reward), replaces one or
removes one in a line each:

    flow.add("short_only", drop_long_answers, after="score")
    flow.replace("evaluate", my_evaluation)

Pure: no Ray, no bus, no MLflow. Each node's wall time lands in the step's metrics as
`node_<name>_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from online_rl.flow.errors import FlowError

__all__ = ["KINDS", "Flow", "Node", "Step"]

Node = Callable[["Step"], None]


@dataclass
class Step:
    """What one pass of a flow carries from node to node."""

    number: int  # the passes that trained before this one
    batch: Any = None  # the samples read for this pass (an `online_rl.stream.Batch`)
    data: dict[str, Any] = field(default_factory=dict)  # what the nodes hand on, by name
    metrics: dict[str, float] = field(default_factory=dict)
    counts: bool = False  # the pass did a step's work: it counts towards `run(max_steps=...)`
    trained: bool = False  # the adapter changed (what `run(idle_exit_s=...)` waits for)
    stopping: bool = False  # the controller was asked to stop: a node may skip long work
    stopped_by: str | None = None  # the node that ended the pass early

    def stop(self) -> None:
        """End this pass after the current node (the nodes after it do not run)."""
        self.stopped_by = self.data.get("_node", "?")


KINDS = ("feedback", "rollout")


class Flow:
    """Named nodes run in order on every `Step`. `kind` is the built-in flow it extends (`feedback`:
    the trainer's data-parallel workers learn from users' samples; `rollout`: the hybrid workers learn
    from fresh rollouts), which decides the workers the controller starts."""

    def __init__(self, name: str, nodes: list[tuple[str, Node]] | None = None,
                 kind: str = "feedback") -> None:
        if kind not in KINDS:
            raise FlowError(f"flow {name!r}: kind={kind!r} is not one of {', '.join(KINDS)}")
        self.name, self.kind = name, kind
        self._nodes: list[tuple[str, Node]] = []
        for node_name, node in nodes or []:
            self.add(node_name, node)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._nodes]

    def __iter__(self) -> Iterator[tuple[str, Node]]:
        return iter(list(self._nodes))

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def __getitem__(self, name: str) -> Node:
        return self._nodes[self._index(name)][1]

    def __repr__(self) -> str:
        return f"Flow({self.name!r}, {self.kind}: {' → '.join(self.names)})"

    def _index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise FlowError(f"flow {self.name!r} has no node {name!r}; its nodes: {', '.join(self.names)}"
                            ) from None

    def add(self, name: str, node: Node, *, after: str | None = None, before: str | None = None) -> Flow:
        """Add `node` under `name`: after the node `after`, before the node `before`, or at the end."""
        if not name or not isinstance(name, str):
            raise FlowError(f"a node's name must be a non-empty string, not {name!r}")
        if name in self.names:
            raise FlowError(f"flow {self.name!r} already has a node {name!r}: use replace() to change it")
        if not callable(node):
            raise FlowError(f"node {name!r} is {node!r}, not callable: a node is a function node(step)")
        if after is not None and before is not None:
            raise FlowError(f"node {name!r}: give after= or before=, not both")
        at = len(self._nodes)
        if after is not None:
            at = self._index(after) + 1
        elif before is not None:
            at = self._index(before)
        self._nodes.insert(at, (name, node))
        return self

    def replace(self, name: str, node: Node) -> Flow:
        """Run `node` where the node `name` ran."""
        if not callable(node):
            raise FlowError(f"node {name!r} is {node!r}, not callable: a node is a function node(step)")
        self._nodes[self._index(name)] = (name, node)
        return self

    def remove(self, name: str) -> Flow:
        del self._nodes[self._index(name)]
        return self

    def run(self, step: Step) -> Step:
        """Run the nodes on `step` in order, until one stops the pass."""
        for name, node in list(self._nodes):
            step.data["_node"] = name
            start = time.perf_counter()
            try:
                node(step)
            finally:
                step.metrics[f"node_{name}_s"] = time.perf_counter() - start
            if step.stopped_by is not None:
                break
        step.data.pop("_node", None)
        return step
