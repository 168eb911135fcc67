"""The resharding plan, as pure data: complete, local where it can be, and the paper's traffic."""

from __future__ import annotations

import itertools

import pytest
from transformers import LlamaConfig

from online_rl.errors import ConfigError
from online_rl.hybrid import (
    GenerationLayout,
    TrainingLayout,
    allgather_bytes,
    formula_allgather,
    formula_hybrid,
    llama_specs,
    plan_reshard,
)
from online_rl.hybrid.layout import box_numel, intersect

CONFIG = LlamaConfig(vocab_size=96, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                     num_attention_heads=12, num_key_value_heads=2, head_dim=4, tie_word_embeddings=True)


def _shapes() -> list[tuple[str, tuple[int, ...]]]:
    h, i, kv = 48, 96, 2 * 4
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (96, h))]
    for layer in range(2):
        p = f"model.layers.{layer}"
        out += [(f"{p}.self_attn.q_proj.weight", (h, h)), (f"{p}.self_attn.k_proj.weight", (kv, h)),
                (f"{p}.self_attn.v_proj.weight", (kv, h)), (f"{p}.self_attn.o_proj.weight", (h, h)),
                (f"{p}.mlp.gate_proj.weight", (i, h)), (f"{p}.mlp.up_proj.weight", (i, h)),
                (f"{p}.mlp.down_proj.weight", (h, i)), (f"{p}.input_layernorm.weight", (h,)),
                (f"{p}.post_attention_layernorm.weight", (h,))]
    return [*out, ("model.norm.weight", (h,))]


LAYOUTS = [(1, 2, 2), (2, 2, 2), (1, 4, 2), (1, 6, 2), (2, 3, 2), (1, 4, 4), (2, 1, 2), (1, 3, 1), (1, 8, 4)]


