"""Executing a resharding plan on one device, with torch.distributed point-to-point messages.

Every device posts one receive per peer it needs pieces from and one send per peer that needs its
pieces (each message the pieces packed back to back, in plan order), copies its own pieces locally,
and unpacks what arrives into its generation shards. Gloo on CPU, NCCL on GPU; the same code.
`allgather` is the baseline a practitioner would write: the training shards flattened into buckets,
one all-gather per bucket over the FSDP group (every device receives the full weights, in few
collectives), then each device slices its generation shard out of what arrived.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from online_rl.hybrid.layout import Box, box_numel, intersect
from online_rl.hybrid.plan import Piece, ReshardPlan

__all__ = ["Resharder", "TransitionStats", "cut"]


@dataclass(frozen=True)
class TransitionStats:
    seconds: float
    received_bytes: int
    sent_bytes: int
    peak_extra_bytes: int  # transient buffers beyond the generation shards (messages, gathered tensors)
    collectives: int = 0  # point-to-point messages posted, or all-gathers issued


def cut(tensor: torch.Tensor, held: Box, box: Box) -> torch.Tensor:
    """The view of `box` (full coordinates) inside `tensor`, which holds `held`."""
    index = tuple(slice(b0 - h0, b1 - h0) for (b0, b1), (h0, _) in zip(box, held, strict=True))
    return tensor[index]


class Resharder:
    """One device's part of a plan; every device of the plan's world runs it at the same time."""

    def __init__(self, plan: ReshardPlan, rank: int, fsdp_group: Any = None) -> None:
        self.plan = plan
        self.rank = rank
        self.fsdp_group = fsdp_group  # this device's FSDP group, for the all-gather baseline
        self.send, self.recv = plan.peers(rank)

    def _shapes(self) -> list[tuple[int, ...]]:
        boxes = [self.plan.generation_box(self.rank, i) for i in range(len(self.plan.specs))]
        return [tuple(b - a for a, b in box) for box in boxes]

    def reshard(self, shards: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], TransitionStats]:
        """This device's generation shards from every device's training shards (`shards`: its own,
        in plan order, each exactly its training box)."""
        start = time.perf_counter()
        plan, rank = self.plan, self.rank
        dtype, device = shards[0].dtype, shards[0].device
        inbox: dict[int, torch.Tensor] = {}
        ops: list[Any] = []
        for src in self.recv:
            numel = sum(box_numel(p.box) for p in plan.transfers[(src, rank)])
            inbox[src] = torch.empty(numel, dtype=dtype, device=device)
            ops.append(dist.P2POp(dist.irecv, inbox[src], src))
        outbox = []
        for dst in self.send:
            message = self._pack(plan.transfers[(rank, dst)], shards)
            outbox.append(message)
            ops.append(dist.P2POp(dist.isend, message, dst))
        # one batch: NCCL needs a pair's sends and receives posted together (gloo takes them one by one)
        requests = dist.batch_isend_irecv(ops) if ops else []
        out = [torch.empty(shape, dtype=dtype, device=device) for shape in self._shapes()]
        for piece in plan.local[rank]:
            self._place(out, piece, cut(shards[piece.param], plan.training_box(rank, piece.param), piece.box))
        for request in requests:
            request.wait()
        for src, message in inbox.items():
            offset = 0
            for piece in plan.transfers[(src, rank)]:
                n = box_numel(piece.box)
                shape = tuple(b - a for a, b in piece.box)
                self._place(out, piece, message[offset:offset + n].view(shape))
                offset += n
        extra = sum(m.numel() * m.element_size() for m in [*inbox.values(), *outbox])
        return out, TransitionStats(time.perf_counter() - start, plan.received_bytes(rank),
                                    plan.sent_bytes(rank), extra, len(ops))

    def _pack(self, pieces: Sequence[Piece], shards: Sequence[torch.Tensor]) -> torch.Tensor:
        parts = [cut(shards[p.param], self.plan.training_box(self.rank, p.param), p.box).reshape(-1)
                 for p in pieces]
        return torch.cat(parts) if parts else torch.empty(0)

    def _place(self, out: list[torch.Tensor], piece: Piece, values: torch.Tensor) -> None:
        cut(out[piece.param], self.plan.generation_box(self.rank, piece.param), piece.box).copy_(values)

    def _buckets(self, bucket_bytes: int) -> list[list[int]]:
        """Consecutive parameters grouped so that a device's shards of a bucket stay under `bucket_bytes`
        (a parameter whose shard alone is bigger makes a bucket of its own)."""
        fsdp = self.plan.training.fsdp
        buckets: list[list[int]] = [[]]
        size = 0
        for index, spec in enumerate(self.plan.specs):
            nbytes = -(-spec.nbytes // fsdp)
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(index)
            size += nbytes
        return buckets

    def allgather(self, shards: Sequence[torch.Tensor],
                  bucket_bytes: int = 25 * 2**20) -> tuple[list[torch.Tensor], TransitionStats]:
        """The baseline: per bucket of parameters (`bucket_bytes` of shards per device, DDP's default),
        each device's shards flattened into one buffer (padded to the largest device's), one all-gather
        of the buffers over the FSDP group, then this device's generation shards sliced out of the
        gathered training shards."""
        start = time.perf_counter()
        plan, rank = self.plan, self.rank
        fsdp = plan.training.fsdp
        own = plan.training.coords(rank)[1]
        dtype, device = shards[0].dtype, shards[0].device
        itemsize = shards[0].element_size()
        out = [torch.empty(shape, dtype=dtype, device=device) for shape in self._shapes()]
        received = peak = collectives = 0
        for bucket in self._buckets(bucket_bytes):
            held = [[plan.specs[i].training_box(fsdp, f) for i in bucket] for f in range(fsdp)]
            width = max(sum(box_numel(box) for box in boxes) for boxes in held)
            flat = torch.zeros(width, dtype=dtype, device=device)
            offset = 0
            for i, box in zip(bucket, held[own], strict=True):
                n = box_numel(box)
                assert shards[i].numel() == n, plan.specs[i].name  # the shard is exactly its training box
                flat[offset:offset + n].view(shards[i].shape).copy_(shards[i])
                offset += n
            if fsdp > 1:
                gathered = torch.empty(fsdp * width, dtype=dtype, device=device)
                dist.all_gather_single(gathered, flat, group=self.fsdp_group)
                collectives += 1
                received += (fsdp - 1) * width * itemsize
                peak = max(peak, (fsdp + 1) * width * itemsize)
            else:
                gathered = flat
            for f, boxes in enumerate(held):  # slice out what this device serves with
                offset = f * width
                for i, box in zip(bucket, boxes, strict=True):
                    n = box_numel(box)
                    piece = intersect(plan.generation_box(rank, i), box)
                    if piece is not None:
                        values = gathered[offset:offset + n].view(tuple(b - a for a, b in box))
                        self._place(out, Piece(i, piece), cut(values, box, piece))
                    offset += n
        return out, TransitionStats(time.perf_counter() - start, received, received, peak, collectives)
