"""A tiny random Llama for fast tests: two layers, the embedded model's tokenizer, seeded.

Its weights are random, so it answers nonsense, but it has the real vocabulary and chat template,
and every code path that takes a Llama (PEFT, vLLM, the trainers) accepts it. Its head size is 32,
the smallest vLLM's CPU attention supports.

A random model spreads its answers over the whole vocabulary (49k tokens, almost none sampled twice),
so no preference over its text can be learned in a few steps: GRPO raises tokens that are then never
seen again. `prefer_single_characters=True` builds one that can learn: its last attention output has
a constant bias along one direction and the single-character tokens' embeddings share that direction,
so its answers are mostly those ~240 tokens (still random among them) and a preference among them
(more letters, fewer symbols) is learned within ten steps (tests/hybrid/test_vllm_rollout.py).
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
    prefer_single_characters: bool = False,
) -> Path:
    """Write a seeded random Llama with `tokenizer_dir`'s tokenizer to `out_dir` and return it
    (`prefer_single_characters`: see the module's docstring)."""
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
        attention_bias=prefer_single_characters,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.eval()
    if prefer_single_characters:
        direction = torch.randn(hidden_size, generator=torch.Generator().manual_seed(seed + 1))
        direction /= direction.norm()
        singles = [i for i in range(len(tokenizer)) if len(tokenizer.convert_ids_to_tokens(i)) == 1]
        with torch.no_grad():
            # about 8 nats of preference for the single characters after the final norm (sqrt(128) * 0.7)
            model.model.layers[-1].self_attn.o_proj.bias.copy_(3.0 * direction)
            model.model.embed_tokens.weight[singles] += 0.7 * direction
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
