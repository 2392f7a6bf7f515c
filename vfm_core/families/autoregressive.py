"""The autoregressive family: a causal video transformer (``model.arch='ar'``) over the token
ids of a discrete tokenizer, trained on next-token cross-entropy.

* :class:`NextTokenObjective`: caption dropout only; the model sees the token ids; the
  per-sample loss is the mean next-token cross-entropy in nats per token (vocabulary-parallel
  logits under tensor parallelism: :meth:`NextTokenObjective.context`).
* :class:`AutoregressiveFamily`: the network, that objective, its own FLOP and parameter terms
  (token embedding, output head, causal attention counted over the lower triangle), the logits'
  activations, the causal ring as its only context-parallel mode, synthetic token ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from vfm_core.config import DataConfig, ModelConfig
from vfm_core.data.samples import TrainBatch
from vfm_core.families.family import Family
from vfm_core.families.objective import Microbatch, Objective
from vfm_core.families.terms import (
    Term,
    cross_terms,
    matmul_flops,
    mlp_flops,
    pooled_text_params,
    self_attention_terms,
)
from vfm_core.geometry import Grid, per_sample_mean
from vfm_core.models.ar import CausalVideoTransformer
from vfm_core.tokenizer.synthetic_tokens import SyntheticTokens


class NextTokenObjective(Objective):
    """Next-token cross-entropy over discrete video tokens (module docstring)."""

    def context(self):
        """Under tensor parallelism the head's logits are sharded over the vocabulary (a
        DTensor): the cross-entropy reduces across the TP ranks without gathering them."""
        return loss_parallel() if self.tensor_parallel else contextlib.nullcontext()

    def batched(self, batch: TrainBatch, *, step: int, weight: float) -> Microbatch:
        b = self.local_batch
        ids = batch.values.to(self.device)  # (n, T, H, W) token ids
        n = ids.shape[0]
        keep = self.draws.keep_caption(step, b, self.cfg.diffusion.cond_dropout)[:n]
        text = self.drop_captions(batch.text.to(self.device), keep.to(self.device))
        return Microbatch(
            inputs=ids,
            kwargs={"text": text, "grid": tuple(ids.shape[1:])},
            target=ids.flatten(1),  # (n, N)
            weight=torch.full((n,), weight, device=self.device),
        )

    def packed(self, pack: TrainBatch, *, step: int, weight: float) -> Microbatch:
        dev = self.device
        _, _, keep = self.pack_draws(pack, step, noise=False)
        (layout,) = pack.layouts  # type: ignore[misc]
        ids = pack.values[0].to(dev)  # (length,) padding id 0 (ignored)
        text, lengths = self.drop_captions(
            pack.text.to(dev), keep.to(dev), pack.text_lengths.to(dev)
        )
        return Microbatch(
            inputs=ids[None],
            kwargs={"text": text, "text_lengths": lengths, "layout": layout},
            target=ids,
            weight=torch.full((pack.n_samples,), weight, device=dev),
            layout=layout,
        )

    def loss(self, output: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        return next_token_loss(output, mb)


def next_token_loss(output: torch.Tensor, mb: Microbatch) -> torch.Tensor:
    """sum_s weight_s * mean next-token cross-entropy over the sample's tokens (nats per token);
    ``output``: logits (b, N, V) | (1, length, V), vocabulary-sharded DTensor under TP."""
    logits = output.flatten(0, -2)  # (tokens, V)
    if not isinstance(logits, DTensor):
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    ce = F.cross_entropy(logits, mb.target.flatten(), reduction="none")  # (tokens,)
    if isinstance(ce, DTensor):  # replicated over the TP ranks
        ce = ce.full_tensor()
    if mb.layout is None:
        per_sample = ce.view(mb.target.shape).mean(1)  # (b,)
    else:
        ids = mb.layout.sample_ids.to(ce.device)
        per_sample = per_sample_mean(ce, ids, mb.layout.n_samples)  # (S,)
    return (per_sample * mb.weight).sum()


def _position_params(cfg: ModelConfig) -> int:
    """The absolute-position projection head_dim -> D (``abs_pos`` > 0), else 0."""
    return cfg.head_dim * cfg.hidden if cfg.abs_pos else 0


class AutoregressiveFamily(Family):
    name = "autoregressive"
    model_cls = CausalVideoTransformer
    objective_cls = NextTokenObjective

    def flop_terms(
        self, cfg: ModelConfig, lens: list[int], grid: Grid | Sequence[Grid] | None, L: float
    ) -> list[Term]:
        """Every matmul of the causal video transformer's forward (models/ar.py). The token
        embedding is a lookup (no matmul); causal attention is counted once, over the lower
        triangle with its diagonal: 4·Dq·S(S+1)/2 per sample of S tokens (a kernel that
        computes the full square and masks it does twice that work, which model FLOPs do not
        reward)."""
        n, b = float(sum(lens)), float(len(lens))
        inner = cfg.heads * cfg.head_dim
        terms = []
        for _ in range(cfg.depth):
            terms += self_attention_terms(cfg, n, sum(2.0 * s * (s + 1) * inner for s in lens))
            terms += cross_terms(cfg, n, b, L)
            terms.append(Term("mlp", mlp_flops(cfg, n), True))
        if not cfg.cross_attention:  # the pooled caption's projection, on the embedding
            terms.append(Term("text_embed", matmul_flops(b, cfg.text_dim, cfg.hidden), False))
        terms.append(Term("head", matmul_flops(n, cfg.hidden, cfg.vocab_size), True))
        return terms

    def conditioning_flops(self, cfg: ModelConfig, timestep_embed: float) -> float:
        return timestep_embed  # no timestep, no AdaLN

    def block_norm_params(self, cfg: ModelConfig, sublayers: int) -> int:
        return sublayers * cfg.hidden  # affine RMSNorms, no AdaLN

    def nonblock_params(self, cfg: ModelConfig) -> int:
        """Token embedding with BOS, positions, the pooled caption's projection, final RMSNorm,
        output head."""
        v, d = cfg.vocab_size, cfg.hidden
        return (v + 1) * d + _position_params(cfg) + pooled_text_params(cfg) + d + d * v

    def stage_nonblock_params(self, cfg: ModelConfig, *, stage: int, stages: int, tp: int) -> float:
        """The first stage's token embedding (split over the vocabulary), positions and caption
        projection; the last stage's final norm and head (split over the vocabulary)."""
        v, d = cfg.vocab_size, cfg.hidden
        first = (v + 1) * d / tp + _position_params(cfg) + pooled_text_params(cfg)
        total = first if stage == 0 else 0
        return total + (d * v / tp + d if stage == stages - 1 else 0)

    def output_activation_bytes(
        self, cfg: ModelConfig, *, tokens: float, tp: int, act_bytes: float
    ) -> float:
        """The logits: bf16 out of the head, fp32 in the cross-entropy and its gradient;
        sharded over the vocabulary by tp, gathered over cp (the loss sees them all)."""
        return tokens * cfg.vocab_size / tp * (act_bytes + 4 + 4)

    def layout_reason(self, cfg: ModelConfig, *, cp: int, cp_mode: str) -> str | None:
        if cp > 1 and cp_mode != "ring":
            return "the autoregressive family's context parallelism is a balanced causal ring"
        return None

    def synthetic_source(self, data: DataConfig, model: ModelConfig, *, sigma_data: float):
        return SyntheticTokens(data, model)

    def tokenizer_channels(self, model: ModelConfig) -> int | None:
        return None  # the FSQ codes of a discrete tokenizer: its levels make the vocabulary


AUTOREGRESSIVE = AutoregressiveFamily()
