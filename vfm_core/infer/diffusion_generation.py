"""The diffusion family's inference: a latent denoised from seeded noise by the run's ODE sampler
with classifier-free guidance (:func:`sample_latent`), split over context-parallel ranks
(:mod:`vfm_core.infer.context_parallel`), decoded by a continuous tokenizer; evaluated by the EDM
loss of held-out latents at fixed noise levels (:func:`heldout_loss`).

:class:`DiffusionGeneration` is what :mod:`vfm_core.infer.generation` asks of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vfm_core.config import Config, DiffusionConfig
from vfm_core.diffusion.edm import compute_dtype
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.diffusion.sampler import sample
from vfm_core.families import DIFFUSION
from vfm_core.infer.budget import CostEstimate, estimate_dit
from vfm_core.infer.context_parallel import context_parallel_for_sampling
from vfm_core.infer.decoders import load_decoder
from vfm_core.infer.frame_prompt import check_frame_prompt, encode_prompt_frames
from vfm_core.infer.generation import Generation, Sampled
from vfm_core.infer.progress import Progress
from vfm_core.infer.shapes import GenerateError, LatentPlan
from vfm_core.progress import Progress as LoggedProgress

if TYPE_CHECKING:
    from vfm_core.checkpoints.load import LoadedDiT
    from vfm_core.infer.evaluate import EvalConfig
    from vfm_core.infer.request import GenerateRequest
    from vfm_core.tokenizer.config import TokenizerConfig

__all__ = ["DiffusionGeneration", "heldout_loss", "initial_noise", "sample_latent"]

_log = logging.getLogger(__name__)


def initial_noise(latent: tuple[int, ...], seed: int) -> torch.Tensor:
    """Standard normal noise (1, C, T', h, w) for the whole latent from one CPU generator: the
    same tensor on every rank, whatever the rank count (each rank's model sees its token slice)."""
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn((1, *latent), generator=g, dtype=torch.float32)  # (1, C, T', h, w)


def sample_latent(
    model: torch.nn.Module,
    diffusion: DiffusionConfig,
    noise: torch.Tensor,
    text: torch.Tensor,
    *,
    steps: int,
    guidance: float,
    null_text: torch.Tensor | None = None,
    progress: bool = False,
    prompt: torch.Tensor | None = None,
) -> torch.Tensor:
    """ODE sampling (the objective's schedule: Karras for EDM, shifted uniform t for rectified
    flow; the run's Euler / Heun) with CFG in one batch; (1, C, T', h, w). ``null_text``
    (B | 1, L, Dt): the unconditional branch (default zeros). ``progress``: one update per
    denoiser call on stderr once sampling has run a few seconds. ``prompt`` (1, C, K, h, w):
    clean leading latent frames kept as they are (:func:`frame_conditioned`), the video
    continuing them."""
    edm = create_diffusion(diffusion)  # EDM or rectified flow: its own schedule
    sigmas = edm.sampling_sigmas(steps)
    heun = diffusion.sampler == "heun"  # a second call at every step that does not end at 0
    calls = steps + (int((sigmas[1:] != 0).sum()) if heun else 0)
    desc = f"denoising ({steps} {diffusion.sampler} steps)"
    bar = Progress(calls, desc=desc, unit="call", enabled=progress)
    denoise = (
        frame_conditioned(edm, model, prompt, diffusion.sigma_min) if prompt is not None else None
    )

    def denoise_fn(x: torch.Tensor, sigma: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        d = denoise(x, sigma, t) if denoise else edm.denoise(model, x, sigma, t)  # like x
        bar.update()
        return d

    with bar:
        latent = sample(
            denoise_fn,
            noise,
            sigmas=sigmas,
            method=diffusion.sampler,
            text=text,  # (1, L, Dt)
            # (B, L, Dt): what the trainer feeds for dropped captions
            null_text=torch.zeros_like(text) if null_text is None else null_text.expand_as(text),
            guidance=guidance,
        )
    if prompt is not None:  # the given frames exactly
        latent[:, :, : prompt.shape[2]] = prompt.to(latent.dtype)
    return latent


def frame_conditioned(
    edm: Any, model: torch.nn.Module, prompt: torch.Tensor, sigma_clean: float
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The denoiser of a video whose first K latent frames are ``prompt`` (1, C, K, h, w): as
    in frame-conditioned training, those frames enter clean at their own noise level
    ``sigma_clean`` (a level per frame, :meth:`vfm_core.models.dit.DiT.forward`) and come out
    as they are; the others are denoised at the sampler's level."""
    k = prompt.shape[2]
    pt = model.cfg.patch[0]

    def denoise(x: torch.Tensor, sigma: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        dtype = compute_dtype(x.dtype)
        x = x.to(dtype).clone()  # (B, C, T', h, w)
        x[:, :, :k] = prompt.to(dtype)
        sig = torch.as_tensor(sigma, dtype=dtype, device=x.device).reshape(-1)  # (B | 1,)
        level = sig.expand(x.shape[0])[:, None, None, None, None].repeat(1, 1, x.shape[2], 1, 1)
        level[:, :, :k] = sigma_clean  # (B, 1, T', 1, 1)
        c_skip, c_out, c_in, c_noise = edm.precondition(level)
        f = model(c_in * x, c_noise[:, 0, :, 0, 0][:, ::pt].contiguous(), text)  # like x
        d = c_skip * x + c_out * f.to(dtype)
        d[:, :, :k] = prompt.to(dtype)
        return d

    return denoise


@torch.no_grad()
def heldout_loss(
    model: torch.nn.Module,
    cfg: Config,
    latents: torch.Tensor,
    text: torch.Tensor,
    ec: EvalConfig,
    *,
    desc: str = "held-out loss",
) -> dict[str, float]:
    """Mean EDM loss per fixed sigma (keys ``loss_sigma_<s>``) and their mean (``heldout_loss``);
    ``desc`` names its progress lines."""
    edm = create_diffusion(cfg.diffusion)
    g = torch.Generator().manual_seed(ec.seed)
    noise = torch.randn(latents.shape, generator=g)  # (N, C, T, H, W): same for every checkpoint
    out: dict[str, float] = {}
    bar = LoggedProgress(len(ec.sigmas) * len(latents), desc=desc, unit="sample", logger=_log)
    for s in ec.sigmas:
        total = 0.0
        for i in range(0, len(latents), ec.batch):
            x0, t, e = latents[i : i + ec.batch], text[i : i + ec.batch], noise[i : i + ec.batch]
            sigma = torch.full((len(x0),), float(s))  # (b,)
            total += edm.loss(model, x0, t, sigma=sigma, noise=e).sum().item()
            bar.update(len(x0))
        out[f"loss_sigma_{s:g}"] = total / len(latents)
    bar.close()
    out["heldout_loss"] = float(np.mean([out[f"loss_sigma_{s:g}"] for s in ec.sigmas]))
    return out


class DiffusionGeneration(Generation):
    """Denoised latents (module docstring)."""

    family = DIFFUSION

    def check_request(self, cfg: Config, request: GenerateRequest) -> None:
        if request.prompt_tokens is not None:
            raise GenerateError(
                "--prompt-tokens: only autoregressive runs continue a token prompt; this run's "
                f"model.arch is {cfg.model.arch!r} (give --prompt-video or --prompt-image)"
            )
        check_frame_prompt(cfg, request)
        self._refuse(
            cfg,
            request,
            ("temperature", "top_k", "top_p"),  # the token draws' settings
            "token sampling settings of autoregressive runs",
            "takes --steps and --guidance",
        )

    def latent_channels(self, cfg: Config, tok: TokenizerConfig | None) -> int:
        return cfg.model.in_channels

    def latent_split(self, world: int) -> int:
        return world  # each rank denoises a contiguous slice of the tokens

    def load_decoder(self, cfg: Config, path: Any) -> Any:
        return load_decoder(path, latent_channels=cfg.model.in_channels)

    def prompt(
        self, cfg: Config, request: GenerateRequest, decoder: Any, plan: LatentPlan, s: int
    ) -> torch.Tensor | None:
        path = request.prompt_video or request.prompt_image
        if path is None:
            return None
        flag = "--prompt-video" if request.prompt_video else "--prompt-image"
        return encode_prompt_frames(
            Path(path), flag, frames=request.prompt_frames, plan=plan, tokenizer=decoder, s=s
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
        return estimate_dit(
            cfg.model,
            plan,
            steps=steps,
            sampler=cfg.diffusion.sampler,
            guidance=guidance,
            dtype_bytes=dtype_bytes,
            **common,
        )

    def time_flags(self, steps: int) -> tuple[str, ...]:
        return () if steps == 1 else ("--steps",)

    @torch.no_grad()
    def probe_call(
        self, loaded: LoadedDiT, request: GenerateRequest, plan: LatentPlan, *, guidance: float
    ) -> Callable[[], Any]:
        rows = 1 if guidance in (0.0, 1.0) else 2  # guided: cond and uncond in one batch
        device = next(loaded.model.parameters()).device
        model = loaded.cfg.model
        noise = torch.Generator().manual_seed(0)  # the global RNG left as it was
        x = torch.randn(rows, *plan.latent, generator=noise).to(device)  # (B, C, T', h, w)
        text = torch.zeros(rows, model.text_len, model.text_dim, device=device)  # (B, L, Dt)
        sigma = torch.ones(rows, device=device)  # (B,)
        edm = create_diffusion(loaded.cfg.diffusion)
        return lambda: edm.denoise(loaded.model, x, sigma, text)

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
        ranks = context_parallel_for_sampling(loaded.model, arch=loaded.cfg.model.arch)
        noise = initial_noise(plan.latent, request.seed)  # (1, C, T', h, w), global
        latent = sample_latent(
            loaded.model,
            loaded.cfg.diffusion,
            noise,
            text,
            steps=steps,
            guidance=guidance,
            null_text=null,
            progress=show,
            prompt=prompt,
        )
        return Sampled(latent=latent, ranks=ranks, steps=steps)

    def codes(self, cfg: Config, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        return values  # already the latent

    def decode(self, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        return decoder.decode(values.float())

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
        return heldout_loss(model, cfg, values, text, ec, desc=desc)

    def eval_batch(self, ec: EvalConfig) -> int:
        return ec.batch

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
        noise = torch.randn(shape, generator=torch.Generator().manual_seed(ec.seed + 1))

        def draw(i: int, text: torch.Tensor, prompt: torch.Tensor | None = None) -> torch.Tensor:
            return sample_latent(  # (b, C, T, H, W)
                model,
                cfg.diffusion,
                noise[i : i + len(text)],
                text,
                steps=ec.steps,
                guidance=guidance,
                null_text=null,
                prompt=prompt,  # (b, C, K, H, W) | None
            )

        return draw
