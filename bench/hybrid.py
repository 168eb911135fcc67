"""HybridEngine benchmark: what one training → generation transition moves and how long it takes under
our resharding plan, against the bucketed all-gather a practitioner would write, next to the
HybridFlow paper's formulas; and what the LoRA-only sync moves.

    deploy/local/env.sh .venv/bin/python bench/hybrid.py [--fsdp 4] [--tp 2] [--rounds 3] [--smoke]

1. **Planned bytes on the embedded model** (SmolLM2-135M-Instruct's real parameter shapes, float32;
   no weights loaded): for several training layouts (dp × fsdp) and tensor-parallel sizes (9 heads,
   3 key/value heads, MLP 1536: tp 1 or 3), the most any device receives under our plan and under an
   all-gather of the full weights over its FSDP group, with the paper's formulas: ours
   (tp − t_g·p_g)/(t_g·p_g·tp)·M with tp := fsdp and t_g·p_g := generation tp, the all-gather
   (n − 1)/n·M; and the memory left redundant during generation (training shards not inside the
   generation copy).
2. **Measured on real Ray workers** (gloo, CPU): a random Llama with the embedded tokenizer (4 layers,
   hidden 512: ~35M parameters; `--smoke`: 1 layer, hidden 64) trained as `--fsdp` FSDP2 shards and
   generating at `--tp`. Each transition reshards the whole base model (`keep_base=False`) with one of
   two methods, on the same workers, alternated over `--rounds` (A B, B A, ...):
   - *hybrid*: our plan, one packed message per peer that holds a piece this device needs
     (`hybrid_messages`: the most sends and receives one device posts);
   - *allgather*: each device's training shards flattened into buckets of 25 MiB
     (`Resharder.allgather`), one `all_gather_single` per bucket over the FSDP group, then each device
     slices its tensor-parallel shards out of the gathered buffers: the full model in few collectives
     (`allgather_collectives`).
   Bytes (`hybrid_mb`, `allgather_mb`, their ratio `bytes_vs_allgather`) are what the busiest device
   receives.
   The time of a transition is the slowest device's time inside the resharder (collectives, packing
   and slicing; building the engine is left out, being the same for both). `time_vs_allgather` is the
   median of the per-round ratios hybrid ÷ allgather, with their range. After every transition each
   device's tensor-parallel shards (base and adapter) are fetched and compared, tensor by tensor, with
   those of the first transition, which are checked against the full trained weights: any difference
   fails the run.
3. **LoRA-only sync**: after the base is synced once, each transition moves only the adapter
   (r=8 on q, k, v, o by default): its bytes over the full weights' (`lora_sync_fraction`, as planned
   for the embedded model; `lora_sync_fraction_measured` on the workers), and its time per round.

Ray is told the machine's real core count (`os.cpu_count()`); when the workers outnumber the cores,
each reserves a fraction of a CPU and they time-share the cores (the line before the figures says so).
Timed figures are `spread`s: {"median", "min", "max", "rounds"}. The last line is one JSON object with
every name of `FIELDS`: the measured figures, the `planned` table, the machine, and `smoke` (true for
the tiny `--smoke` run, whose figures are only a check that everything is printed).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import alternated, emit, missing_fields, spread

LAYOUTS = [(1, 3, 3), (1, 6, 3), (1, 12, 3), (2, 6, 3), (1, 4, 1), (1, 8, 1)]
METHODS = ("hybrid", "allgather")
FIELDS: tuple[str, ...] = (
    "smoke", "layout", "model_mb", "rounds", "cores", "cpus_per_worker",
    "bytes_vs_allgather", "hybrid_mb", "allgather_mb", "hybrid_messages", "allgather_collectives",
    "time_vs_allgather", "hybrid_s", "allgather_s", "shards_compared",
    "lora_sync_fraction", "lora_sync_fraction_measured", "lora_sync_mb", "lora_sync_s",
    "adapter_mb", "redundant_mb", "planned", "machine",
)


def planned(model_dir: Path, lora_rank: int, targets: list[str]) -> tuple[list[dict[str, Any]], float]:
    """Per layout of `LAYOUTS`, the planned traffic on the embedded model's shapes; and the adapter's
    share of the weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from online_rl.algos.policy import LoraSpec, lora_policy
    from online_rl.hybrid import (
        GenerationLayout,
        TrainingLayout,
        allgather_bytes,
        formula_allgather,
        formula_hybrid,
        llama_specs,
        plan_reshard,
    )

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        spec = LoraSpec(rank=lora_rank, targets=targets)
        policy = lora_policy(AutoModelForCausalLM.from_config(config), spec)
    named = list(policy.named_parameters())
    base = llama_specs([(n, p.shape) for n, p in named if not p.requires_grad], config)
    lora = llama_specs([(n, p.shape) for n, p in named if p.requires_grad], config)
    size = sum(s.nbytes for s in base)
    rows = []
    for dp, fsdp, tp in LAYOUTS:
        training = TrainingLayout(dp, fsdp)
        plan = plan_reshard(base, training, GenerationLayout(tp))
        naive = plan_reshard(llama_specs([(s.name, s.shape) for s in base], config, aligned=False), training,
                             GenerationLayout(tp))
        rows.append({
            "layout": f"dp{dp}-fsdp{fsdp}-tp{tp}", "model_mb": size / 1e6,
            "ours_mb": plan.max_received_bytes / 1e6, "paper_ours_mb": formula_hybrid(size, fsdp, tp) / 1e6,
            "allgather_mb": allgather_bytes(base, training) / 1e6,
            "paper_allgather_mb": formula_allgather(size, fsdp) / 1e6,
            "ours_vs_allgather": plan.max_received_bytes / max(1, allgather_bytes(base, training)),
            "redundant_mb": max(plan.redundant_bytes(r) for r in range(training.world)) / 1e6,
            "redundant_mb_dim0_fsdp": max(naive.redundant_bytes(r) for r in range(training.world)) / 1e6,
            "allgather_redundant_mb": size / fsdp / 1e6,  # the training shard beside a full copy
        })
    return rows, sum(s.nbytes for s in lora) / size


