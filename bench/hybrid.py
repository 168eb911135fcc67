"""HybridEngine benchmark: bytes moved and time per training → generation transition, our plan vs a
naive all-gather of the full weights, next to the HybridFlow paper's formulas; and the LoRA-only sync.

    deploy/local/env.sh .venv/bin/python bench/hybrid.py [--fsdp 4] [--tp 2] [--repeats 3]

1. **Planned bytes on the embedded model** (SmolLM2-135M-Instruct's real parameter shapes, float32;
   no weights loaded): for several training layouts (dp × fsdp) and tensor-parallel sizes (9 heads,
   3 key/value heads, MLP 1536: tp 1 or 3), the most any device receives under our plan and under an
   all-gather of the full weights over its FSDP group, with the paper's formulas: ours
   (tp − t_g·p_g)/(t_g·p_g·tp)·M with tp := fsdp and t_g·p_g := generation tp, the all-gather
   (n − 1)/n·M; and the memory left redundant during generation (training shards not inside the
   generation copy).
2. **Measured on real Ray workers** (gloo): a random Llama with the embedded tokenizer (4 layers,
   hidden 512: ~38M parameters) trained as `--fsdp` FSDP2 shards and generating at `--tp`; each
   transition (reshard the whole model; `keep_base=False`, so each is complete) is timed `--repeats`
   times per method on the same workers, in alternation; bytes are what each device received.
3. **LoRA-only sync**: after the base is synced once, each transition moves only the adapter
   (r=8 on q, k, v, o by default): its bytes over the full weights' (`lora_sync_fraction`, both as
   planned for the embedded model and as measured on the workers).

The last line is one JSON object: `bytes_vs_allgather` (ours ÷ naive, measured), `time_vs_allgather`,
`lora_sync_fraction` (embedded model, whole adapter ÷ whole model), the per-layout table and the
measured figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit

LAYOUTS = [(1, 3, 3), (1, 6, 3), (1, 12, 3), (2, 6, 3), (1, 4, 1), (1, 8, 1)]


def planned(model_dir: Path, lora_rank: int, targets: list[str]) -> tuple[list[dict[str, Any]], float]:
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


def measured(fsdp: int, tp: int, repeats: int, lora_rank: int, targets: list[str]) -> dict[str, Any]:
    import ray

    from online_rl.config import load_settings
    from online_rl.hybrid.group import HybridGroup
    from online_rl.models import build_tiny_llama, prepare_embedded_model

    settings = load_settings()
    tokenizer = prepare_embedded_model(settings.model_dir).path
    ray.init(num_cpus=fsdp, include_dashboard=False, logging_level="WARNING")
    with tempfile.TemporaryDirectory(prefix="orl-bench-hybrid-") as tmp:
        model = build_tiny_llama(Path(tmp) / "model", tokenizer, seed=0, hidden_size=512, num_layers=4)
        config = {"seed": 0, "lora_rank": lora_rank, "lora_alpha": 2 * lora_rank, "lora_targets": targets,
                  "learning_rate": 1e-4, "ppo_epochs": 1, "kl_coef": 0.05, "kl_target": None}
        group = HybridGroup(str(model), config, dp=1, fsdp=fsdp, tp=tp, cpus_per_worker=1.0)
        try:
            times: dict[str, list[float]] = {"hybrid": [], "allgather": []}
            received: dict[str, int] = {}
            for _ in range(repeats):
                for method in ("hybrid", "allgather"):
                    stats = group.to_generation(method=method, keep_base=False)
                    times[method].append(max(s["base"]["seconds"] for s in stats))
                    received[method] = max(s["base"]["received_bytes"] for s in stats)
                    group.to_training()
            # the LoRA path: base once, then adapter-only transitions
            group.to_generation(keep_base=True)
            group.to_training()
            adapter = [group.to_generation(keep_base=True) for _ in range(repeats)]
            group.to_training()
            summary = group.plan_summary()
        finally:
            group.close()
            ray.shutdown()
    lora_s = statistics.median(max(s["adapter"]["seconds"] for s in a) for a in adapter)
    lora_bytes = max(s["adapter"]["received_bytes"] for s in adapter[-1])
    hybrid_s, allgather_s = statistics.median(times["hybrid"]), statistics.median(times["allgather"])
    return {"layout": f"dp1-fsdp{fsdp}-tp{tp}", "model_mb": summary["model_bytes"] / 1e6,
            "hybrid_mb": received["hybrid"] / 1e6, "allgather_mb": received["allgather"] / 1e6,
            "bytes_vs_allgather": received["hybrid"] / received["allgather"],
            "hybrid_s": hybrid_s, "allgather_s": allgather_s, "time_vs_allgather": hybrid_s / allgather_s,
            "lora_sync_mb": lora_bytes / 1e6, "lora_sync_s": lora_s,
            "lora_sync_fraction_measured": lora_bytes / summary["model_bytes"],
            "adapter_mb": summary["adapter_bytes"] / 1e6,
            "redundant_mb": max(summary["redundant_bytes"]) / 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fsdp", type=int, default=4)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lora-rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,k_proj,v_proj,o_proj")
    args = parser.parse_args()
    targets = args.targets.split(",")

    from online_rl.config import load_settings
    from online_rl.models import prepare_embedded_model

    embedded = prepare_embedded_model(load_settings().model_dir).path
    rows, lora_fraction = planned(embedded, args.lora_rank, targets)
    print("planned, SmolLM2-135M-Instruct (fp32), MB received per device at each transition:")
    print(f"{'layout':<16}{'ours':>9}{'paper':>9}{'allgather':>11}{'paper':>9}{'ratio':>8}{'redundant':>11}"
          f"{'(dim-0 fsdp)':>14}")
    for r in rows:
        print(f"{r['layout']:<16}{r['ours_mb']:>9.2f}{r['paper_ours_mb']:>9.2f}{r['allgather_mb']:>11.2f}"
              f"{r['paper_allgather_mb']:>9.2f}{r['ours_vs_allgather']:>8.3f}{r['redundant_mb']:>11.2f}"
              f"{r['redundant_mb_dim0_fsdp']:>14.2f}")
    print(f"LoRA r={args.lora_rank} on {','.join(targets)}: {lora_fraction:.2%} of the weights")
    run = measured(args.fsdp, args.tp, args.repeats, args.lora_rank, targets)
    print(f"measured on {args.fsdp} Ray workers ({run['model_mb']:.0f} MB model), {run['layout']}: ours "
          f"{run['hybrid_mb']:.1f} MB in {run['hybrid_s'] * 1000:.0f} ms vs all-gather "
          f"{run['allgather_mb']:.1f} MB "
          f"in {run['allgather_s'] * 1000:.0f} ms: bytes x{run['bytes_vs_allgather']:.3f}, "
          f"time x{run['time_vs_allgather']:.3f}; LoRA-only sync {run['lora_sync_mb']:.3f} MB "
          f"({run['lora_sync_fraction_measured']:.2%}) in {run['lora_sync_s'] * 1000:.1f} ms")
    emit({"bytes_vs_allgather": run["bytes_vs_allgather"], "time_vs_allgather": run["time_vs_allgather"],
          "lora_sync_fraction": lora_fraction,
          "lora_sync_fraction_measured": run["lora_sync_fraction_measured"],
          "measured": run, "planned": rows})


if __name__ == "__main__":
    main()
