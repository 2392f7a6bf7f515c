"""The autoregressive family: a Llama-style causal transformer over discrete video tokens.

Block anatomy (pre-norm, plain residuals; Llama / Cosmos-AR):

    x = x + CausalSelfAttn(rms(x))          # GQA, per-head QK RMSNorm, 3D RoPE on (t, h, w)
    x = x + CrossAttn(rms(x), text)          # queries: video tokens, keys/values: caption tokens
    x = x + SwiGLU(rms(x))

The video's tokens (T, H, W) are read in raster order. Input position i holds the token before
it (a BOS id at i = 0) and carries the RoPE angles of the (t, h, w) cell it predicts, so every
query knows which cell comes next. Single-device code: the parallel engine applies TP/SP, CP,
PP and FSDP2 from outside (the same module names as the DiT: q, k, v, o, w1, w2, w3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vfm_core.config import ModelConfig
from vfm_core.data.packing import PackLayout, cross_attention_mask, per_sample_mean, rope_angles
from vfm_core.models.attention import Attention, KVCache
from vfm_core.models.layers import Grid, ShapeError, SwiGLU, rope_3d


class ARBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.hidden, cfg.norm_eps
        attn = dict(kv_heads=cfg.kv_heads, qk_norm=cfg.qk_norm, eps=eps)
        self.norms = nn.ModuleList(nn.RMSNorm(d, eps=eps) for _ in range(3))
        # one causal pass; a list like the DiT block's passes, so the TP plan serves both
        self.layouts = ("causal",)
        self.self_attn = nn.ModuleList([Attention(d, cfg.heads, **attn)])
        self.cross_attn = Attention(d, cfg.heads, context_dim=cfg.text_dim, **attn)
        self.mlp = SwiGLU(d, cfg.mlp_ratio)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, D)
        text: torch.Tensor,  # (B, L, Dt)
        rope: torch.Tensor,  # (N, d/2)
        *,
        cache: KVCache | None = None,
        sample_ids: torch.Tensor | None = None,  # (N,) packed samples (B = 1)
        text_mask: torch.Tensor | None = None,  # (N, L) packed captions
    ) -> torch.Tensor:
        h = self.norms[0](x)
        x = x + self.self_attn[0](h, rope=rope, causal=True, cache=cache, sample_ids=sample_ids)
        x = x + self.cross_attn(self.norms[1](x), context=text, mask=text_mask)
        return x + self.mlp(self.norms[2](x))  # (B, N, D)


class CausalVideoTransformer(nn.Module):
    """Next-token model p(x_i | x_<i, text) over ``cfg.vocab_size`` video token ids."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch != "ar":
            raise ValueError(f"CausalVideoTransformer needs model.arch 'ar', got {cfg.arch!r}")
        self.cfg = cfg
        self.bos = cfg.vocab_size  # one extra embedding row: the start of every video
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.hidden)
        self.blocks = nn.ModuleDict({str(i): ARBlock(cfg) for i in range(cfg.depth)})
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Small normal embeddings and projections (std 0.02), output projections of each
        residual branch scaled by 1/sqrt(2 * depth) (GPT-2 / Llama practice)."""
        std = 0.02
        nn.init.normal_(self.embed.weight, std=std)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
        scale = (2 * self.cfg.depth) ** -0.5
        for block in self.blocks.values():
            for lin in (block.self_attn[0].o, block.cross_attn.o, block.mlp.w2):
                lin.weight.data.mul_(scale)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dtype.is_floating_point:
            raise ShapeError(f"video tokens must be integer ids, got {tokens.dtype}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.cfg.vocab_size):
            raise ShapeError(
                f"video tokens must lie in [0, {self.cfg.vocab_size}) (model.vocab_size), got "
                f"min {int(tokens.min())} max {int(tokens.max())}"
            )

    def rope(self, grid: Grid, device=None) -> torch.Tensor:
        """(N, d/2) angles of the raster-ordered grid's cells."""
        return rope_3d(grid, self.cfg.head_dim, self.cfg.rope_theta, device=device)

    def shift_right(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, N) targets -> (B, N) inputs: BOS, then every target but the last."""
        bos = ids.new_full((ids.shape[0], 1), self.bos)
        return torch.cat([bos, ids[:, :-1]], dim=1)

    def forward_ids(
        self,
        inputs: torch.Tensor,  # (B, n) input ids (BOS allowed)
        text: torch.Tensor,  # (B, L, Dt)
        rope: torch.Tensor,  # (n, d/2) angles of the cells these inputs predict
        *,
        caches: list[KVCache] | None = None,
        sample_ids: torch.Tensor | None = None,
        text_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, n, V) of the next token at each input position; with ``caches`` (one per
        block) the inputs continue the cached prefix."""
        h = self.embed(inputs)  # (B, n, D)
        text = text.to(h.dtype)
        for i, block in enumerate(self.blocks.values()):
            cache = caches[i] if caches is not None else None
            h = block(h, text, rope, cache=cache, sample_ids=sample_ids, text_mask=text_mask)
        return self.head(self.norm(h))  # (B, n, V)

    def forward(self, tokens: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        """tokens (B, T, H, W) ids, text (B, L, Dt) -> logits (B, T*H*W, V); logits[:, i]
        predicts the i-th token in raster order from the tokens before it."""
        if tokens.ndim != 4:
            raise ShapeError(f"video tokens: expected (B, T, H, W), got {tuple(tokens.shape)}")
        self.check_tokens(tokens)
        grid = tuple(tokens.shape[1:])
        ids = tokens.flatten(1)  # (B, N)
        return self.forward_ids(self.shift_right(ids), text, self.rope(grid, tokens.device))

    def forward_packed(
        self,
        ids: torch.Tensor,  # (length,) target ids of the pack, padding any valid id
        text: torch.Tensor,  # (S, L, Dt) captions
        text_lengths: torch.Tensor,  # (S,) valid caption tokens
        layout: PackLayout,
    ) -> torch.Tensor:
        """Logits (length, V) of one pack of S videos of different grids (THD): every sample
        starts with BOS, attends causally within itself only (document mask) and to its own
        caption; equals :meth:`forward` of every sample alone. Padding logits are finite and
        ignored by :func:`packed_next_token_loss`."""
        n, s = layout.length, layout.n_samples
        if ids.shape != (n,):
            raise ShapeError(f"packed ids: expected ({n},) for the layout, got {tuple(ids.shape)}")
        if text.ndim != 3 or text.shape[0] != s or text_lengths.shape != (s,):
            raise ShapeError(
                f"pack of {s} samples: text must be ({s}, L, Dt) and text_lengths ({s},), got "
                f"{tuple(text.shape)} and {tuple(text_lengths.shape)}"
            )
        self.check_tokens(ids)
        dev = ids.device
        sample = layout.sample_ids.to(dev)  # (length,) -1 = padding
        starts = torch.zeros(n, dtype=torch.bool, device=dev)
        starts[layout.cu_seqlens[:-1].long().to(dev)] = True
        prev = torch.cat([ids.new_full((1,), self.bos), ids[:-1]])  # (length,)
        inputs = torch.where(starts | (sample < 0), self.bos, prev)[None]  # (1, length)
        rope = rope_angles(layout.positions, self.cfg.head_dim, self.cfg.rope_theta).to(dev)
        mask = cross_attention_mask(layout.sample_ids, text_lengths.cpu()).to(dev)  # (N, S*L)
        lmax = int(text_lengths.max())
        flat = text[:, :lmax].reshape(1, s * lmax, -1)  # (1, S*L, Dt)
        return self.forward_ids(inputs, flat, rope, sample_ids=sample, text_mask=mask)[0]

    def new_caches(self, max_len: int) -> list[KVCache]:
        return [KVCache(max_len) for _ in self.blocks]


def packed_next_token_loss(
    logits: torch.Tensor, ids: torch.Tensor, layout: PackLayout
) -> torch.Tensor:
    """Per-sample mean cross-entropy (S,) of a pack's logits (length, V) against its ids
    (length,); only real tokens count."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    per_token = F.cross_entropy(logits.to(acc), ids, reduction="none")  # (length,)
    return per_sample_mean(per_token, layout.sample_ids.to(ids.device), layout.n_samples)


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per token) of logits (B, N, V) against ids (B, N). Logits that
    are a DTensor sharded over the vocabulary (tensor parallel) need torch's ``loss_parallel``
    context around this call and its backward: the softmax is then reduced across the ranks and
    no rank holds the full logits."""
    acc = torch.promote_types(logits.dtype, torch.float32)  # bf16 -> fp32, fp64 stays
    return F.cross_entropy(logits.flatten(0, 1).to(acc), targets.flatten())
