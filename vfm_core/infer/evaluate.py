"""Does a run learn? Held-out EDM loss at fixed noise levels and a Fréchet distance between
generated and held-out clips in the built-in clip embedder's feature space, logged to MLflow; for
the autoregressive family the held-out bits per token (:func:`heldout_bits`).

* **Held-out loss** (:func:`heldout_loss`): the EDM loss (Karras et al. 2022, eq. 2 with the
  weighting of Table 1, :meth:`vfm_core.diffusion.edm.EDM.loss`) of held-out latents at each of
  ``sigmas`` with noise drawn from a fixed seed, so two checkpoints see exactly the same inputs.
  Held-out data: the run's own data source re-seeded with ``heldout_seed`` (synthetic latents:
  samples never drawn in training), or ``heldout_shards`` for shard-trained runs.
* **Fréchet distance** (:func:`frechet_distance`; Heusel et al. 2017 "GANs trained by a two
  time-scale update rule", eq. 6, used for videos as FVD by Unterthiner et al. 2018):
  ``|mu_a - mu_b|^2 + Tr(S_a + S_b - 2 (S_a^1/2 S_b S_a^1/2)^1/2)`` between the clip embeddings
  (:func:`vfm_core.annotate.embed.clip_embedding` with the built-in ``ColorThumbEmbedder``: colour
  histogram + thumbnail, no downloaded weights) of videos generated from the held-out captions and
  of the held-out clips themselves. Both sides go through the same decoder (the tokenizer, or the
  latent preview at one fixed scale for runs without one), so the tokenizer's own reconstruction
  error cancels and the distance measures the DiT alone. Matrix square roots use symmetric
  eigendecompositions in float64 (exact for the rank-deficient covariances of few samples).
  With few clips the estimate is dominated by sampling: ``fd_data_halves``, the distance between
  two halves of the held-out clips themselves, shows the floor that sample size allows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vfm_core.config import Config
from vfm_core.diffusion.edm import create_diffusion
from vfm_core.infer.dit_checkpoint import LoadedDiT, load_dit
from vfm_core.infer.generate import PREVIEW_FACTORS, load_decoder, sample_latent
from vfm_core.infer.video_out import latent_preview, to_uint8_frames
from vfm_core.progress import Progress
from vfm_core.tokenizer.sources import make_source

__all__ = [
    "EvalConfig",
    "evaluate",
    "frechet_distance",
    "heldout_bits",
    "heldout_loss",
    "log_evaluation",
]

_log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    """What :func:`evaluate` measures."""

    sigmas: tuple[float, ...] = (0.02, 0.1, 0.3, 1.0, 3.0, 10.0)
    """Fixed noise levels of the held-out loss."""
    loss_samples: int = 32
    """Held-out latents for the loss."""
    fd_samples: int = 16
    """Clips generated (and held-out clips embedded) for the Fréchet distance."""
    steps: int = 12
    """Sampler steps of the generated clips."""
    guidance: float | None = None
    """Guidance of the generated clips (None = the run's ``diffusion.guidance``)."""
    batch: int = 8
    """Latents per forward pass."""
    seed: int = 1234
    """Seed of the loss noise and of the generation noise."""
    heldout_seed: int = 1_000_003
    """``data.seed`` of the held-out stream (the run trains on its own ``data.seed``)."""
    heldout_shards: str = ""
    """Held-out shard directory for shard-trained runs ('' = the run's shards, re-seeded)."""
    frames_per_clip: int = 4
    """Frames per clip averaged by the clip embedder."""
    untrained_baseline: bool = True
    """Also measure the run's initialisation (same seed, data and noise): ``fd_ratio_untrained``
    (untrained FD / trained FD) and ``loss_reduction`` (1 - trained / untrained held-out loss)."""
    prompt_following: int = 40
    """Also generate one clip for each of this many vocabulary prompts (:func:`~vfm_core.infer.
    prompt_follow.vocabulary_prompts`: 40 = all, the held-out combinations included; 0 = none)
    at the run's latent grid and read colour and direction back from the pixels:
    ``prompt_colour_acc``, ``prompt_direction_acc`` (``..._held_out`` for the held-out
    combinations), for the trained model and its initialisation (``untrained_prompt_...``).
    Needs a tokenizer and the run's text record."""
    contact_sheet: str = ""
    """PNG path for the clips of the vocabulary prompts (one row each; '' = none)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form tags recorded with the metrics."""


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Fréchet distance between Gaussians fitted to feature sets a (N, D) and b (M, D)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1] or min(len(a), len(b)) < 2:
        raise ValueError(
            f"frechet_distance: need two (N>=2, D) feature sets of one width, got {a.shape} and "
            f"{b.shape}"
        )
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)  # (D, D)

    def psd_sqrt(m: np.ndarray) -> np.ndarray:
        w, v = np.linalg.eigh((m + m.T) / 2)
        return (v * np.sqrt(np.clip(w, 0, None))) @ v.T

    r = psd_sqrt(s_a)
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(r @ s_b @ r), 0, None)).sum()  # Tr((.)^1/2)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(s_a) + np.trace(s_b) - 2 * cross)


