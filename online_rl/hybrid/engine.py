"""Executing a resharding plan on one device, with torch.distributed point-to-point messages.

Every device posts one receive per peer it needs pieces from and one send per peer that needs its
pieces (each message the pieces packed back to back, in plan order), copies its own pieces locally,
and unpacks what arrives into its generation shards. Gloo on CPU, NCCL on GPU; the same code.
`allgather` is the baseline: gather every parameter's full tensor from the FSDP group, then cut the
generation shard out of it (what loading a full state dict into a tensor-parallel engine does).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from online_rl.hybrid.layout import Box, box_numel
from online_rl.hybrid.plan import Piece, ReshardPlan

__all__ = ["Resharder", "TransitionStats", "cut"]


@dataclass(frozen=True)
class TransitionStats:
    seconds: float
    received_bytes: int
    sent_bytes: int
    peak_extra_bytes: int  # transient buffers beyond the generation shards (messages, gathered tensors)


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
                                    plan.sent_bytes(rank), extra)

    def _pack(self, pieces: Sequence[Piece], shards: Sequence[torch.Tensor]) -> torch.Tensor:
        parts = [cut(shards[p.param], self.plan.training_box(self.rank, p.param), p.box).reshape(-1)
                 for p in pieces]
        return torch.cat(parts) if parts else torch.empty(0)

    def _place(self, out: list[torch.Tensor], piece: Piece, values: torch.Tensor) -> None:
        cut(out[piece.param], self.plan.generation_box(self.rank, piece.param), piece.box).copy_(values)

    def allgather(self, shards: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], TransitionStats]:
        """The baseline: all-gather each full parameter over the FSDP group, keep the generation shard."""
        start = time.perf_counter()
        plan, rank = self.plan, self.rank
        fsdp = plan.training.fsdp
        out: list[torch.Tensor] = []
        received = peak = 0
        for index, (spec, shard) in enumerate(zip(plan.specs, shards, strict=True)):
            dim = spec.train_dim
            if fsdp == 1:
                full = shard
            else:
                step = -(-spec.shape[dim] // fsdp)
                padded_shape = list(spec.shape)
                padded_shape[dim] = step
                padded = shard.new_zeros(padded_shape)
                padded.narrow(dim, 0, shard.shape[dim]).copy_(shard)
                gathered = [torch.empty_like(padded) for _ in range(fsdp)]
                dist.all_gather(gathered, padded.contiguous(), group=self.fsdp_group)
                full = torch.cat(gathered, dim=dim).narrow(dim, 0, spec.shape[dim])
                received += (fsdp - 1) * padded.numel() * padded.element_size()
                peak = max(peak, 2 * full.numel() * full.element_size())
            out.append(cut(full, spec.full(), plan.generation_box(rank, index)).clone())
        return out, TransitionStats(time.perf_counter() - start, received, received, peak)
