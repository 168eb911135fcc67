"""Tensor-parallel generation from the resharded weights: a Llama split the way vLLM splits it.

Each rank of an engine replica holds its generation shards (`online_rl.hybrid.layout`): query/key/value
heads and MLP rows for column-parallel layers, input columns for the row-parallel ones (their partial
outputs summed with one all-reduce), a slice of the vocabulary for the embedding (all-reduce) and the
LM head (all-gather of the logits). LoRA adapters are held in memory by name, split like their layers,
and applied per call; an adapter name is immutable (loading new weights takes a new name). Decoding
keeps a key/value cache; rank 0 of the replica samples each token and broadcasts it, so every rank
decodes the same sequence. The arithmetic is transformers' Llama (RMSNorm, RoPE, grouped-query
attention, SiLU MLP), so a greedy decode matches the unsharded model's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from online_rl.errors import ConfigError
from online_rl.hybrid.layout import chunk_range

__all__ = ["Completion", "TensorParallelLlama"]


@dataclass(frozen=True)
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # of each sampled token under the sampling distribution
    finish_reason: str  # "stop" (end of sequence) or "length"


class TensorParallelLlama:
    """One rank's share of a Llama engine replica of `tp` ranks (`group`: the replica's process group;
    `ranks`: its global ranks in tensor-parallel order)."""

    def __init__(self, config: Any, weights: Mapping[str, torch.Tensor], tp_rank: int, tp: int,
                 group: Any = None, ranks: Sequence[int] = (0,), max_adapters: int = 4) -> None:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        self.config = config
        self.weights = dict(weights)
        self.tp_rank, self.tp, self.group, self.ranks = tp_rank, tp, group, list(ranks)
        heads = int(config.num_attention_heads)
        kv = int(config.num_key_value_heads or heads)
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise ConfigError("hybrid.engine=tp does not apply projection biases (the model's config has "
                              "attention_bias or mlp_bias): set hybrid.engine: vllm for this model")
        if heads % tp:
            raise ConfigError(f"hybrid.tp={tp} must divide the model's {heads} attention heads")
        self.heads = heads // tp
        self.kv_heads = kv // tp if kv >= tp else 1
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        self.eps = float(config.rms_norm_eps)
        self.layers = int(config.num_hidden_layers)
        self.vocab = int(config.vocab_size)
        self.vocab_start, self.vocab_stop = chunk_range(self.vocab, tp, tp_rank)
        self.head_name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        self.rotary = LlamaRotaryEmbedding(config)
        self.adapters: dict[str, tuple[dict[str, torch.Tensor], float]] = {}
        self.max_adapters = max_adapters
        self.eos = {int(t) for t in ([config.eos_token_id] if isinstance(config.eos_token_id, int)
                                     else config.eos_token_id or [])}

    # -- adapters ---------------------------------------------------------------------------------
    def load_adapter(self, name: str, tensors: Mapping[str, torch.Tensor], scale: float) -> None:
        """Install an adapter's shards (canonical names, `...q_proj.lora_A.weight`) under a new name."""
        if name in self.adapters:
            raise ValueError(f"adapter {name!r} is already loaded: adapter names are immutable, load new "
                             "weights under a new name")
        if len(self.adapters) >= self.max_adapters:
            self.adapters.pop(next(iter(self.adapters)))  # the oldest goes
        self.adapters[name] = ({k: v for k, v in tensors.items()}, scale)

    def unload_adapter(self, name: str) -> None:
        self.adapters.pop(name, None)

    # -- the forward pass -------------------------------------------------------------------------
    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def _linear(self, x: torch.Tensor, name: str, adapter: str | None) -> torch.Tensor:
        y = x @ self.weights[f"{name}.weight"].T
        if adapter is not None:
            tensors, scale = self.adapters[adapter]
            a = tensors.get(f"{name}.lora_A.weight")
            if a is not None:
                y = y + scale * ((x @ a.T) @ tensors[f"{name}.lora_B.weight"].T)
        return y

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weights[name] * h.to(dtype)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.weights["model.embed_tokens.weight"]
        if table.shape[0] == 0:  # this rank holds no vocabulary rows: it adds zeros
            empty = torch.zeros(*ids.shape, table.shape[1], dtype=table.dtype, device=ids.device)
            return self._all_reduce(empty)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < table.shape[0])
        out = F.embedding(local.clamp(0, table.shape[0] - 1), table) * inside.unsqueeze(-1).to(table.dtype)
        return self._all_reduce(out)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        local = h @ self.weights[self.head_name].T
        if self.tp == 1:
            return local
        width = -(-self.vocab // self.tp)
        padded = local.new_zeros(*local.shape[:-1], width)
        padded[..., : local.shape[-1]] = local
        parts = [torch.empty_like(padded) for _ in range(self.tp)]
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        pieces = [p[..., : chunk_range(self.vocab, self.tp, k)[1] - chunk_range(self.vocab, self.tp, k)[0]]
                  for k, p in enumerate(parts)]
        return torch.cat(pieces, dim=-1)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, keep: torch.Tensor,
                cache: list[tuple[torch.Tensor, torch.Tensor]] | None, adapter: str | None
                ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Logits of the last position of each row, and the extended cache. `keep`: [batch, cached +
        new] True where a key is a real token (False: left padding)."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        batch, length = ids.shape
        h = self._embed(ids)
        cos, sin = self.rotary(h, positions)
        past = 0 if not cache else cache[0][0].shape[2]
        causal = torch.ones(length, past + length, dtype=torch.bool, device=ids.device).tril(diagonal=past)
        own = torch.zeros(length, past + length, dtype=torch.bool, device=ids.device)
        # a padding query sees itself: no row of the mask is empty (that would be NaN)
        own[:, past:] = torch.eye(length, dtype=torch.bool, device=ids.device)
        mask = ((causal.unsqueeze(0) & keep[:, None, :]) | own).unsqueeze(1)
        new_cache = []
        for layer in range(self.layers):
            prefix = f"model.layers.{layer}"
            x = self._norm(h, f"{prefix}.input_layernorm.weight")
            q = self._linear(x, f"{prefix}.self_attn.q_proj", adapter)
            k = self._linear(x, f"{prefix}.self_attn.k_proj", adapter)
            v = self._linear(x, f"{prefix}.self_attn.v_proj", adapter)
            q = q.view(batch, length, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            v = v.view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            if cache:
                k = torch.cat([cache[layer][0], k], dim=2)
                v = torch.cat([cache[layer][1], v], dim=2)
            new_cache.append((k, v))
            groups = self.heads // self.kv_heads
            attn = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, dim=1),
                                                  v.repeat_interleave(groups, dim=1), attn_mask=mask)
            attn = attn.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
            h = h + self._all_reduce(self._linear(attn, f"{prefix}.self_attn.o_proj", adapter))
            x = self._norm(h, f"{prefix}.post_attention_layernorm.weight")
            gated = F.silu(self._linear(x, f"{prefix}.mlp.gate_proj", adapter)) * self._linear(
                x, f"{prefix}.mlp.up_proj", adapter)
            h = h + self._all_reduce(self._linear(gated, f"{prefix}.mlp.down_proj", adapter))
        h = self._norm(h[:, -1], "model.norm.weight")
        return self._logits(h).float(), new_cache

    # -- decoding ---------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float = 1.0,
                 adapter: str | None = None, seed: int = 0) -> list[Completion]:
        """Sample (temperature 0: greedy) up to `max_new_tokens` after each prompt; every rank of the
        replica calls this with the same arguments and gets the same completions."""
        if adapter is not None and adapter not in self.adapters:
            raise KeyError(f"adapter {adapter!r} is not loaded (loaded: {sorted(self.adapters)})")
        if not prompts:
            return []
        width = max(len(p) for p in prompts)
        pad = 0
        device = self.weights["model.embed_tokens.weight"].device
        rows = [[pad] * (width - len(p)) + list(p) for p in prompts]
        ids = torch.tensor(rows, dtype=torch.long, device=device)
        keep = torch.tensor([[False] * (width - len(p)) + [True] * len(p) for p in prompts], device=device)
        positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        generator = torch.Generator().manual_seed(seed)
        out: list[list[int]] = [[] for _ in prompts]
        logps: list[list[float]] = [[] for _ in prompts]
        done = [False] * len(prompts)
        cache = None
        for _ in range(max_new_tokens):
            logits, cache = self.forward(ids, positions, keep, cache, adapter)
            tokens, token_logps = self._sample(logits, temperature, generator)
            for row, (token, logp) in enumerate(zip(tokens.tolist(), token_logps.tolist(), strict=True)):
                if not done[row]:
                    out[row].append(token)
                    logps[row].append(logp)
                    done[row] = token in self.eos
            if all(done):
                break
            ids = tokens.unsqueeze(1)
            positions = positions[:, -1:] + 1
            keep = torch.cat([keep, torch.ones(len(prompts), 1, dtype=torch.bool, device=device)], dim=1)
        return [Completion(t, lp, "stop" if t and t[-1] in self.eos else "length")
                for t, lp in zip(out, logps, strict=True)]

    def _sample(self, logits: torch.Tensor, temperature: float,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        logprobs = torch.log_softmax(logits / temperature if temperature > 0 else logits, dim=-1)
        if self.tp_rank == 0:
            if temperature > 0:  # the seeded generator lives on the CPU
                tokens = torch.multinomial(logprobs.exp().cpu(), 1, generator=generator).squeeze(1)
                tokens = tokens.to(logits.device)
            else:
                tokens = logits.argmax(-1)
        else:
            tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        if self.tp > 1:
            dist.broadcast(tokens, src=self.ranks[0], group=self.group)
        return tokens, logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
