"""The DiT family: full-attention DiT blocks, ST-DiT (spatial + temporal) blocks, and the
Llama-style
variant (RMSNorm, SwiGLU, grouped-query attention — the DiT block with those options from the
config).

Block anatomy (pre-norm, AdaLN-modulated, gated residuals; DiT / Cosmos):

    x = x + g1 · SelfAttn(mod(norm(x), s1, c1))          # full, or spatial then temporal (ST-DiT)
    x = x + g2 · CrossAttn(mod(norm(x), s2, c2), text)   # queries: video tokens, keys/values: text
    x = x + g3 · MLP(mod(norm(x), s3, c3))

Single-device code: ``parallelize_dit`` applies TP/SP, CP, PP and FSDP2 from outside. Blocks live in
an ``nn.ModuleDict`` keyed by index so pipeline stages can drop blocks and keep parameter names.
"""

from __future__ import annotations

import torch
from torch import nn

from vfm_core.config import ModelConfig
from vfm_core.models.adaln import AdaLNGlobal, Modulation, modulate
from vfm_core.models.attention import Attention, Layout
from vfm_core.models.layers import (
    Grid,
    TimestepEmbedder,
    make_mlp,
    make_norm,
    patchify,
    rope_3d,
    unpatchify,
)


class DiTBlock(nn.Module):
    """One transformer block; ``layouts`` lists its self-attention passes: ("full",) for DiT,
    ("spatial", "temporal") for ST-DiT."""

    def __init__(self, cfg: ModelConfig, layouts: tuple[Layout, ...] = ("full",)):
        super().__init__()
        d = cfg.hidden
        self.layouts = layouts
        attn = dict(kv_heads=cfg.kv_heads, qk_norm=cfg.qk_norm, eps=cfg.norm_eps)
        self.norms = nn.ModuleList(
            make_norm(cfg.norm, d, cfg.norm_eps) for _ in range(len(layouts) + 2)
        )
        self.self_attn = nn.ModuleList(Attention(d, cfg.heads, **attn) for _ in layouts)
        self.cross_attn = Attention(d, cfg.heads, context_dim=cfg.text_dim, **attn)
        self.mlp = make_mlp(cfg.mlp, d, cfg.mlp_ratio)
        self.modulation = Modulation(d, len(layouts) + 2, mode=cfg.adaln, rank=cfg.adaln_lora_rank)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, D)
        emb: torch.Tensor,  # (B, D)
        shared: torch.Tensor | None,  # (B, 3D) AdaLN-LoRA global term
        text: torch.Tensor,  # (B, L, Dt)
        rope: torch.Tensor,  # (N, d/2)
        grid: Grid,
    ) -> torch.Tensor:
        mods = self.modulation(emb, shared)
        for i, (layout, attn) in enumerate(zip(self.layouts, self.self_attn)):
            shift, scale, gate = mods[i]
            h = modulate(self.norms[i](x), shift, scale)
            x = x + gate[:, None] * attn(h, rope=rope, grid=grid, layout=layout)  # (B, N, D)
        shift, scale, gate = mods[-2]
        h = modulate(self.norms[-2](x), shift, scale)
        x = x + gate[:, None] * self.cross_attn(h, context=text)  # (B, N, D)
        shift, scale, gate = mods[-1]
        h = modulate(self.norms[-1](x), shift, scale)
        return x + gate[:, None] * self.mlp(h)  # (B, N, D)


class FinalLayer(nn.Module):
    """norm -> AdaLN (shift, scale) -> linear to patch values; zero-initialised."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden
        pt, ph, pw = cfg.patch
        self.norm = make_norm(cfg.norm, d, cfg.norm_eps)
        self.modulation = nn.Linear(d, 2 * d)
        self.linear = nn.Linear(d, pt * ph * pw * cfg.in_channels)

    def forward(self, x: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
        shift, scale = self.modulation(nn.functional.silu(emb)).chunk(2, dim=-1)  # (B, D) each
        return self.linear(modulate(self.norm(x), shift, scale))  # (B, N, C*P)


def block_layouts(cfg: ModelConfig, index: int) -> tuple[Layout, ...]:
    if cfg.arch != "stdit":
        return ("full",)
    if cfg.stdit_full_every and (index + 1) % cfg.stdit_full_every == 0:
        return ("full",)
    return ("spatial", "temporal")


class DiT(nn.Module):
    """Denoiser network F(x_in, c_noise, text) on latents (B, C, T, H, W) -> (B, C, T, H, W)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        pt, ph, pw = cfg.patch
        self.x_embedder = nn.Linear(cfg.in_channels * pt * ph * pw, d)
        self.t_embedder = TimestepEmbedder(d, cfg.freq_dim)
        self.adaln_global = AdaLNGlobal(d) if cfg.adaln == "lora" else None
        self.blocks = nn.ModuleDict(
            {str(i): DiTBlock(cfg, block_layouts(cfg, i)) for i in range(cfg.depth)}
        )
        self.final = FinalLayer(cfg)
        self.init_weights()

    def init_weights(self) -> None:
        """Xavier linears, zero biases; AdaLN and the output layer zero so blocks start as
        identity."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        nn.init.normal_(self.t_embedder.mlp[0].weight, std=0.02)
        nn.init.normal_(self.t_embedder.mlp[2].weight, std=0.02)
        for block in self.blocks.values():
            block.modulation.zero_init()
        if self.adaln_global is not None:
            nn.init.zeros_(self.adaln_global.proj.weight)
            nn.init.zeros_(self.adaln_global.proj.bias)
        for lin in (self.final.modulation, self.final.linear):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        tokens, grid = patchify(x, cfg.patch)  # (B, N, C*P)
        h = self.x_embedder(tokens)  # (B, N, D)
        emb = self.t_embedder(c_noise)  # (B, D)
        shared = self.adaln_global(emb) if self.adaln_global is not None else None  # (B, 3D)
        rope = rope_3d(grid, cfg.head_dim, cfg.rope_theta, device=x.device)  # (N, d/2)
        text = text.to(h.dtype)
        for block in self.blocks.values():
            h = block(h, emb, shared, text, rope, grid)  # (B, N, D)
        out = self.final(h, emb)  # (B, N, C*P)
        return unpatchify(out, grid, cfg.patch, cfg.in_channels)  # (B, C, T, H, W)


def build_model(cfg: ModelConfig, *, device: str | torch.device | None = None) -> DiT:
    """Construct the denoiser for any arch; ``device="meta"`` builds a 28B model without memory."""
    with torch.device(device or "cpu"):
        return DiT(cfg)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
