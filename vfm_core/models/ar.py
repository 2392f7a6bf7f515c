"""The autoregressive family: a Llama-style causal transformer over discrete video tokens.

Block anatomy (pre-norm, plain residuals; Llama / Cosmos-AR):

    x = x + CausalSelfAttn(rms(x))          # GQA, per-head QK RMSNorm, 3D RoPE on (t, h, w)
    x = x + CrossAttn(rms(x), text)          # queries: video tokens, keys/values: caption tokens
    x = x + SwiGLU(rms(x))

The recipes' choices; ``model.mlp=gelu`` and ``model.norm=layer`` give GPT-2's GELU MLP and
LayerNorm instead (the configuration of nanoGPT, benchmarks/peers.py).

With ``model.text_conditioning='pooled'`` the block has no cross-attention: the caption's mean
token, projected, is added to every input token's embedding.

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
from vfm_core.geometry import Grid, PackLayout, ShapeError, per_sample_mean, rope_angles
from vfm_core.models.attention import Attention, KVCache
from vfm_core.models.attention_spec import AttentionSpec, caption_mask
from vfm_core.models.init import Init, linear_rule
from vfm_core.models.layers import PooledTextEmbedder, has_values, make_mlp, make_norm, rope_3d
from vfm_core.models.packed import pack_attention, token_pack


class ARBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, eps = cfg.hidden, cfg.norm_eps
        attn = dict(kv_heads=cfg.kv_heads, qk_norm=cfg.qk_norm, eps=eps)
        self.norms = nn.ModuleList(
            make_norm(cfg.norm, d, eps, affine=True) for _ in range(3 if cfg.cross_attention else 2)
        )
        # one causal pass; a list like the DiT block's passes, so the TP plan serves both
        self.layouts = ("causal",)
        self.self_attn = nn.ModuleList(
            [Attention(d, cfg.heads, fused=cfg.fused_proj, rotary=cfg.rope, **attn)]
        )
        self.cross_attn = (
            Attention(d, cfg.heads, context_dim=cfg.text_dim, **attn)
            if cfg.cross_attention
            else None
        )
        self.mlp = make_mlp(cfg.mlp, d, cfg.mlp_ratio, cfg.mlp_bias)

    def forward(
        self,
        x: torch.Tensor,  # (B, N, D)
        text: torch.Tensor,  # (B, L, Dt)
        rope: torch.Tensor,  # (N, d/2)
        *,
        spec: AttentionSpec,  # the forward's: pack groups (documents), caption mask
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        h = self.norms[0](x)
        x = x + self.self_attn[0](h, spec=spec.for_layout("causal"), rope=rope, cache=cache)
        if self.cross_attn is not None:
            x = x + self.cross_attn(self.norms[1](x), spec=spec.cross(), context=text)
        return x + self.mlp(self.norms[-1](x))  # (B, N, D)


class CausalVideoTransformer(nn.Module):
    """Next-token model p(x_i | x_<i, text) over ``cfg.vocab_size`` video token ids. A pipeline
    stage is this module without the parts other stages own (as :class:`~vfm_core.models.dit.
    DiT`)."""

    STAGE_FIRST = ("embed", "pos_embed", "text_embedder")
    """Modules only the first pipeline stage keeps."""
    STAGE_LAST = ("norm", "head")
    """Modules only the last pipeline stage keeps."""
    STAGE_ALL = ()
    """Nothing is replicated over the stages (the caption enters with the embedding)."""
    SEQUENCE = ("embed", "head", 2)
    """As :data:`DiT.SEQUENCE <vfm_core.models.dit.DiT.SEQUENCE>`: block(x, text, rope (N, d/2),
    *, spec)."""
    CAUSAL = True
    """Causal attention: a CP rank's chunk is a balanced zigzag set of positions."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.bos = cfg.vocab_size  # one extra embedding row: the start of every video
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.hidden)
        # model.abs_pos > 0: a learned absolute position embedding, the projection of the sin-cos
        # of each input's RoPE angles (the (t, h, w) cell it predicts), added to the token
        # embedding (Cosmos-AR adds one to its 3D RoPE); RoPE alone leaves the causal model no
        # easy way to tell where in the frame it is, so it cannot place what the caption asks for
        self.pos_embed = nn.Linear(cfg.head_dim, cfg.hidden, bias=False) if cfg.abs_pos else None
        # pooled text conditioning: the caption's projected mean token on every input token
        self.text_embedder = (
            None if cfg.cross_attention else PooledTextEmbedder(cfg.text_dim, cfg.hidden)
        )
        self.blocks = nn.ModuleDict({str(i): ARBlock(cfg) for i in range(cfg.depth)})
        self.norm = make_norm(cfg.norm, cfg.hidden, cfg.norm_eps, affine=True)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)

    @staticmethod
    def init_rule_for(depth: int):
        """Embeddings and projections N(0, 0.02^2), the output projection of each residual
        branch scaled by 1/sqrt(2 * depth) (GPT-2 / Llama practice), RMSNorm weights one."""
        std = 0.02
        scaled = std * (2 * depth) ** -0.5
        branch_out = (
            ".self_attn.0.o.weight",
            ".cross_attn.o.weight",
            ".mlp.w2.weight",
            ".mlp.fc2.weight",
        )
        return linear_rule(lambda _n: False, lambda n: scaled if n.endswith(branch_out) else std)

    def init_rule(self, name: str, shape: tuple[int, ...]) -> Init:
        return self.init_rule_for(self.cfg.depth)(name, shape)

    def check_tokens(self, tokens: torch.Tensor) -> None:
        if tokens.dtype.is_floating_point:
            raise ShapeError(f"video tokens must be integer ids, got {tokens.dtype}")
        if not tokens.numel() or not has_values(tokens):  # traced: shapes only
            return
        lo, hi = torch.stack(torch.aminmax(tokens)).tolist()  # one pass, one host read
        if lo < 0 or hi >= self.cfg.vocab_size:
            raise ShapeError(
                f"video tokens must lie in [0, {self.cfg.vocab_size}) (model.vocab_size), got "
                f"min {lo} max {hi}"
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
    ) -> torch.Tensor:
        """Logits (B, n, V) of the next token at each input position; with ``caches`` (one per
        block) the inputs continue the cached prefix (generation)."""
        h = self.embed_inputs(inputs, rope, text)  # (B, n, D)
        text = text.to(h.dtype)
        spec = self.attention_spec(text)
        for i, block in enumerate(self.blocks.values()):
            cache = caches[i] if caches is not None else None
            h = block(h, text, rope, spec=spec, cache=cache)  # (B, n, D)
        return self.head(self.norm(h))  # (B, n, V)

    def forward(
        self,
        x: torch.Tensor,
        text: torch.Tensor,
        *,
        text_lengths: torch.Tensor | None = None,
        layout: PackLayout | None = None,
        grid: Grid | None = None,
    ) -> torch.Tensor:
        """Batched: x (B, T, H, W) token ids, text (B, L, Dt) -> logits (B, T*H*W, V);
        logits[:, i] predicts the i-th token in raster order from the tokens before it.

        Packed (``layout`` of S videos of different grids, THD): x (1, length) target ids
        (padding any valid id), text (S, L, Dt) with ``text_lengths`` (S,) -> logits
        (1, length, V): every sample starts with BOS, attends causally within itself only
        (document mask) and to its own caption; equals the batched forward of every sample
        alone. Padding logits are finite and ignored by :func:`packed_next_token_loss`.

        A stage without ``embed`` takes the hidden stream (B, n, D) (``grid``: the batch's token
        grid; packs: ``layout``); one without ``head`` returns it.
        """
        pack = spec = None
        text_in = text  # (B | S, L, Dt) before a pack's captions are joined
        if layout is None:
            if self.embed is not None:
                if x.ndim != 4:
                    raise ShapeError(f"video tokens: expected (B, T, H, W), got {tuple(x.shape)}")
                self.check_tokens(x)
                grid = tuple(x.shape[1:])
                x = self.shift_right(x.flatten(1))  # (B, N) inputs
            if grid is None:
                raise ShapeError("a stage without the embedding needs the token grid")
            rope = self.rope(grid, x.device)  # (N, d/2)
        else:
            s = layout.n_samples
            if (
                text.ndim != 3
                or text.shape[0] != s
                or text_lengths is None
                or (text_lengths.shape != (s,))
            ):
                raise ShapeError(
                    f"pack of {s} samples: text must be ({s}, L, Dt) and text_lengths ({s},), "
                    f"got {tuple(text.shape)} and "
                    f"{None if text_lengths is None else tuple(text_lengths.shape)}"
                )
            if self.embed is not None:
                if tuple(x.shape) != (1, layout.length):
                    raise ShapeError(
                        f"packed ids: expected (1, {layout.length}) for the layout, got "
                        f"{tuple(x.shape)}"
                    )
                self.check_tokens(x)
                x = self.packed_inputs(x[0], layout)[None]  # (1, length)
            rope = rope_angles(layout.positions, self.cfg.head_dim, self.cfg.rope_theta)
            rope = rope.to(x.device)  # (length, d/2)
            pack = token_pack(layout, device=x.device)
            spec = pack_attention(layout, text_lengths, ["causal"], device=x.device)
            lmax = int(text_lengths.max())
            text = text[:, :lmax].reshape(1, s * lmax, -1)  # (1, S*L, Dt)
        if self.embed is not None:
            sample = pack.token_sample if pack is not None else None  # (length,)
            h = self.embed_inputs(x, rope, text_in, text_lengths, token_sample=sample)
        else:
            h = x  # (B, N, D) from the previous stage
        text = text.to(h.dtype)
        if spec is None:  # batched
            spec = self.attention_spec(text)
        for block in self.blocks.values():
            h = block(h, text, rope, spec=spec)  # (B, N, D)
        if self.head is None:
            return h
        return self.head(self.norm(h))  # (B, N, V)

    def attention_spec(self, text: torch.Tensor) -> AttentionSpec:
        """The attention spec of a batched forward: the real tokens of zero-padded captions
        (B, L, Dt) for cross-attention."""
        return AttentionSpec(mask=caption_mask(text) if self.cfg.cross_attention else None)

    def embed_inputs(
        self,
        ids: torch.Tensor,  # (B, n)
        rope: torch.Tensor,  # (n, d/2)
        text: torch.Tensor | None = None,  # (B | S, L, Dt)
        text_lengths: torch.Tensor | None = None,  # (B | S,)
        *,
        token_sample: torch.Tensor | None = None,  # (n,) packs: the sample of every input
    ) -> torch.Tensor:
        """Input ids (B, n) -> (B, n, D): the token embedding, plus the absolute position
        embedding of the n positions' RoPE angles rope (n, d/2) when ``model.abs_pos`` > 0,
        plus the pooled caption's embedding (``text_conditioning='pooled'``)."""
        h = self.embed(ids)  # (B, n, D)
        # each term a sequence like the embedding's, so the parallel engine cuts them alike
        if self.pos_embed is not None:
            feats = torch.cat([rope.sin(), rope.cos()], dim=-1)[None]  # (1, n, d) fixed sin-cos
            h = h + self.pos_embed(feats.to(self.pos_embed.weight.dtype))  # + (1, n, D)
        if self.text_embedder is not None:
            if text is None:
                raise ShapeError("pooled text conditioning: embed_inputs needs the caption")
            tokens = token_sample if token_sample is not None else ids.shape[1]
            h = h + self.text_embedder(text, text_lengths, tokens=tokens)  # (B | 1, n, D)
        return h

    def packed_inputs(self, ids: torch.Tensor, layout: PackLayout) -> torch.Tensor:
        """(length,) target ids of a pack -> (length,) inputs: BOS at every sample's start (and
        on padding), else the previous token."""
        dev = ids.device
        sample = layout.sample_ids.to(dev)  # (length,) -1 = padding
        starts = torch.zeros(layout.length, dtype=torch.bool, device=dev)
        starts[layout.cu_seqlens[:-1].long().to(dev)] = True
        prev = torch.cat([ids.new_full((1,), self.bos), ids[:-1]])  # (length,)
        return torch.where(starts | (sample < 0), self.bos, prev)

    def forward_packed(
        self,
        ids: torch.Tensor,  # (length,) target ids of the pack, padding any valid id
        text: torch.Tensor,  # (S, L, Dt) captions
        text_lengths: torch.Tensor,  # (S,) valid caption tokens
        layout: PackLayout,
    ) -> torch.Tensor:
        """:meth:`forward` of one pack given as ids (length,) -> logits (length, V)."""
        return self(ids[None], text, text_lengths=text_lengths, layout=layout)[0]

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