def cpu_share(workers: int) -> tuple[int, float]:
    """The machine's cores (all Ray is told about) and the CPUs each worker reserves: one, or an equal
    share (rounded down to 1/1000, so Ray can place them all) when the workers outnumber the cores."""
    cores = os.cpu_count() or 1
    return cores, min(1.0, math.floor(cores / workers * 1000) / 1000)


def _shards_of(group: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every device's generation shards (base and adapter, by name), and its role."""
    devices = group.generation_shards()
    return ([d["base"] | d["adapter"] for d in devices],
            [{"tp": d["tp"], "tp_rank": d["tp_rank"]} for d in devices])


def _check_against_weights(full: dict[str, Any], shards: list[dict[str, Any]], roles: list[dict[str, Any]],
                           model_dir: Path) -> None:
    """Every device's generation shards are the exact slices of the full trained weights (`full`)."""
    import torch
    from transformers import AutoConfig

    from online_rl.hybrid import llama_specs
    from online_rl.hybrid.engine import cut

    config = AutoConfig.from_pretrained(model_dir)
    for device, (tensors, role) in enumerate(zip(shards, roles, strict=True)):
        for name, tensor in tensors.items():
            spec = llama_specs([(name, full[name].shape)], config)[0]
            expected = cut(full[name], spec.full(), spec.generation_box(role["tp"], role["tp_rank"]))
            if not torch.equal(tensor, expected):
                raise SystemExit(f"device {device}: its generation shard of {name} is not the slice of the "
                                 "trained weights: the resharding is wrong, and no figure is reported")


def _compare(reference: list[dict[str, Any]], shards: list[dict[str, Any]], method: str) -> int:
    """Fail unless every device's shards equal the reference's; the number of tensors compared."""
    import torch

    compared = 0
    for device, (want, got) in enumerate(zip(reference, shards, strict=True)):
        if set(want) != set(got):
            odd = sorted(set(got) ^ set(want))
            raise SystemExit(f"{method}: device {device} holds tensors {odd} that the other method does not")
        for name, tensor in want.items():
            if not torch.equal(tensor, got[name]):
                raise SystemExit(f"{method}: device {device}'s generation shard of {name} differs from the "
                                 "other method's: the two transitions are not the same, no ratio is reported")
            compared += 1
    return compared


def _transitions(group: Any, rounds: int, model_dir: Path) -> dict[str, Any]:
    """Full-base transitions by each method, alternated over `rounds`, each checked."""
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    received: dict[str, int] = {}
    collectives: dict[str, int] = {}
    reference: list[dict[str, Any]] | None = None
    compared = 0
    full = group.full_weights()  # in training mode: a transition without keep_base frees shards
    for order in alternated(rounds, METHODS):
        for method in order:
            stats = group.to_generation(method=method, keep_base=False)
            times[method].append(max(s["base"]["seconds"] for s in stats))
            received[method] = max(s["base"]["received_bytes"] for s in stats)
            collectives[method] = max(s["base"]["collectives"] for s in stats)
            shards, roles = _shards_of(group)
            if reference is None:
                _check_against_weights(full, shards, roles, model_dir)
                reference = shards
            else:
                compared += _compare(reference, shards, method)
            group.to_training()
    ratios = [h / a for h, a in zip(times["hybrid"], times["allgather"], strict=True)]
    return {"times": times, "received": received, "collectives": collectives, "ratios": ratios,
            "compared": compared}


def measured(args: argparse.Namespace, targets: list[str]) -> dict[str, Any]:
    import ray

    from online_rl.algos.policy import LoraSpec
    from online_rl.config import load_settings
    from online_rl.hybrid.group import HybridGroup
    from online_rl.models import build_tiny_llama, prepare_embedded_model
    from online_rl.trainer.spec import HybridSpec, ModelSpec

    tokenizer = prepare_embedded_model(load_settings().model_dir).path
    cores, cpus = cpu_share(args.fsdp)
    if args.fsdp > cores:
        print(f"{args.fsdp} workers on {cores} cores: each reserves {cpus} CPU, and they time-share the "
              "cores", flush=True)
    ray.init(num_cpus=cores, include_dashboard=False, logging_level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="orl-bench-hybrid-") as tmp:
        model = build_tiny_llama(Path(tmp) / "model", tokenizer, seed=0, hidden_size=args.hidden,
                                 num_layers=args.layers)
        lora = LoraSpec(rank=args.lora_rank, alpha=2 * args.lora_rank, targets=tuple(targets))
        spec = HybridSpec(ModelSpec(str(model), lora, seed=0, precision="fp32"), learning_rate=1e-4, epochs=1)
        group = HybridGroup(spec, dp=1, fsdp=args.fsdp, tp=args.tp, cpus_per_worker=cpus)
        try:
            run = _transitions(group, args.rounds, model)
            group.to_generation(keep_base=True)  # the LoRA path: the base once, then the adapter alone
            adapter = [group.to_generation(keep_base=True) for _ in range(args.rounds)]
            group.to_training()
            summary = group.plan_summary()
        finally:
            group.close()
            ray.shutdown()
    model_bytes = summary["model_bytes"]
    lora_bytes = max(s["adapter"]["received_bytes"] for s in adapter[-1])
    hybrid, allgather = run["received"]["hybrid"], run["received"]["allgather"]
    return {"layout": f"dp1-fsdp{args.fsdp}-tp{args.tp}", "model_mb": model_bytes / 1e6, "cores": cores,
            "cpus_per_worker": cpus, "rounds": args.rounds,
            "hybrid_mb": hybrid / 1e6, "allgather_mb": allgather / 1e6,
            "bytes_vs_allgather": hybrid / allgather if allgather else None,
            "hybrid_messages": run["collectives"]["hybrid"],
            "allgather_collectives": run["collectives"]["allgather"],
            "hybrid_s": spread(run["times"]["hybrid"], 4),
            "allgather_s": spread(run["times"]["allgather"], 4),
            "time_vs_allgather": spread(run["ratios"]), "shards_compared": run["compared"],
            "lora_sync_mb": lora_bytes / 1e6,
            "lora_sync_s": spread([max(s["adapter"]["seconds"] for s in a) for a in adapter], 4),
            "lora_sync_fraction_measured": lora_bytes / model_bytes,
            "adapter_mb": summary["adapter_bytes"] / 1e6,
            "redundant_mb": max(summary["redundant_bytes"]) / 1e6}


def _print_planned(rows: list[dict[str, Any]], lora_rank: int, targets: list[str], fraction: float) -> None:
    print("planned, SmolLM2-135M-Instruct (fp32), MB received per device at each transition:")
    print(f"{'layout':<16}{'ours':>9}{'paper':>9}{'allgather':>11}{'paper':>9}{'ratio':>8}{'redundant':>11}"
          f"{'(dim-0 fsdp)':>14}")
    for r in rows:
        print(f"{r['layout']:<16}{r['ours_mb']:>9.2f}{r['paper_ours_mb']:>9.2f}{r['allgather_mb']:>11.2f}"
              f"{r['paper_allgather_mb']:>9.2f}{r['ours_vs_allgather']:>8.3f}{r['redundant_mb']:>11.2f}"
              f"{r['redundant_mb_dim0_fsdp']:>14.2f}")
    print(f"LoRA r={lora_rank} on {','.join(targets)}: {fraction:.2%} of the weights")


def _print_measured(run: dict[str, Any]) -> None:
    def ms(figure: dict[str, Any]) -> str:
        return f"{figure['median'] * 1000:.1f} ms [{figure['min'] * 1000:.1f}, {figure['max'] * 1000:.1f}]"

    ratio = run["time_vs_allgather"]
    print(f"measured, {run['layout']} on Ray workers ({run['model_mb']:.1f} MB model, {run['rounds']} "
          f"alternated rounds, median [range]): ours {run['hybrid_mb']:.2f} MB in {run['hybrid_messages']} "
          f"messages, {ms(run['hybrid_s'])}; bucketed all-gather {run['allgather_mb']:.2f} MB in "
          f"{run['allgather_collectives']} collectives, {ms(run['allgather_s'])}; "
          f"time x{ratio['median']:.3f} [{ratio['min']:.3f}, {ratio['max']:.3f}]; "
          f"{run['shards_compared']} tensors identical across methods")
    print(f"LoRA-only sync {run['lora_sync_mb']:.3f} MB ({run['lora_sync_fraction_measured']:.2%}) in "
          f"{ms(run['lora_sync_s'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp", type=int, default=None, help="training shards (default 4; smoke 2)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel size of generation")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of the two methods")
    parser.add_argument("--hidden", type=int, default=None, help="hidden size (default 512; smoke 64)")
    parser.add_argument("--layers", type=int, default=None, help="layers (default 4; smoke 1)")
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that every field is printed")
    args = parser.parse_args()
    args.fsdp = args.fsdp or (2 if args.smoke else 4)
    args.hidden = args.hidden or (64 if args.smoke else 512)
    args.layers = args.layers or (1 if args.smoke else 4)
    targets = args.targets.split(",")

    from online_rl.config import load_settings
    from online_rl.models import prepare_embedded_model

    embedded = prepare_embedded_model(load_settings().model_dir).path
    rows, lora_fraction = planned(embedded, args.lora_rank, targets)
    _print_planned(rows, args.lora_rank, targets, lora_fraction)
    run = measured(args, targets)
    _print_measured(run)
    result = {"smoke": args.smoke, "lora_sync_fraction": lora_fraction, **run, "planned": rows}
    missing = missing_fields(result | {"machine": None}, FIELDS)
    if missing:
        raise SystemExit(f"the result lacks the documented fields {missing}")
    emit(result, "fp32")


if __name__ == "__main__":
    main()
