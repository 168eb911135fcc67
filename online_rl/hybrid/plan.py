"""The resharding plan: which slice of which parameter each generation rank needs, and from whom.

Given the training layout (dp replicas × fsdp shards) and the generation layout (tensor-parallel size
tp), `plan_reshard` gives every device a generation role (engine replica, tensor-parallel rank) chosen
so that its generation shard overlaps its own training shard as much as possible — the
3D-HybridEngine's grouping: with training shards aligned to the generation splits and fsdp a multiple
of tp, rank r = (replica d, shard f) serves tensor-parallel rank f // (fsdp / tp), its generation
shard is the union of its own training shard and those of the fsdp/tp - 1 other ranks of its
"micro data-parallel group", and only those move: (fsdp - tp) / (tp * fsdp) of the weights per
device, where gathering the full weights moves (fsdp - 1) / fsdp.

Every piece comes from the training replica of the device that needs it, so traffic never leaves a
data-parallel replica. The plan is pure data; `online_rl.hybrid.engine` executes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from online_rl.errors import ConfigError
from online_rl.hybrid.layout import (
    Box,
    GenerationLayout,
    ParamSpec,
    TrainingLayout,
    box_numel,
    contains,
    intersect,
)

__all__ = [
    "Piece",
    "ReshardPlan",
    "Role",
    "allgather_bytes",
    "formula_allgather",
    "formula_hybrid",
    "plan_reshard",
]


@dataclass(frozen=True)
class Piece:
    """A slice of one parameter, in the parameter's full coordinates."""

    param: int  # index into the plan's specs
    box: Box


@dataclass(frozen=True)
class Role:
    replica: int  # which generation engine replica
    rank: int  # tensor-parallel rank inside it


@dataclass(frozen=True)
class ReshardPlan:
    specs: tuple[ParamSpec, ...]
    training: TrainingLayout
    generation: GenerationLayout
    roles: tuple[Role, ...]  # per device (global rank)
    local: tuple[tuple[Piece, ...], ...]  # per device: pieces it copies from its own training shard
    transfers: dict[tuple[int, int], tuple[Piece, ...]] = field(default_factory=dict)  # (src, dst)

    @property
    def world(self) -> int:
        return self.training.world

    def bytes_of(self, pieces: Sequence[Piece]) -> int:
        return sum(box_numel(p.box) * self.specs[p.param].itemsize for p in pieces)

    def received_bytes(self, rank: int) -> int:
        return sum(self.bytes_of(pieces) for (_, dst), pieces in self.transfers.items() if dst == rank)

    def sent_bytes(self, rank: int) -> int:
        return sum(self.bytes_of(pieces) for (src, _), pieces in self.transfers.items() if src == rank)

    @property
    def max_received_bytes(self) -> int:
        return max(self.received_bytes(r) for r in range(self.world))

    def generation_box(self, rank: int, param: int) -> Box:
        return self.specs[param].generation_box(self.generation.tp, self.roles[rank].rank)

    def training_box(self, rank: int, param: int) -> Box:
        return self.specs[param].training_box(self.training.fsdp, self.training.coords(rank)[1])

    def generation_bytes(self, rank: int) -> int:
        """What the device's generation copy weighs."""
        return sum(box_numel(self.generation_box(rank, i)) * s.itemsize for i, s in enumerate(self.specs))

    def redundant_bytes(self, rank: int) -> int:
        """Training-shard bytes that must stay beside the generation copy: those of parameters whose
        training shard is not inside the generation shard (0 when the layouts are aligned)."""
        return sum(box_numel(self.training_box(rank, i)) * s.itemsize for i, s in enumerate(self.specs)
                   if not contains(self.generation_box(rank, i), self.training_box(rank, i)))

    def replicas(self) -> list[list[int]]:
        """The devices of each generation engine replica, in tensor-parallel rank order."""
        out: dict[int, dict[int, int]] = defaultdict(dict)
        for device, role in enumerate(self.roles):
            out[role.replica][role.rank] = device
        return [[ranks[k] for k in sorted(ranks)] for _, ranks in sorted(out.items())]

    def peers(self, rank: int) -> tuple[list[int], list[int]]:
        """(devices this one sends to, devices it receives from), in rank order."""
        send = sorted(dst for (src, dst) in self.transfers if src == rank)
        recv = sorted(src for (src, dst) in self.transfers if dst == rank)
        return send, recv


