"""The DiT family: full-attention DiT blocks, ST-DiT (spatial + temporal) blocks, and the
Llama-style
variant (RMSNorm, SwiGLU, grouped-query attention — the DiT block with those options from the
config).

Block anatomy (pre-norm, AdaLN-modulated, gated residuals; DiT / Cosmos):

    x = x + g1 · SelfAttn(mod(norm(x), s1, c1))          # full, or spatial then temporal (ST-DiT)
    x = x + g2 · CrossAttn(mod(norm(x), s2, c2), text)   # queries: video tokens, keys/values: text
    x = x + g3 · MLP(mod(norm(x), s3, c3))

With ``model.text_conditioning='pooled'`` the block has no cross-attention: the caption's mean
token, projected, is added to the timestep embedding that drives every modulation (DiT's class
conditioning).

Single-device code: ``parallelize_dit`` applies TP/SP, CP and FSDP2 from outside, and a pipeline
stage is this model with the other stages' parts removed. Blocks live in an ``nn.ModuleDict``
keyed by index so stages drop blocks and keep parameter names.
"""

from __future__ import annotations

import torch
from torch import nn

from vfm_core.config import ModelConfig
from vfm_core.geometry import Grid, PackLayout, ShapeError, patchify, rope_angles, unpatchify
from vfm_core.models.adaln import AdaLNGlobal, Modulation, gated_residual, modulate
from vfm_core.models.attention import Attention
from vfm_core.models.attention_spec import AttentionSpec, Layout, caption_mask
from vfm_core.models.init import Init, linear_rule
from vfm_core.models.layers import (
    PooledTextEmbedder,
    TimestepEmbedder,
    grid_positions,
    make_mlp,
    make_norm,
    rope_3d,
    with_positions,
)
from vfm_core.models.packed import TokenPack, frame_rows, pack_attention, token_pack


class DiTBlock(nn.Module):
    """One transformer block; ``layouts`` lists its self-attention passes: ("full",) for DiT,
    ("spatial", "temporal") for ST-DiT."""

    def __init__(self, cfg: ModelConfig, layouts: tuple[Layout, ...] = ("full",)):
        super().__init__()
        d = cfg.hidden
        self.layouts = layouts
        attn = dict(kv_heads=cfg.kv_heads, qk_norm=cfg.qk_norm, eps=cfg.norm_eps)
        n = len(layouts) + (2 if cfg.cross_attention else 1)  # modulated sub-layers
        self.norms = nn.ModuleList(make_norm(cfg.norm, d, cfg.norm_eps) for _ in range(n))
        self.self_attn = nn.ModuleList(
            Attention(d, cfg.heads, fused=cfg.fused_proj, rotary=cfg.rope, **attn) for _ in layouts
        )
        self.cross_attn = (
            Attention(d, cfg.heads, context_dim=cfg.text_dim, **attn)
            if cfg.cross_attention
            else None
        )
        self.mlp = make_mlp(cfg.mlp, d, cfg.mlp_ratio, cfg.mlp_bias)
        self.modulation = Modulation(d, n, mode=cfg.adaln, rank=cfg.adaln_lora_rank)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, D)
        emb: torch.Tensor,  # (B, D)
        shared: torch.Tensor | None,  # (B, 3D) AdaLN-LoRA global term
        text: torch.Tensor,  # (B, L, Dt)
        rope: torch.Tensor,  # (N, d/2)
        *,
        spec: AttentionSpec,  # the forward's: grid or pack groups, caption mask
        pack: TokenPack | None = None,
    ) -> torch.Tensor:
        """Batched, or one pack (``pack`` given): x (1, N, D), emb (S, D), shared (S, 3D),
        text (1, S*L, Dt), rope (N, d/2) per token."""
        mods = self.modulation(emb, shared)  # n × (shift, scale, gate), each (B | S, D)
        if pack is not None:  # per-sample modulation -> per token
            mods = [tuple(pack.per_token(m) for m in mod) for mod in mods]  # each (1, N, D)
        for i, (layout, attn) in enumerate(zip(self.layouts, self.self_attn)):
            shift, scale, gate = mods[i]
            h = modulate(self.norms[i](x), shift, scale)
            a = attn(h, spec=spec.for_layout(layout), rope=rope)  # (B, N, D)
            x = gated_residual(x, gate, a)  # (B, N, D)
        if self.cross_attn is not None:
            shift, scale, gate = mods[-2]
            h = modulate(self.norms[-2](x), shift, scale)
            x = gated_residual(x, gate, self.cross_attn(h, spec=spec.cross(), context=text))
        shift, scale, gate = mods[-1]
        h = modulate(self.norms[-1](x), shift, scale)
        return gated_residual(x, gate, self.mlp(h))  # (B, N, D)


