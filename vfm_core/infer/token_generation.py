"""The autoregressive family's inference: token ids drawn one latent position at a time with a KV
cache (:func:`vfm_core.infer.ar_sample.sample_tokens`), optionally continuing a token prompt whose
prefill is split over the ranks (:mod:`vfm_core.infer.ar_prefill`), decoded by the run's discrete
tokenizer (or previewed through the synthetic FSQ grid); evaluated by the held-out bits per token
(:func:`heldout_bits`).

:class:`TokenGeneration` is what :mod:`vfm_core.infer.generation` asks of it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from vfm_core.config import Config
from vfm_core.families import AUTOREGRESSIVE
from vfm_core.infer.ar_prefill import SplitPrefill, load_prompt, sync_tokens
from vfm_core.infer.ar_sample import (
    SamplingConfig,
    SamplingError,
    draw,
    local_prefill,
    sample_tokens,
)
from vfm_core.infer.budget import CostEstimate, estimate_ar
from vfm_core.infer.decoders import load_token_decoder
from vfm_core.infer.generation import Generation, Sampled
from vfm_core.infer.progress import Progress
from vfm_core.infer.shapes import GenerateError, LatentPlan
from vfm_core.progress import Progress as LoggedProgress
from vfm_core.tokenizer.fsq import FSQ
from vfm_core.tokenizer.synthetic_tokens import synthetic_levels

if TYPE_CHECKING:
    from vfm_core.checkpoints.load import LoadedDiT
    from vfm_core.infer.evaluate import EvalConfig
    from vfm_core.infer.request import GenerateRequest
    from vfm_core.tokenizer.config import TokenizerConfig

__all__ = ["TokenGeneration", "heldout_bits"]

_log = logging.getLogger(__name__)


@torch.no_grad()
def heldout_bits(
    model: torch.nn.Module,
    cfg: Config,
    tokens: torch.Tensor,
    text: torch.Tensor,
    ec: EvalConfig,
    *,
    desc: str = "held-out loss",
) -> dict[str, float]:
    """Autoregressive family: next-token cross-entropy of held-out token grids ``tokens``
    (N, T, H, W) with captions ``text`` (N, L, Dt) in nats (``heldout_loss``) and in bits per
    token (``heldout_bits_per_token``; log2 of the vocabulary for a uniform guess)."""
    from vfm_core.models.ar import next_token_loss

    total = 0.0
    bar = LoggedProgress(len(tokens), desc=desc, unit="sample", logger=_log)
    for i in range(0, len(tokens), ec.batch):
        ids, t = tokens[i : i + ec.batch], text[i : i + ec.batch]
        logits = model(ids, t)  # (b, N, V)
        total += next_token_loss(logits, ids.flatten(1)).item() * len(ids)
        bar.update(len(ids))
    bar.close()
    nats = total / len(tokens)
    return {
        "heldout_loss": nats,
        "heldout_bits_per_token": nats / math.log(2),
        "uniform_bits_per_token": math.log2(cfg.model.vocab_size),
    }


class TokenGeneration(Generation):
    """Token ids drawn position by position (module docstring)."""

    family = AUTOREGRESSIVE
    token_prompt = True

    def check_request(self, cfg: Config, request: GenerateRequest) -> None:
        self._refuse(
            cfg,
            request,
            ("steps",),
            "denoising steps of diffusion runs",
            "draws one token per latent position: --temperature, --top-k, --top-p, --guidance",
        )

    def latent_channels(self, cfg: Config, tok: TokenizerConfig | None) -> int:
        return tok.latent_channels if tok else len(synthetic_levels(cfg.model))

    def latent_split(self, world: int) -> int:
        return 1  # the split pads the prompt: any token count works

    def load_decoder(self, cfg: Config, path: Any) -> Any:
        return load_token_decoder(path, vocab_size=cfg.model.vocab_size)  # FSQ grid = vocabulary

    def prompt(
        self, cfg: Config, request: GenerateRequest, decoder: Any, plan: LatentPlan, s: int
    ) -> torch.Tensor | None:
        return load_prompt(
            tokens=request.prompt_tokens,
            video=request.prompt_video or request.prompt_image,  # an image: a 1-frame video
            frames=request.prompt_frames,
            grid=tuple(plan.latent[1:]),
            vocab_size=cfg.model.vocab_size,
            tokenizer=decoder,
            spatial_factor=s,
        )

    def estimate(
        self,
        cfg: Config,
        request: GenerateRequest,
        plan: LatentPlan,
        *,
        steps: int,
        guidance: float,
        dtype_bytes: int,
        **common: Any,
    ) -> CostEstimate:
        given = any(p is not None for p in (request.prompt_tokens, request.prompt_video))
        given = given or request.prompt_image is not None
        n, hw = math.prod(plan.latent[1:]), math.prod(plan.latent[2:])
        p = min(max(request.prompt_frames, 0) * hw, n) if given else 0  # checked later
        return estimate_ar(
            cfg.model, plan, guidance=guidance, prompt_tokens=p, dtype_bytes=dtype_bytes, **common
        )

    @torch.no_grad()
    def probe_call(
        self, loaded: LoadedDiT, request: GenerateRequest, plan: LatentPlan, *, guidance: float
    ) -> Callable[[], Any]:
        model = loaded.model
        rows = 1 if guidance == 1.0 else 2  # as sample_tokens: cond and uncond in one batch
        grid = tuple(plan.latent[1:])
        mid = math.prod(grid) // 2
        device = next(model.parameters()).device
        text = torch.zeros(rows, loaded.cfg.model.text_len, loaded.cfg.model.text_dim)
        text = text.to(device)  # (B, L, Dt)
        rope = model.rope(grid, device)  # (N, d/2)
        caches = model.new_caches(mid + 2)
        bos = torch.full((rows, 1), model.bos, dtype=torch.long, device=device)
        model.forward_ids(bos, text, rope[:1], caches=caches)  # allocates the caches
        for c in caches:  # keys and values of positions < mid: zeros cost what the real ones do
            c.k.zero_()
            c.v.zero_()
        sampling = SamplingConfig(
            temperature=request.temperature, top_k=request.top_k, top_p=request.top_p
        )
        gen = torch.Generator().manual_seed(0)
        ids = torch.zeros(rows, 1, dtype=torch.long, device=device)

        def step() -> torch.Tensor:  # the token at position mid, its draw included
            for c in caches:
                c.length = mid
            return draw(
                model.forward_ids(ids, text, rope[mid : mid + 1], caches=caches)[:, -1],
                sampling,
                gen,
            )

        return step

    def sample(
        self,
        loaded: LoadedDiT,
        request: GenerateRequest,
        plan: LatentPlan,
        *,
        text: torch.Tensor,
        null: torch.Tensor,
        prompt: torch.Tensor | None,
        decoder: Any,
        steps: int,
        guidance: float,
        show: bool,
        world: int,
    ) -> Sampled:
        sampling = SamplingConfig(
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            guidance=guidance,
            seed=request.seed,
        )
        device = next(loaded.model.parameters()).device
        # ranks > 1: the prompt's prefill split over them (no prompt: nothing to split)
        prefill = SplitPrefill(device.type) if world > 1 and prompt is not None else local_prefill
        total = math.prod(plan.latent[1:]) - (prompt.shape[1] if prompt is not None else 0)
        bar = Progress(total, desc="sampling tokens", unit="token", enabled=show)
        try:
            with bar:
                tokens = sample_tokens(
                    loaded.model,
                    text,
                    tuple(plan.latent[1:]),
                    sampling,
                    null_text=null,
                    prompt=prompt,
                    prefill=prefill,
                    progress=lambda done: bar.update(done - bar.n),
                )
        except SamplingError as e:
            raise GenerateError(str(e)) from None
        tokens = sync_tokens(tokens)  # (1, T', h, w), rank 0's on every rank
        return Sampled(
            latent=self.codes(loaded.cfg, decoder, tokens),  # (1, C, T', h, w) codes
            tokens=tokens,
            ranks=world,
            steps=math.prod(plan.latent[1:]),  # one model call per token
        )

    def codes(self, cfg: Config, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        """FSQ codes (B, C, T', h, w) of token ids (B, T', h, w): the tokenizer's quantiser, or
        the synthetic levels of the model without one."""
        fsq = decoder.fsq if decoder is not None else FSQ(synthetic_levels(cfg.model))
        return fsq.indices_to_codes(values).movedim(-1, 1)

    def decode(self, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        return decoder.decode_tokens(values)

    def heldout(
        self,
        model: torch.nn.Module,
        cfg: Config,
        values: torch.Tensor,
        text: torch.Tensor,
        ec: EvalConfig,
        *,
        desc: str = "held-out loss",
    ) -> dict[str, float]:
        return heldout_bits(model, cfg, values, text, ec, desc=desc)

    def eval_batch(self, ec: EvalConfig) -> int:
        return ec.sample_batch  # one position per call: a larger batch amortises the calls

    def eval_draws(
        self,
        model: torch.nn.Module,
        cfg: Config,
        ec: EvalConfig,
        null: torch.Tensor,
        shape: torch.Size,
        *,
        guidance: float,
    ) -> Callable[..., torch.Tensor]:
        sampling = SamplingConfig(temperature=ec.temperature, top_k=ec.top_k, guidance=guidance)

        def draw(i: int, text: torch.Tensor, prompt: torch.Tensor | None = None) -> torch.Tensor:
            seeded = dataclasses.replace(sampling, seed=ec.seed + 1 + i)  # each call apart
            first = None if prompt is None else prompt.flatten(1)  # (b, K*H*W) raster order
            return sample_tokens(  # (b, T, H, W) token ids
                model, text, tuple(shape[1:]), seeded, prompt=first, null_text=null
            )

        return draw