def _assign(specs: Sequence[ParamSpec], training: TrainingLayout, tp: int) -> tuple[Role, ...]:
    """Generation roles that keep the most bytes local (greedy, tp ranks filled evenly)."""
    world = training.world
    overlap: list[tuple[int, int, int]] = []
    for device in range(world):
        shard = training.coords(device)[1]
        for k in range(tp):
            held = 0
            for spec in specs:
                piece = intersect(spec.training_box(training.fsdp, shard), spec.generation_box(tp, k))
                held += box_numel(piece) * spec.itemsize if piece else 0
            overlap.append((-held, device, k))
    capacity = dict.fromkeys(range(tp), world // tp)
    chosen: dict[int, int] = {}
    for _, device, k in sorted(overlap):
        if device not in chosen and capacity[k]:
            chosen[device] = k
            capacity[k] -= 1
    members: dict[int, list[int]] = defaultdict(list)
    for device in range(world):
        members[chosen[device]].append(device)
    roles: dict[int, Role] = {}
    for k, devices in members.items():
        for replica, device in enumerate(devices):
            roles[device] = Role(replica, k)
    return tuple(roles[d] for d in range(world))


def plan_reshard(specs: Sequence[ParamSpec], training: TrainingLayout, generation: GenerationLayout,
                 roles: Sequence[Role] | None = None) -> ReshardPlan:
    """The plan that moves `specs` from `training` to `generation` (see the module's description).
    `roles`: given (e.g. the base's plan's, for its adapter), not chosen."""
    tp, world = generation.tp, training.world
    if world % tp:
        raise ConfigError(f"hybrid.tp={tp} must divide the {world} training ranks (hybrid.dp {training.dp} × "
                          f"hybrid.fsdp {training.fsdp}) so that every device serves in one engine replica")
    for spec in specs:
        spec.check_training(training.fsdp)
    roles = tuple(roles) if roles is not None else _assign(specs, training, tp)
    if len(roles) != world:
        raise ValueError(f"{len(roles)} generation roles given for {world} devices")
    local: list[list[Piece]] = [[] for _ in range(world)]
    transfers: dict[tuple[int, int], list[Piece]] = defaultdict(list)
    for device in range(world):
        replica, own = training.coords(device)
        for index, spec in enumerate(specs):
            need = spec.generation_box(tp, roles[device].rank)
            for shard in range(training.fsdp):
                piece = intersect(need, spec.training_box(training.fsdp, shard))
                if piece is None:
                    continue
                if shard == own:
                    local[device].append(Piece(index, piece))
                else:
                    transfers[(training.rank(replica, shard), device)].append(Piece(index, piece))
    return ReshardPlan(tuple(specs), training, generation, roles, tuple(tuple(p) for p in local),
                       {key: tuple(value) for key, value in transfers.items()})


def allgather_bytes(specs: Sequence[ParamSpec], training: TrainingLayout) -> int:
    """Bytes one device receives when it all-gathers the full weights from its FSDP group."""
    total = 0
    for spec in specs:
        own = box_numel(spec.training_box(training.fsdp, 0)) * spec.itemsize
        total += spec.nbytes - own
    return total


def formula_hybrid(model_bytes: int, train_shards: int, generation_shards: int) -> float:
    """HybridFlow's per-device transition traffic: (tp - t_g·p_g) / (t_g·p_g·tp) · M (0 when the
    generation shard is inside the training shard)."""
    return max(0.0, (train_shards - generation_shards) / (generation_shards * train_shards)) * model_bytes


def formula_allgather(model_bytes: int, shards: int) -> float:
    """All-gathering the full weights over `shards` ranks: (n - 1) / n · M per device."""
    return (shards - 1) / shards * model_bytes