def _heldout_batches(
    cfg: Config, ec: EvalConfig, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n held-out (latents (n, C, T, H, W), text (n, L, Dt)) from the run's data source, and its
    null caption (1, L, Dt) (zeros for sources without a text record)."""
    data = dataclasses.replace(cfg.data, seed=ec.heldout_seed, batch_size=ec.batch)
    if ec.heldout_shards:
        data = dataclasses.replace(data, shards=ec.heldout_shards)
    source = make_source(data, cfg.model, sigma_data=cfg.diffusion.sigma_data)
    lat, txt = [], []
    while sum(len(x) for x in lat) < n:
        b = source.next_batch()
        lat.append(b.values)
        txt.append(b.text)
    null = getattr(source, "null_text", None)  # (L, Dt) or None
    m = cfg.model
    null = torch.zeros(1, m.text_len, m.text_dim) if null is None else null[None].float()
    return torch.cat(lat)[:n].float(), torch.cat(txt)[:n].float(), null


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
    bar = Progress(len(ec.sigmas) * len(latents), desc=desc, unit="sample", logger=_log)
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


@torch.no_grad()
def heldout_bits(model: torch.nn.Module, cfg: Config, ec: EvalConfig) -> dict[str, float]:
    """Autoregressive family: next-token cross-entropy of ``ec.loss_samples`` held-out token
    grids (the run's source re-seeded, as for the DiT loss) in nats (``heldout_loss``) and in bits
    per token (``heldout_bits_per_token``; log2 of the vocabulary for a uniform guess)."""
    from vfm_core.models.ar import next_token_loss

    data = dataclasses.replace(cfg.data, seed=ec.heldout_seed, batch_size=ec.batch)
    if ec.heldout_shards:
        data = dataclasses.replace(data, shards=ec.heldout_shards)
    source = make_source(data, cfg.model)
    total, count = 0.0, 0
    bar = Progress(ec.loss_samples, desc="held-out loss", unit="sample", logger=_log)
    while count < ec.loss_samples:
        b = source.next_batch()  # token ids (B, T, H, W)
        logits = model(b.token_ids, b.text.float())  # (B, N, V)
        total += next_token_loss(logits, b.token_ids.flatten(1)).item() * b.n_samples
        count += b.n_samples
        bar.update(b.n_samples)
    bar.close()
    nats = total / count
    return {
        "heldout_loss": nats,
        "heldout_bits_per_token": nats / math.log(2),
        "uniform_bits_per_token": math.log2(cfg.model.vocab_size),
    }


def _clip_features(videos: torch.Tensor, frames_per_clip: int) -> np.ndarray:
    """(N, 3, F, H, W) in [-1, 1] -> (N, 448) clip embeddings of the built-in embedder."""
    from vfm_core.annotate.embed import ColorThumbEmbedder, clip_embedding

    emb = ColorThumbEmbedder()
    return np.stack([clip_embedding(emb, to_uint8_frames(v), n=frames_per_clip) for v in videos])


def evaluate(
    checkpoint: str | Path | LoadedDiT,
    *,
    tokenizer: str | Path | None = None,
    config: EvalConfig | None = None,
) -> dict[str, float]:
    """Held-out loss and Fréchet distance of a checkpoint (see the module docstring)."""
    ec = config or EvalConfig()
    loaded = checkpoint if isinstance(checkpoint, LoadedDiT) else load_dit(checkpoint)
    cfg, model = loaded.cfg, loaded.model
    if cfg.model.arch == "ar":  # the autoregressive family: held-out bits per token
        return {**heldout_bits(model, cfg, ec), "checkpoint_step": float(loaded.step)}
    n = max(ec.loss_samples, ec.fd_samples)
    latents, text, null = _heldout_batches(cfg, ec, n)  # (n, C, T, H, W), (n, L, Dt), (1, L, Dt)
    metrics = heldout_loss(model, cfg, latents[: ec.loss_samples], text[: ec.loss_samples], ec)

    tok_path = tokenizer or cfg.data.tokenizer or None
    decoder = load_decoder(tok_path, latent_channels=cfg.model.in_channels) if tok_path else None
    ref = latents[: ec.fd_samples]  # (m, C, T, H, W)
    scale = float(ref.std()) * 2  # one fixed preview scale for both sides

    def decode(z: torch.Tensor) -> torch.Tensor:
        if decoder is not None:
            with torch.no_grad():
                return torch.cat(
                    [decoder.decode(z[i : i + ec.batch]) for i in range(0, len(z), ec.batch)]
                )
        t_c, s = PREVIEW_FACTORS
        return latent_preview(z, temporal_factor=t_c, spatial_factor=s, scale=scale)

    ref_features = _clip_features(decode(ref), ec.frames_per_clip)

    def fd_of(m: torch.nn.Module, which: str) -> float:
        desc = f"FD clips ({which})"
        fake = _generate(m, cfg, ec, text[: ec.fd_samples], null, ref.shape, desc=desc)
        return frechet_distance(_clip_features(decode(fake), ec.frames_per_clip), ref_features)

    metrics["frechet_distance"] = fd_of(model, "trained")
    metrics["fd_samples"] = float(len(ref))
    half = len(ref_features) // 2
    if half >= 2:  # what sampling alone gives: the data against itself, half vs half
        metrics["fd_data_halves"] = frechet_distance(
            ref_features[:half], ref_features[half : 2 * half]
        )
    metrics["checkpoint_step"] = float(loaded.step)
    follow = ec.prompt_following > 0 and decoder is not None and loaded.text is not None
    if follow:
        metrics.update(
            _prompt_following(
                model,
                cfg,
                ec,
                loaded.text,
                null,
                decode,
                ref.shape[1:],
                sheet=ec.contact_sheet,
                which="trained",
            )
        )
    if ec.untrained_baseline:  # the same measures of the run's initialisation: what training won
        init = _untrained(cfg)
        lat, txt = latents[: ec.loss_samples], text[: ec.loss_samples]
        base = heldout_loss(init, cfg, lat, txt, ec, desc="held-out loss (untrained)")
        metrics["untrained_heldout_loss"] = base["heldout_loss"]
        metrics["untrained_frechet_distance"] = fd_of(init, "untrained")
        if follow:
            untrained = _prompt_following(
                init, cfg, ec, loaded.text, null, decode, ref.shape[1:], which="untrained"
            )
            metrics.update(
                {f"untrained_{k}": v for k, v in untrained.items() if k != "prompt_n_scored"}
            )
        metrics["fd_ratio_untrained"] = metrics["untrained_frechet_distance"] / max(
            metrics["frechet_distance"], 1e-12
        )
        metrics["loss_reduction"] = 1 - metrics["heldout_loss"] / base["heldout_loss"]
    if not all(math.isfinite(v) for v in metrics.values()):
        raise FloatingPointError(f"evaluation produced non-finite metrics: {metrics}")
    return metrics


def _prompt_following(
    model: torch.nn.Module,
    cfg: Config,
    ec: EvalConfig,
    record: dict[str, Any],
    null: torch.Tensor,
    decode: Any,
    grid: tuple[int, ...],
    *,
    sheet: str = "",
    which: str = "trained",
) -> dict[str, float]:
    """Clips of every vocabulary prompt (fixed noise, the run's latent ``grid`` (C, T, H, W)),
    decoded and read back: ``prompt_*`` accuracies (see :class:`EvalConfig`); a contact sheet
    of them at ``sheet`` when given. ``which`` model it is, in the progress lines."""
    from vfm_core.infer.generate import prompt_encoder, text_condition
    from vfm_core.infer.prompt_follow import score_frames, vocabulary_prompts

    prompts = vocabulary_prompts(ec.prompt_following)
    m = cfg.model
    text = torch.cat(
        [
            text_condition(e, text_len=m.text_len, text_dim=m.text_dim)
            for e in prompt_encoder(record).encode(prompts)
        ]
    )  # (n, L, Dt)
    shape = torch.Size((len(prompts), *grid))
    latents = _generate(model, cfg, ec, text, null, shape, desc=f"prompt following ({which})")
    clips = [to_uint8_frames(v) for v in decode(latents)]  # [(F, H, W, 3)]
    if sheet:
        from vfm_core.video.contact_sheet import contact_sheet

        contact_sheet(clips, prompts, sheet)
    return {f"prompt_{k}": v for k, v in score_frames(clips, prompts).items()}


def _untrained(cfg: Config) -> torch.nn.Module:
    """The run's model at initialisation (its seed: the weights every layout of the run started
    from), for the untrained baseline."""
    from vfm_core.models.dit import build_model

    return build_model(cfg.model, device="cpu", seed=cfg.train.seed).eval()


@torch.no_grad()
def _generate(
    model: torch.nn.Module,
    cfg: Config,
    ec: EvalConfig,
    text: torch.Tensor,
    null: torch.Tensor,
    shape: torch.Size,
    *,
    desc: str = "sampling clips",
) -> torch.Tensor:
    """Latents sampled from fixed noise (seed ``ec.seed + 1``) for ``text``: (m, C, T, H, W);
    ``desc`` names the progress lines."""
    guidance = cfg.diffusion.guidance if ec.guidance is None else ec.guidance
    g = torch.Generator().manual_seed(ec.seed + 1)
    noise = torch.randn(shape, generator=g)  # (m, C, T, H, W)
    out = []
    bar = Progress(shape[0], desc=desc, unit="clip", logger=_log)
    for i in range(0, shape[0], ec.batch):
        out.append(
            sample_latent(
                model,
                cfg.diffusion,
                noise[i : i + ec.batch],
                text[i : i + ec.batch],
                steps=ec.steps,
                guidance=guidance,
                null_text=null,
            )
        )
        bar.update(len(out[-1]))
    bar.close()
    return torch.cat(out)


def log_evaluation(
    metrics: dict[str, float],
    *,
    tracking,
    run_id: str | None = None,
    params: dict[str, Any] | None = None,
    artifacts: list[str | Path] = (),
    prefix: str = "eval/",
) -> str:
    """Log ``metrics`` (prefixed), ``params`` and ``artifacts`` to MLflow; returns the run id
    (``run_id`` / $MLFLOW_RUN_ID, else a new run in ``tracking.experiment``)."""
    from vfm_core.train.metrics import MLflowLogger

    created = run_id is None and not os.environ.get("MLFLOW_RUN_ID")
    mlf = MLflowLogger(tracking, run_id=run_id, tags={"vfm.stage": "generate"})
    if params:
        mlf.log_params(params)
    mlf.log(int(metrics.get("checkpoint_step", 0)), {prefix + k: v for k, v in metrics.items()})
    for a in artifacts:
        mlf.log_artifact(a)
    if created:  # a run we opened; a flow's or trainer's run is closed by its owner
        mlf.close("FINISHED")
    return mlf.run_id