@pytest.mark.parametrize(("dp", "fsdp", "tp"), LAYOUTS)
@pytest.mark.parametrize("aligned", [True, False])
def test_every_generation_shard_is_tiled_exactly_once_from_its_own_replica(
        dp: int, fsdp: int, tp: int, aligned: bool) -> None:
    specs = llama_specs(_shapes(), CONFIG, aligned=aligned)
    training = TrainingLayout(dp, fsdp)
    plan = plan_reshard(specs, training, GenerationLayout(tp))
    assert sorted((r.replica, r.rank) for r in plan.roles) == sorted(
        itertools.product(range(training.world // tp), range(tp)))
    for device in range(training.world):
        incoming = [(device, p) for p in plan.local[device]]
        incoming += [(src, p) for (src, dst), pieces in plan.transfers.items() if dst == device
                     for p in pieces]
        for src, piece in incoming:  # every piece comes from its source's own training shard, same replica
            assert training.coords(src)[0] == training.coords(device)[0]
            held = plan.training_box(src, piece.param)
            assert intersect(held, piece.box) == piece.box
        for index in range(len(specs)):
            need = plan.generation_box(device, index)
            pieces = [p.box for _, p in incoming if p.param == index]
            assert sum(box_numel(b) for b in pieces) == box_numel(need)  # covered ...
            for a, b in itertools.combinations(pieces, 2):
                assert intersect(a, b) is None  # ... exactly once


@pytest.mark.parametrize(("fsdp", "tp"), [(2, 2), (4, 2), (8, 2), (2, 1), (4, 1), (8, 1)])
def test_aligned_traffic_is_the_papers_formula_and_holds_no_redundant_copy(fsdp: int, tp: int) -> None:
    # the formula assumes even shards, no replicated key/value heads, and counts the matrices (norms:
    # replicated for generation)
    matrices = [s for s in llama_specs(_shapes(), CONFIG, aligned=True) if len(s.shape) == 2]
    plan = plan_reshard(matrices, TrainingLayout(1, fsdp), GenerationLayout(tp))
    size = sum(s.nbytes for s in matrices)
    for device in range(plan.world):
        assert plan.received_bytes(device) == pytest.approx(formula_hybrid(size, fsdp, tp))
        assert plan.redundant_bytes(device) == 0
    assert allgather_bytes(matrices, plan.training) == pytest.approx(formula_allgather(size, fsdp))
    assert plan.max_received_bytes <= allgather_bytes(matrices, plan.training)


def test_the_micro_data_parallel_grouping_of_the_paper() -> None:
    """fsdp=4 → tp=2: ranks {0,1} hold the halves of tp rank 0's shard and gather only from each other."""
    plan = plan_reshard(llama_specs(_shapes(), CONFIG), TrainingLayout(1, 4), GenerationLayout(2))
    assert [(r.replica, r.rank) for r in plan.roles] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert plan.replicas() == [[0, 2], [1, 3]]
    matrices = {pair for pair, pieces in plan.transfers.items() if any(len(p.box) == 2 for p in pieces)}
    assert matrices == {(0, 1), (1, 0), (2, 3), (3, 2)}


def test_fsdp_default_sharding_keeps_a_redundant_copy_and_moves_more() -> None:
    aligned = plan_reshard(llama_specs(_shapes(), CONFIG, aligned=True), TrainingLayout(1, 4),
                           GenerationLayout(2))
    naive = plan_reshard(llama_specs(_shapes(), CONFIG, aligned=False), TrainingLayout(1, 4),
                         GenerationLayout(2))
    assert naive.max_received_bytes > aligned.max_received_bytes
    assert min(naive.redundant_bytes(r) for r in range(4)) > 0


def test_key_value_heads_fewer_than_ranks_are_replicated() -> None:
    specs = llama_specs([("model.layers.0.self_attn.k_proj.weight", (8, 48))], CONFIG)
    boxes = [specs[0].generation_box(4, k) for k in range(4)]
    assert boxes == [((0, 4), (0, 48)), ((0, 4), (0, 48)), ((4, 8), (0, 48)), ((4, 8), (0, 48))]


def test_lora_tensors_follow_their_layer() -> None:
    specs = llama_specs([
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", (8, 48)),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", (48, 8)),
        ("base_model.model.model.layers.0.self_attn.o_proj.lora_A.default.weight", (8, 48)),
        ("base_model.model.model.layers.0.self_attn.o_proj.lora_B.default.weight", (48, 8)),
    ], CONFIG)
    assert specs[0].name == "model.layers.0.self_attn.q_proj.lora_A.weight"
    assert [s.split for s in specs] == ["replicated", "heads", "row", "replicated"]
    assert [s.generation_box(2, 1) for s in specs] == [
        ((0, 8), (0, 48)), ((24, 48), (0, 8)), ((0, 8), (24, 48)), ((0, 48), (0, 8))]


def test_projection_biases_follow_their_layers_output_rows() -> None:
    """Attention biases (Qwen-style models): a column-parallel layer's bias is split like its rows, a
    row-parallel layer's is whole on every rank (vLLM adds it once, after the reduction); every bias
    trains sharded along its only dimension."""
    specs = llama_specs([("model.layers.0.self_attn.q_proj.bias", (48,)),
                         ("model.layers.0.self_attn.o_proj.bias", (48,)),
                         ("model.layers.0.mlp.down_proj.bias", (48,))], CONFIG)
    assert [s.split for s in specs] == ["heads", "replicated", "replicated"]
    assert [s.train_dim for s in specs] == [0, 0, 0]
    assert [s.generation_box(2, 1) for s in specs] == [((24, 48),), ((0, 48),), ((0, 48),)]


def test_the_tp_engine_refuses_a_model_with_biases_and_names_the_engine_that_serves_it() -> None:
    from online_rl.hybrid.tp import TensorParallelLlama

    config = LlamaConfig(**(CONFIG.to_dict() | {"attention_bias": True}))
    with pytest.raises(ConfigError, match=r"hybrid\.engine: vllm"):
        TensorParallelLlama(config, {}, 0, 1)


def test_layouts_that_cannot_work_are_refused_with_the_setting_to_change() -> None:
    specs = llama_specs(_shapes(), CONFIG)
    with pytest.raises(ConfigError, match=r"hybrid\.tp=4 must divide the 6 training ranks"):
        plan_reshard(specs, TrainingLayout(2, 3), GenerationLayout(4))
    with pytest.raises(ConfigError, match=r"hybrid\.fsdp=5 must divide .* or set hybrid\.aligned=false"):
        plan_reshard(specs, TrainingLayout(1, 5), GenerationLayout(5))
    with pytest.raises(ConfigError, match=r"12 heads.*choose a hybrid\.tp that divides it"):
        plan_reshard(llama_specs(_shapes(), CONFIG, aligned=False), TrainingLayout(1, 5), GenerationLayout(5))
    with pytest.raises(ConfigError, match=r"hybrid\.dp=0"):
        TrainingLayout(0, 2)


def test_the_adapter_is_planned_onto_the_base_roles() -> None:
    """Planned alone, an adapter's overlaps could pick other roles than the base's: it takes the base's."""
    training, generation = TrainingLayout(2, 2), GenerationLayout(2)
    base = plan_reshard(llama_specs(_shapes(), CONFIG, aligned=False), training, generation)
    lora = llama_specs([("model.layers.0.self_attn.o_proj.lora_A.weight", (8, 48)),
                        ("model.layers.0.self_attn.o_proj.lora_B.weight", (48, 8))], CONFIG, aligned=False)
    plan = plan_reshard(lora, training, generation, roles=base.roles)
    assert plan.roles == base.roles
    for device in range(training.world):  # each device gets the A columns of its own tp rank
        assert plan.generation_box(device, 0) == ((0, 8), (24 * base.roles[device].rank,
                                                           24 * (base.roles[device].rank + 1)))
