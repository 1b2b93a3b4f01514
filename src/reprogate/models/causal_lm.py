"""Family `causal_lm`: a GPT-style decoder, small enough to hold in one's head (nanoGPT's shape).

tokens -> embedding (+ learned positions, or rotary positions inside attention) -> n_layer
pre-norm blocks [causal self-attention, MLP (GELU or SwiGLU)] -> final norm -> logits over the
vocabulary (the output projection is the embedding when tied). Attention is PyTorch's
scaled_dot_product_attention with is_causal, which picks its fastest kernel per device.
Initialisation follows GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from reprogate.specs.families.causal_lm import CausalLmConfig


def rope_tables(context: int, head: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head, 2, dtype=torch.float32, device=device) / head))
    angles = torch.outer(torch.arange(context, dtype=torch.float32, device=device), inv)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary positions on (batch, heads, time, head) by pairs of channels (first half, second half)."""
    a, b = x.chunk(2, dim=-1)
    t = x.shape[-2]
    c, s = cos[:t], sin[:t]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: CausalLmConfig):
        super().__init__()
        self.n_head, self.rope = cfg.n_head, cfg.positions == "rope"
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = cfg.dropout
        if self.rope:
            cos, sin = rope_tables(cfg.context, cfg.d_model // cfg.n_head)
            # Not parameters and not saved: rebuilt from the config, identical everywhere.
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (
            z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in self.qkv(x).split(d, dim=2)
        )
        if self.rope:
            q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, cfg: CausalLmConfig):
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        # SwiGLU has three matrices where GELU has two: 2/3 of the width keeps the parameters.
        hidden = int(cfg.mlp_ratio * cfg.d_model * (2 / 3 if self.swiglu else 1))
        self.up = nn.Linear(cfg.d_model, hidden * (2 if self.swiglu else 1), bias=cfg.bias)
        self.down = nn.Linear(hidden, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.swiglu:
            gate, value = h.chunk(2, dim=-1)
            return self.down(F.silu(gate) * value)
        return self.down(F.gelu(h))


class Block(nn.Module):
    def __init__(self, cfg: CausalLmConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = Mlp(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class CausalLm(nn.Module):
    def __init__(self, cfg: CausalLmConfig, vocab_size: int):
        super().__init__()
        self.cfg, self.vocab_size = cfg, vocab_size
        self.embed = nn.Embedding(vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.context, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        # Tied: the embedding is the output projection (one tensor in the state, as safetensors
        # stores no two names for one storage).
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith(("attn.proj.weight", "mlp.down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, vocab) for every position of `ids` (batch, time <= context)."""
        x = self.embed(ids)
        if self.pos is not None:
            x = x + self.pos(torch.arange(ids.shape[1], device=ids.device))
        x = self.drop(x)
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.embed.weight) if self.head is None else self.head(x)

    def parameter_counts(self) -> tuple[int, int]:
        """(all parameters, without the embeddings): a tied output projection counts once."""
        total = sum(p.numel() for p in self.parameters())
        emb = self.embed.weight.numel() + (self.pos.weight.numel() if self.pos is not None else 0)
        if self.head is not None:
            emb += self.head.weight.numel()
        return total, total - emb

    @torch.inference_mode()
    def generate(
        self, ids: list[int], max_new_tokens: int, temperature: float, top_k: int | None, generator
    ) -> list[int]:
        """Sampled continuation of `ids` (the last `context` tokens are the window)."""
        self.eval()
        device = self.embed.weight.device
        seq = torch.tensor([ids], dtype=torch.long, device=device)
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = self(seq[:, -self.cfg.context :])[0, -1].float() / temperature
            if top_k is not None and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1).cpu()
            nxt = int(torch.multinomial(probs, 1, generator=generator))
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]], device=device)], dim=1)
        return out


def build(cfg: CausalLmConfig, vocab_size: int) -> CausalLm:
    return CausalLm(cfg, vocab_size)
