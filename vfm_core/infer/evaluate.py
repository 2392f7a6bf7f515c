"""Does a run learn? Held-out EDM loss at fixed noise levels and a Fréchet distance between
generated and held-out clips in the built-in clip embedder's feature space, logged to MLflow; for
the autoregressive family the held-out bits per token (:func:`heldout_bits`) in place of the EDM
loss, and the same Fréchet distance, prompt following and untrained baseline of clips sampled
token by token (:func:`vfm_core.infer.ar_sample.sample_tokens`) and decoded by the discrete
tokenizer: one evaluation for both families, the model's sampler the only difference (the
family's :class:`~vfm_core.infer.generation.Generation`: its held-out metric, clip draws and
decoding; :func:`heldout_loss` and :func:`heldout_bits` live with it and are re-exported here).

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

from vfm_core.checkpoints.load import LoadedDiT, load_dit
from vfm_core.config import Config, ConfigError
from vfm_core.families.sources import make_source
from vfm_core.infer.diffusion_generation import heldout_loss
from vfm_core.infer.family_generation import generation_of
from vfm_core.infer.request import PREVIEW_FACTORS
from vfm_core.infer.token_generation import heldout_bits
from vfm_core.infer.video_out import latent_preview, to_uint8_frames
from vfm_core.progress import Progress

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
    sample_batch: int = 32
    """Clips per call of the autoregressive sampler: it runs one position per call, so a larger
    batch amortises the per-call overhead (32: ~19 clips/s against ~11 at 8 for ar-tiny with
    guidance, measured here). The DiT samples ``batch`` clips per call."""
    temperature: float = 1.0
    """Autoregressive family: softmax temperature of the token draws (0 = greedy)."""
    top_k: int = 0
    """Autoregressive family: draw among the k most likely tokens (0 = all)."""
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
    concept: str = ""
    """A new colour a fine-tuning run learned (``vfm sample --concept``): also one clip for each
    of its prompts (every shape and direction), read back as ``concept_colour_acc``,
    ``concept_direction_acc`` ('' = none)."""
    concept_draws: int = 3
    """Clips of each concept prompt, from different noise (3 x 8 prompts: accuracies in steps of
    1/24, not 1/8)."""
    frame_prompts: int = 0
    """Also continue this many held-out clips from their first latent frame (image-to-video:
    the frame kept as given, its clip's caption; ``diffusion.frame_cond`` trains it) and read
    the object back from the pixels of both: ``frame_colour_kept`` (the continuation shows the
    given object's colour) and ``frame_motion_kept`` (it moves the way the held-out clip does);
    0 = none. Needs a tokenizer."""
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


def heldout_batches(
    cfg: Config, ec: EvalConfig, n: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """n held-out (latents (n, C, T, H, W), text (n, L, Dt)) from the run's data source, and its
    null caption (1, L, Dt) (zeros for sources without a text record)."""
    data = dataclasses.replace(cfg.data, seed=ec.heldout_seed, batch_size=ec.batch)
    if ec.heldout_shards:
        if data.source != "shards":  # make_source would ignore them: synthetic held-out data
            raise ConfigError(
                f"heldout_shards={ec.heldout_shards}: the run trained on data.source="
                f"{data.source!r}, not shards; leave heldout_shards empty"
            )
        data = dataclasses.replace(data, shards=ec.heldout_shards, blend="")
    source = make_source(data, cfg.model, sigma_data=cfg.diffusion.sigma_data)
    lat, txt = [], []
    while sum(len(x) for x in lat) < n:
        b = source.next_batch()
        lat.append(b.values)
        txt.append(b.text)
    null = getattr(source, "null_text", None)  # (L, Dt) or None
    m = cfg.model
    null = torch.zeros(1, m.text_len, m.text_dim) if null is None else null[None].float()
    values = torch.cat(lat)[:n]  # latents (n, C, T, H, W), or token ids (n, T, H, W)
    values = values if not values.dtype.is_floating_point else values.float()
    return values, torch.cat(txt)[:n].float(), null


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
    """Held-out loss (bits per token for the autoregressive family), Fréchet distance, prompt
    following and the untrained baseline of a checkpoint (see the module docstring)."""
    ec = config or EvalConfig()
    loaded = checkpoint if isinstance(checkpoint, LoadedDiT) else load_dit(checkpoint)
    cfg, model = loaded.cfg, loaded.model
    held_out = generation_of(cfg).heldout  # token ids: bits per token; latents: the EDM loss
    n = max(ec.loss_samples, ec.fd_samples)
    data, text, null = heldout_batches(cfg, ec, n)  # (n, C, T, H, W) | (n, T, H, W), (n, L, Dt)
    metrics = held_out(model, cfg, data[: ec.loss_samples], text[: ec.loss_samples], ec)

    tok_path = tokenizer or cfg.data.tokenizer or None
    decoder = generation_of(cfg).load_decoder(cfg, tok_path) if tok_path else None
    ref = data[: ec.fd_samples]  # (m, C, T, H, W) latents | (m, T, H, W) token ids
    decode = _decoding(cfg, ec, decoder, ref)
    ref_features = _clip_features(decode(ref), ec.frames_per_clip)

    def fd_of(m: torch.nn.Module, which: str) -> float:
        desc = f"FD clips ({which})"
        fake = sample_clips(m, cfg, ec, text[: ec.fd_samples], null, ref.shape, desc=desc)
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

    def prompt_following(m: torch.nn.Module, which: str, sheet: str = "") -> dict[str, float]:
        return _prompt_following(
            m, cfg, ec, loaded.text, null, decode, ref.shape[1:], sheet=sheet, which=which
        )

    if follow:
        metrics.update(prompt_following(model, "trained", ec.contact_sheet))
    if follow and ec.concept:  # the fine-tuning concept's prompts
        metrics.update(
            _prompt_following(
                model,
                cfg,
                ec,
                loaded.text,
                null,
                decode,
                ref.shape[1:],
                which="concept",
                prompts=concept_prompts(ec.concept) * ec.concept_draws,
                key="concept_",
            )
        )
    if ec.frame_prompts and decoder is not None:
        n = min(ec.frame_prompts, len(data))
        metrics.update(
            frame_continuation(model, cfg, ec, data[:n], text[:n], null, decode, which="trained")
        )
    if ec.untrained_baseline:  # the same measures of the run's initialisation: what training won
        init = _untrained(cfg)
        lat, txt = data[: ec.loss_samples], text[: ec.loss_samples]
        base = held_out(init, cfg, lat, txt, ec, desc="held-out loss (untrained)")
        metrics["untrained_heldout_loss"] = base["heldout_loss"]
        metrics["untrained_frechet_distance"] = fd_of(init, "untrained")
        if follow:
            untrained = prompt_following(init, "untrained")
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


def _decoding(cfg: Config, ec: EvalConfig, decoder: Any, ref: torch.Tensor) -> Any:
    """``decode(x)``: latents (m, C, T, H, W) or token ids (m, T, H, W) -> videos (m, 3, F, H, W)
    in ~[-1, 1], by the tokenizer in batches, else a latent preview at one fixed scale (token ids
    through the run's synthetic FSQ grid first)."""
    gen = generation_of(cfg)
    if decoder is not None:

        def decode(x: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return torch.cat(
                    [gen.decode(decoder, x[i : i + ec.batch]) for i in range(0, len(x), ec.batch)]
                )

        return decode
    scale = float(gen.codes(cfg, None, ref).float().std()) * 2  # one scale for both sides
    t_c, s = PREVIEW_FACTORS

    def preview(x: torch.Tensor) -> torch.Tensor:
        codes = gen.codes(cfg, None, x)  # (m, C, T, H, W)
        return latent_preview(codes, temporal_factor=t_c, spatial_factor=s, scale=scale)

    return preview


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
    prompts: list[str] | None = None,
    key: str = "prompt_",
) -> dict[str, float]:
    """Clips of every vocabulary prompt (or of ``prompts``; fixed noise, the run's latent
    ``grid`` (C, T, H, W)), decoded and read back: ``prompt_*`` accuracies (``key``; see
    :class:`EvalConfig`); a contact sheet of them at ``sheet`` when given. ``which`` model it
    is, in the progress lines."""
    from vfm_core.infer.generate import prompt_encoder, text_condition
    from vfm_core.infer.prompt_follow import score_frames, vocabulary_prompts

    prompts = prompts or vocabulary_prompts(ec.prompt_following)
    m = cfg.model
    text = torch.cat(
        [
            text_condition(e, text_len=m.text_len, text_dim=m.text_dim)
            for e in prompt_encoder(record).encode(prompts)
        ]
    )  # (n, L, Dt)
    shape = torch.Size((len(prompts), *grid))
    latents = sample_clips(model, cfg, ec, text, null, shape, desc=f"prompt following ({which})")
    clips = [to_uint8_frames(v) for v in decode(latents)]  # [(F, H, W, 3)]
    if sheet:
        from vfm_core.video.contact_sheet import contact_sheet

        contact_sheet(clips, prompts, sheet)
    return {f"{key}{k}": v for k, v in score_frames(clips, prompts).items()}


def concept_prompts(colour: str) -> list[str]:
    """The prompts of a new colour: every shape and direction ("a magenta circle moving up")."""
    from vfm_core.video.captioned import concept_subjects

    return [f"a {c} {s} moving {d}" for c, s, d in concept_subjects(colour)]


def _untrained(cfg: Config) -> torch.nn.Module:
    """The run's model at initialisation (its seed: the weights every layout of the run started
    from), for the untrained baseline."""
    from vfm_core.families import build_model

    return build_model(cfg.model, device="cpu", seed=cfg.train.seed).eval()


def frame_continuation(
    model: torch.nn.Module,
    cfg: Config,
    ec: EvalConfig,
    clips: torch.Tensor,
    text: torch.Tensor,
    null: torch.Tensor,
    decode: Any,
    *,
    which: str = "trained",
) -> dict[str, float]:
    """Held-out ``clips`` (latents (n, C, T, H, W) | token ids (n, T, H, W)) continued from their
    first latent frame with their captions ``text``; the object read back from the pixels of each
    held-out clip and of its continuation: ``frame_colour_kept``, ``frame_motion_kept`` (see
    :attr:`EvalConfig.frame_prompts`), ``frame_n_scored`` (held-out clips whose object was read)."""
    from vfm_core.infer.prompt_follow import continuation_kept

    depth = cfg.model.patch[0]  # one latent frame (a patch deep): the first picture
    first = clips[:, :, :depth] if clips.dtype.is_floating_point else clips[:, :depth]
    out = sample_clips(
        model, cfg, ec, text, null, clips.shape, desc=f"first-frame clips ({which})", prompt=first
    )
    given = [to_uint8_frames(v) for v in decode(clips)]
    made = [to_uint8_frames(v) for v in decode(out)]
    return {f"frame_{name}": v for name, v in continuation_kept(given, made).items()}


@torch.no_grad()
def sample_clips(
    model: torch.nn.Module,
    cfg: Config,
    ec: EvalConfig,
    text: torch.Tensor,
    null: torch.Tensor,
    shape: torch.Size,
    *,
    desc: str = "sampling clips",
    prompt: torch.Tensor | None = None,
) -> torch.Tensor:
    """Clips of ``shape`` sampled for ``text`` from seed ``ec.seed + 1``: latents (m, C, T, H, W)
    denoised from fixed noise, or token ids (m, T, H, W) drawn token by token (autoregressive),
    continuing ``prompt`` (their leading latent frames) when given; ``desc`` names the progress
    lines."""
    guidance = cfg.diffusion.guidance if ec.guidance is None else ec.guidance
    gen = generation_of(cfg)  # token by token, else denoised
    draw = gen.eval_draws(model, cfg, ec, null, shape, guidance=guidance)
    batch = gen.eval_batch(ec)
    out = []
    bar = Progress(shape[0], desc=desc, unit="clip", logger=_log)
    for i in range(0, shape[0], batch):
        lead = None if prompt is None else prompt[i : i + batch]
        out.append(draw(i, text[i : i + batch], lead))  # (b, C, T, H, W) | (b, T, H, W)
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
    from vfm_core.tracking_logger import MLflowLogger

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