class FinalLayer(nn.Module):
    """norm -> AdaLN (shift, scale) -> linear to patch values; zero-initialised."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.hidden
        pt, ph, pw = cfg.patch
        self.norm = make_norm(cfg.norm, d, cfg.norm_eps)
        self.modulation = nn.Linear(d, 2 * d)
        self.linear = nn.Linear(d, pt * ph * pw * cfg.in_channels)

    def forward(
        self, x: torch.Tensor, emb: torch.Tensor, *, pack: TokenPack | None = None
    ) -> torch.Tensor:
        shift, scale = self.modulation(nn.functional.silu(emb)).chunk(2, dim=-1)  # (B, D) each
        if pack is not None:
            shift, scale = pack.per_token(shift), pack.per_token(scale)  # (1, N, D) each
        return self.linear(modulate(self.norm(x), shift, scale))  # (B, N, C*P)


def block_layouts(cfg: ModelConfig, index: int) -> tuple[Layout, ...]:
    if cfg.arch != "stdit":
        return ("full",)
    if cfg.stdit_full_every and (index + 1) % cfg.stdit_full_every == 0:
        return ("full",)
    return ("spatial", "temporal")


class DiT(nn.Module):
    """Denoiser network F(x_in, c_noise, text) on latents (B, C, T, H, W) -> (B, C, T, H, W), or
    on one pack of samples of different grids (THD tokens; :meth:`forward` with ``layout``).

    A pipeline stage is this module with the parts other stages own removed
    (:data:`STAGE_FIRST` on the first stage only, :data:`STAGE_LAST` on the last, a contiguous
    range of ``blocks``): the same forward then takes / returns the hidden stream."""

    STAGE_FIRST = ("x_embedder",)
    """Modules only the first pipeline stage keeps."""
    STAGE_LAST = ("final",)
    """Modules only the last pipeline stage keeps."""
    STAGE_ALL = ("t_embedder", "adaln_global", "text_embedder")
    """Conditioning every stage keeps a replica of (recomputed per stage; gradients summed)."""
    SEQUENCE = ("x_embedder", "final", 4)
    """(module whose output is the token sequence, module whose output is the whole sequence
    again, index of the RoPE angles among a block's positional arguments) for the context- and
    sequence-parallel hooks: block(h, emb, shared, text, rope, *, spec, pack)."""
    CAUSAL = False
    """Bidirectional attention: any contiguous chunk of the sequence per CP rank."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.hidden
        pt, ph, pw = cfg.patch
        self.x_embedder = nn.Linear(cfg.in_channels * pt * ph * pw + cfg.abs_pos, d)
        self.t_embedder = TimestepEmbedder(d, cfg.freq_dim)
        # pooled text conditioning: on every pipeline stage, like the timestep MLP
        self.text_embedder = None if cfg.cross_attention else PooledTextEmbedder(cfg.text_dim, d)
        self.adaln_global = AdaLNGlobal(d) if cfg.adaln == "lora" else None
        self.blocks = nn.ModuleDict(
            {str(i): DiTBlock(cfg, block_layouts(cfg, i)) for i in range(cfg.depth)}
        )
        self.final = FinalLayer(cfg)

    @staticmethod
    def init_rule(name: str, shape: tuple[int, ...]) -> Init:
        """Xavier linears, zero biases; timestep MLP N(0, 0.02^2) (DiT); AdaLN and the output
        layer zero, so every block starts as the identity (AdaLN-Zero; LoRA: the up factors)."""
        zero = (
            ".modulation.proj." in name
            or ".modulation.up." in name
            or name.startswith(("adaln_global.", "final.modulation.", "final.linear."))
        )
        return linear_rule(
            lambda _n: zero,
            lambda n: 0.02 if n.startswith("t_embedder.mlp.") else None,
        )(name, shape)

    def forward(
        self,
        x: torch.Tensor,
        c_noise: torch.Tensor,
        text: torch.Tensor,
        *,
        text_lengths: torch.Tensor | None = None,
        layout: PackLayout | None = None,
        grid: Grid | None = None,
    ) -> torch.Tensor:
        """Batched: x (B, C, T, H, W) latents, c_noise (B,), text (B, L, Dt) -> (B, C, T, H, W).
        c_noise may also be (B, T/p_t): a noise level per latent frame (frame-conditioned
        training and sampling: clean leading frames at their own level), each token modulated
        by its frame's.

        Packed (``layout`` of S samples): x (1, length, C*P) patch tokens
        (:func:`vfm_core.models.packed.pack_latents`), c_noise (S,), text (S, L, Dt) with
        ``text_lengths`` (S,) valid tokens each -> (1, length, C*P); equals the batched forward of
        every sample alone (its caption cut to its length); padding stays finite and touches
        nothing else.

        A stage without ``x_embedder`` takes the hidden stream (B, n, D) instead of x (``grid``:
        the token grid of the batch, packs: ``layout``); one without ``final`` returns it.
        """
        cfg = self.cfg
        pack = None
        if layout is None:
            if self.x_embedder is not None:
                x, grid = patchify(x, cfg.patch)  # (B, N, C*P)
                positions = grid_positions(grid)
            if grid is None:
                raise ShapeError("a DiT stage without x_embedder needs the token grid")
            rope = rope_3d(grid, cfg.head_dim, cfg.rope_theta, device=x.device)  # (N, d/2)
            txt = text
        else:
            text_lengths = self._check_pack(x, c_noise, text, text_lengths, layout)
            positions = layout.positions
            rope = rope_angles(positions, cfg.head_dim, cfg.rope_theta).to(x.device)  # (N, d/2)
            used = {name for block in self.blocks.values() for name in block.layouts}
            pack = token_pack(layout, device=x.device)
            spec = pack_attention(layout, text_lengths, sorted(used), device=x.device)
            lmax = int(text_lengths.max())
            txt = text[:, :lmax].reshape(1, -1, text.shape[-1])  # (1, S*L, Dt)
        if self.x_embedder is not None:
            h = self.x_embedder(with_positions(x, positions, cfg.abs_pos))  # (B, N, D)
        else:
            h = x  # (B, n, D) from the previous stage
        per_frame = layout is None and c_noise.ndim == 2  # (B, T'): a level per frame
        if per_frame:
            if grid is None or c_noise.shape[1] != grid[0]:
                raise ShapeError(
                    f"c_noise per frame: expected (B, {grid and grid[0]}) for the token grid "
                    f"{grid}, got {tuple(c_noise.shape)}"
                )
            pack = frame_rows(grid, c_noise.shape[0], device=x.device)
        emb = self.t_embedder(c_noise.reshape(-1))  # (B | S | B·T', D)
        if self.text_embedder is not None:  # pooled caption (per sample; packs: its length)
            pooled = self.text_embedder(text, text_lengths)  # (B | S, D)
            emb = emb + (pooled.repeat_interleave(grid[0], 0) if per_frame else pooled)
        shared = self.adaln_global(emb) if self.adaln_global is not None else None  # (B|S, 3D)
        txt = txt.to(h.dtype)
        if layout is None:  # batched: the grid's groups, the real tokens of padded captions
            spec = AttentionSpec(grid=grid, mask=caption_mask(txt) if cfg.cross_attention else None)
        for block in self.blocks.values():
            h = block(h, emb, shared, txt, rope, spec=spec, pack=pack)  # (B, n, D)
        if self.final is None:
            return h
        out = self.final(h, emb, pack=pack)  # (B, N, C*P)
        if layout is not None:
            # a fresh tensor, not a view (FSDP2's pre-backward hook sits on the returned tensor)
            return out.clone()  # (1, length, C*P)
        return unpatchify(out, grid, cfg.patch, cfg.in_channels)  # (B, C, T, H, W)

    def _check_pack(self, x, c_noise, text, text_lengths, layout: PackLayout) -> torch.Tensor:
        cfg = self.cfg
        s = layout.n_samples
        feat = cfg.in_channels * cfg.patch[0] * cfg.patch[1] * cfg.patch[2]
        if self.x_embedder is not None and tuple(x.shape) != (1, layout.length, feat):
            raise ShapeError(
                f"packed tokens: expected (1, {layout.length}, {feat}) for the layout, "
                f"got {tuple(x.shape)}"
            )
        if c_noise.shape != (s,) or text.ndim != 3 or text.shape[0] != s:
            raise ShapeError(
                f"pack of {s} samples: c_noise must be ({s},) and text ({s}, L, Dt), got "
                f"{tuple(c_noise.shape)} and {tuple(text.shape)}"
            )
        if (
            text_lengths is None
            or text_lengths.shape != (s,)
            or not bool(((text_lengths >= 1) & (text_lengths <= text.shape[1])).all())
        ):
            got = None if text_lengths is None else text_lengths.tolist()
            raise ShapeError(
                f"text_lengths: expected ({s},) values in [1, {text.shape[1]}], got {got}"
            )
        return text_lengths

    def forward_packed(
        self,
        tokens: torch.Tensor,
        c_noise: torch.Tensor,
        text: torch.Tensor,
        text_lengths: torch.Tensor,
        layout: PackLayout,
    ) -> torch.Tensor:
        """:meth:`forward` of one pack given as tokens (length, C*P) -> (length, C*P)."""
        return self(tokens[None], c_noise, text, text_lengths=text_lengths, layout=layout)[0]


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
