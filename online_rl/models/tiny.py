"""A tiny random Llama for fast tests: two layers, the embedded model's tokenizer, seeded.

Its weights are random, so it answers nonsense, but it has the real vocabulary and chat template,
and every code path that takes a Llama (PEFT, vLLM, the trainers) accepts it. Its head size is 32,
the smallest vLLM's CPU attention supports.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["build_tiny_llama"]


def build_tiny_llama(
    out_dir: Path,
    tokenizer_dir: Path,
    seed: int = 0,
    hidden_size: int = 128,
    num_layers: int = 2,
) -> Path:
    """Write a seeded random Llama with `tokenizer_dir`'s tokenizer to `out_dir` and return it."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
