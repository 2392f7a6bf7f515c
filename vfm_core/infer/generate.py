"""Text-to-video generation from a trained DiT checkpoint: prompt -> latent -> MP4 (+ GIF, latents).

Stage order of :func:`generate` (top to bottom):

0. **check** the request's scalar inputs and that ``out`` can be written, before any model is
   loaded (:mod:`vfm_core.infer.request`);
1. **load** the DiT of a ``vfm train`` run (:func:`vfm_core.checkpoints.load.load_dit`; EMA
   weights, another architecture refused) and the tokenizer (``--tokenizer``, else the run's
   ``data.tokenizer``; latent channels must equal ``model.in_channels``);
2. **plan** the latent for ``frames`` x H x W (:mod:`vfm_core.infer.shapes`: frame counts rounded
   up with a warning, sizes checked) and **bound** its cost: estimated memory and time over the
   request's bounds are refused in one line (:mod:`vfm_core.infer.budget`, ``--force`` to run
   anyway);
3. **embed** the prompt as the run's captions were embedded (``RUN/text.json``: per-token or
   pooled, MiniLM or T5; runs without one: pooled all-MiniLM-L6-v2), zero-padded to
   ``model.text_len`` tokens (the padding is masked in cross-attention); the unconditional branch
   is the null caption the trainer substitutes for dropped captions (the empty caption's
   embedding; zeros for runs without a text record); then a short **probe** of the loaded model
   at the request's shape measures this device: the time estimate it gives is logged and checked
   against the time bound again (:mod:`vfm_core.infer.probe`);
4. **noise** for the *global* latent (1, C, T', h, w) from one CPU generator seeded with ``seed``:
   identical on every rank whatever their number;
5. **denoise** with the EDM Heun sampler and classifier-free guidance, conditional and
   unconditional in one batch (:func:`vfm_core.diffusion.sampler.sample`). Under torchrun with N
   ranks (:mod:`vfm_core.infer.context_parallel`, the parallel package's CP attention) each rank
   embeds, attends (ring attention for full 3D attention, all-to-all for ST-DiT) and transforms
   only its contiguous 1/N slice of the raster-ordered tokens; the output projection is
   all-gathered, so the sampler state stays replicated and every rank takes the same ODE step.
   Progress shows once sampling has run a few seconds (:mod:`vfm_core.infer.progress`);
6. **decode** on rank 0 with the causal tokenizer (or, for runs trained on synthetic latents with no
   tokenizer, a labelled latent preview: 3 channels up-sampled by the default 4x8x8 factors), then
   write ``OUT.mp4`` (H.264), ``OUT.gif`` (Pillow, when installed), ``OUT.latent.npy`` (the
   sampled latent (C, T', h, w) float32, in the DiT's data space) and, last,
   ``OUT.result.json`` (the :class:`GenerateResult`: what the launcher of N ranks reads back);
   one line compares the time taken with the estimate.

:func:`vfm_core.infer.run.generate_request` is the library's one entry for a request (``vfm
generate``, the Prefect generation task): the cheap checks and the cost bounds from the run's
config before anything loads, the prompt embedded once, then :func:`generate` in this process
(``nproc`` 1) or ``nproc`` context-parallel ranks through the one launcher
(:func:`vfm_core.launch.launcher.launch_generation`).

Equivalence: 1, 2 and 4 ranks give the same video up to float rounding of the ring attention's
online-softmax merge (tested: max abs difference of the decoded [-1, 1] video below 1e-3).

Steps 2 and 4-6 ask the run's family (:mod:`vfm_core.infer.generation`): the diffusion family
denoises as above (:mod:`vfm_core.infer.diffusion_generation`); autoregressive runs sample token
ids instead of steps 4-5 (:mod:`vfm_core.infer.token_generation`, :mod:`vfm_core.infer.
ar_sample`), optionally continuing a token prompt (``prompt_tokens`` /
``prompt_video``, ``prompt_frames`` latent frames); under torchrun the prompt's prefill is split
over the ranks and decoding runs identically on each (:mod:`vfm_core.infer.ar_prefill`): the same
tokens as one rank.
"""

from __future__ import annotations

import json
import logging
import os
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vfm_core.checkpoints.load import LoadedDiT, load_dit
from vfm_core.infer.budget import CostEstimate
from vfm_core.infer.diffusion_generation import initial_noise, sample_latent
from vfm_core.infer.family_generation import generation_of
from vfm_core.infer.generation import Generation, Sampled
from vfm_core.infer.probe import after_line, calibrate, estimate_line
from vfm_core.infer.request import (
    GUIDANCE_RANGE,
    PREVIEW_FACTORS,
    GenerateRequest,
    ar_prompt_ids,
    check_cost,
    check_guidance,
    check_measured_time,
    check_options,
    check_prompt,
    check_steps,
    decoder_and_plan,
    load_decoder,
    request_prompt,
)
from vfm_core.infer.shapes import GenerateError, LatentPlan
from vfm_core.infer.video_out import check_writable, latent_preview, to_uint8_frames, write_outputs
from vfm_core.progress import console_logging

_log = logging.getLogger(__name__)

__all__ = [  # re-exported: the request's names (infer.request), the diffusion sampler's
    "GUIDANCE_RANGE",
    "GenerateRequest",
    "GenerateResult",
    "ar_prompt_ids",
    "check_guidance",
    "check_prompt",
    "embed_prompt",
    "generate",
    "initial_noise",
    "load_decoder",
    "null_condition",
    "prompt_encoder",
    "read_result",
    "result_path",
    "sample_latent",
    "text_condition",
    "write_result",
]


@dataclass(kw_only=True, slots=True)
class GenerateResult:
    """What :func:`generate` produced (paths are written by rank 0 only)."""

    mp4: str
    """Path of the H.264 video."""
    gif: str | None
    """Path of the GIF (None if not written)."""
    latent: str
    """Path of ``OUT.latent.npy``."""
    frames: int
    """Frames written."""
    size: tuple[int, int]
    """(H, W) written."""
    latent_shape: tuple[int, ...]
    """(C, T', h, w) of the sampled latent."""
    steps: int
    """Sampler steps used."""
    guidance: float
    """Guidance scale used."""
    seed: int
    """Noise seed."""
    ranks: int
    """Context-parallel ranks that denoised."""
    decoder: str
    """``tokenizer:PATH`` or ``latent-preview``."""
    checkpoint: str
    """Checkpoint folder of the DiT."""
    step: int
    """Training step of that checkpoint."""
    sample_s: float
    """Seconds spent denoising."""
    decode_s: float
    """Seconds spent decoding and writing."""
    tokens: str | None = None
    """Autoregressive family: path of ``OUT.tokens.npy``, the sampled ids (T', h, w) int32."""
    estimate_gib: float | None = None
    """Estimated peak memory of the request on this host, GiB (:mod:`vfm_core.infer.budget`)."""
    estimate_s: float | None = None
    """Estimated seconds of sampling, decoding and writing, once a probe measured this device
    (:mod:`vfm_core.infer.probe`)."""
    probe_s: float | None = None
    """Seconds that probe took, before sampling (not in ``sample_s``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_ENCODERS: dict[str, Any] = {}


def prompt_encoder(record: dict[str, Any] | None) -> Any:
    """The encoder a run's captions went through (loaded once per process): a
    :class:`~vfm_core.annotate.text_encoder.TextEncoder` from the record; pooled MiniLM for runs
    without one."""
    from vfm_core.annotate.text_encoder import (
        TextEncoder,
        TextEncoderError,
        TextSpec,
        spec_from_record,
    )

    key = json.dumps({k: v for k, v in (record or {}).items() if k != "null"}, sort_keys=True)
    if key not in _ENCODERS:
        try:
            spec = (
                spec_from_record(record, "the run's text.json")
                if record
                else TextSpec(mode="pooled")
            )
            _ENCODERS[key] = TextEncoder(spec)
        except TextEncoderError as e:
            raise GenerateError(f"cannot load the run's text encoder: {e}") from None
    return _ENCODERS[key]


def embed_prompt(
    prompt: str, *, record: dict[str, Any] | None = None, text_len: int | None = None
) -> np.ndarray:
    """Prompt -> (l, Dt) float32 with the encoder of the run's text ``record`` (l per-token
    vectors, or l = 1 pooled). A prompt longer than the encoder reads, or (per-token vectors)
    than the model's ``text_len``, is cut: one warning says to how many tokens."""
    encoder = prompt_encoder(record)
    prompt = check_prompt(prompt)
    n = len(encoder.tokenizer(prompt, verbose=False)["input_ids"])  # with the special tokens
    # sentence-transformers cut at max_seq_length (at most max_tokens), T5 at max_tokens
    kept = getattr(encoder.model, "max_seq_length", None) or encoder.spec.max_tokens
    why = "the text encoder's limit"
    if encoder.spec.mode == "tokens" and text_len and text_len < kept:
        kept, why = text_len, "model.text_len"
    if n > kept:
        warnings.warn(
            f"--prompt: {n} tokens, more than {why} of {kept}: cut to its first {kept} tokens "
            "(the rest does not condition the video)",
            stacklevel=2,
        )
    return encoder.encode([prompt])[0]


def null_condition(record: dict[str, Any] | None, *, text_len: int, text_dim: int) -> torch.Tensor:
    """(1, L, Dt) unconditional text: the run's null caption padded like a prompt; zeros for runs
    without a text record (what their trainer fed for dropped captions)."""
    from vfm_core.annotate.text_encoder import TextEncoderError, null_from_record

    try:
        null = null_from_record(record, text_dim, "the run's text.json")
    except TextEncoderError as e:
        raise GenerateError(str(e)) from None
    if null is None:
        return torch.zeros(1, text_len, text_dim)
    return text_condition(null, text_len=text_len, text_dim=text_dim)


def text_condition(emb: np.ndarray | torch.Tensor, *, text_len: int, text_dim: int) -> torch.Tensor:
    """Prompt embedding (l, Dt) -> (1, L, Dt) zero-padded / cut to ``text_len`` tokens, like the
    shard loader pads captions."""
    e = torch.as_tensor(np.asarray(emb, dtype=np.float32))
    if e.ndim == 1:
        e = e[None]
    if e.ndim != 2 or e.shape[1] != text_dim or e.shape[0] < 1:
        raise GenerateError(
            f"prompt embedding has shape {tuple(e.shape)}; the DiT takes (tokens, {text_dim}) "
            f"(model.text_dim={text_dim}): use the text embedder the run was trained with"
        )
    e = e[:text_len]
    pad = e.new_zeros(text_len - e.shape[0], text_dim)
    return torch.cat([e, pad])[None]  # (1, L, Dt)


def generate(
    checkpoint: str | Path | LoadedDiT,
    request: GenerateRequest,
    out: str | Path,
    *,
    tokenizer: str | Path | None = None,
    text_emb: np.ndarray | None = None,
) -> GenerateResult:
    """Generate one video (see the module docstring). Under torchrun every rank calls this with
    the same arguments; rank 0 writes ``out`` (``.mp4``), ``out.gif`` and ``out.latent.npy``."""
    out = _check_request(request, out)  # before any model is loaded
    loaded = checkpoint if isinstance(checkpoint, LoadedDiT) else load_dit(checkpoint)
    cfg = loaded.cfg
    guidance = check_guidance(
        cfg.diffusion.guidance if request.guidance is None else request.guidance
    )
    steps = check_steps(cfg.diffusion.num_steps if request.steps is None else request.steps)
    tok_path = tokenizer or cfg.data.tokenizer or None
    gen = generation_of(cfg)  # the family's planning, sampler and decoding
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    decoder, plan, s = decoder_and_plan(cfg, request, tok_path, world)
    t_c = decoder.cfg.temporal_factor if decoder else PREVIEW_FACTORS[0]
    # before the prompt, the noise, the caches and the activations are built
    est = _check_cost(loaded, request, plan, decoder, steps=steps, guidance=guidance, world=world)
    prompt = request_prompt(cfg, request, decoder, plan, s)  # ids | latent frames | None
    text, null = _text_conditions(loaded, request.prompt, text_emb)  # (1, L, Dt) each
    lead = world == 1 or dist.get_rank() == 0
    # this device measured at the request's shape: the time estimate logged and checked again
    cal = calibrate(est, gen, loaded, request, plan, decoder, guidance=guidance)
    if lead:
        _say(estimate_line(cal, peak_gib=est.peak_bytes / 2**30))
    check_measured_time(cfg, request, plan, cal.estimate, steps=steps)
    show = request.progress and lead
    t0 = time.perf_counter()
    sampled = gen.sample(
        loaded,
        request,
        plan,
        text=text,
        null=null,
        prompt=prompt,
        decoder=decoder,
        steps=steps,
        guidance=guidance,
        show=show,
        world=world,
    )
    _refuse_not_finite(sampled.latent, loaded)  # the same latent on every rank: all refuse
    sample_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    rank = dist.get_rank() if sampled.ranks > 1 else 0
    gif = None
    if rank == 0:
        video = _decoded_video(gen, decoder, sampled, temporal_factor=t_c, spatial_factor=s)
        gif = _write_video(
            video, sampled.latent, sampled.tokens, out, request=request, tokenizer=tok_path
        )
    result = GenerateResult(
        mp4=str(out),
        gif=gif,
        latent=str(out.with_suffix(".latent.npy")),
        frames=plan.frames,
        size=(plan.height, plan.width),
        latent_shape=tuple(plan.latent),
        steps=sampled.steps,
        guidance=guidance,
        seed=request.seed,
        ranks=sampled.ranks,
        decoder=f"tokenizer:{tok_path}" if decoder is not None else "latent-preview",
        checkpoint=str(loaded.checkpoint),
        step=loaded.step,
        sample_s=sample_s,
        decode_s=time.perf_counter() - t1,
        tokens=str(out.with_suffix(".tokens.npy")) if sampled.tokens is not None else None,
        estimate_gib=est.peak_bytes / 2**30,
        estimate_s=cal.estimate.seconds,
        probe_s=cal.spent_s,
    )
    if rank == 0:  # what the launcher of N ranks reads back (write_result)
        _say(after_line(result.sample_s + result.decode_s, cal.estimate.seconds))
        write_result(result, out)
    if sampled.ranks > 1:
        dist.barrier()
    return result


def _say(line: str) -> None:
    """A line of the generation's own (the estimate, the time taken) for whoever shows the
    library's INFO lines: stderr of ``vfm generate`` and of the ranks, a Prefect run's log."""
    console_logging()
    _log.info(line)


def _check_cost(
    loaded: LoadedDiT,
    request: GenerateRequest,
    plan: LatentPlan,
    decoder: Any,
    *,
    steps: int,
    guidance: float,
    world: int,
) -> CostEstimate:
    """:func:`check_cost` of ``request`` on the checkpoint's device and dtype, the model and the
    decoder resident."""
    param = next(loaded.model.parameters())
    return check_cost(
        loaded.cfg,
        request,
        plan,
        decoder.cfg if decoder is not None else None,
        steps=steps,
        guidance=guidance,
        world=world,
        device=param.device,
        dtype_bytes=param.element_size(),
        resident_bytes=_resident_bytes(loaded.model, decoder),
    )


def _check_request(request: GenerateRequest, out: str | Path) -> Path:
    """``out`` as a writable path, once the prompt, the options and the bounds of ``request``
    are checked (GenerateError otherwise)."""
    check_prompt(request.prompt)
    check_options(request)
    request.bounds.check()
    out = check_writable(out)
    if result_path(out).is_dir():
        raise GenerateError(f"--out {out}: {result_path(out)} is a directory")
    return out


def _text_conditions(
    loaded: LoadedDiT, prompt: str, text_emb: np.ndarray | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(text, null text) conditions of the prompt, each (1, L, Dt); ``text_emb``: the prompt's
    embedding when the caller has it, else embedded with the checkpoint's text encoder."""
    model = loaded.cfg.model
    if text_emb is None:
        text_emb = embed_prompt(prompt, record=loaded.text, text_len=model.text_len)
    text = text_condition(text_emb, text_len=model.text_len, text_dim=model.text_dim)
    null = null_condition(loaded.text, text_len=model.text_len, text_dim=model.text_dim)
    return text, null


def _decoded_video(
    gen: Generation,
    decoder: Any,
    sampled: Sampled,
    *,
    temporal_factor: int,
    spatial_factor: int,
) -> torch.Tensor:
    """The video (1, 3, F, H, W) in ~[-1, 1]: the tokenizer's decoding of the sampled tokens or
    latent, else a preview of the latent (1, C, T', h, w) (with a warning)."""
    with torch.no_grad():
        if decoder is not None:
            return gen.decode(decoder, sampled.values)
        warnings.warn(
            "no tokenizer (--tokenizer, or data.tokenizer in the run config): writing a "
            "latent preview (3 latent channels up-sampled), not a decoded video",
            stacklevel=3,
        )
        return latent_preview(
            sampled.latent, temporal_factor=temporal_factor, spatial_factor=spatial_factor
        )


def _write_video(
    video: torch.Tensor,
    latent: torch.Tensor,
    tokens: torch.Tensor | None,
    out: Path,
    *,
    request: GenerateRequest,
    tokenizer: Any,
) -> str | None:
    """Write the video (1, 3, F, H, W) as ``out`` (and the gif), the latent beside it and the
    sampled ids when there are any; returns the gif's path. GenerateError, writing nothing,
    when the decoded frames are not finite."""
    if not torch.isfinite(video).all():
        raise GenerateError(
            f"tokenizer {tokenizer}: the decoded frames hold NaN or inf; no video written"
        )
    paths = write_outputs(
        to_uint8_frames(video[0]), latent[0].numpy(), out, fps=request.fps, gif=request.gif
    )
    if tokens is not None:  # the sampled ids (T', h, w) int32 beside the codes
        np.save(
            out.with_suffix(".tokens.npy"),
            tokens[0].numpy().astype(np.int32),
            allow_pickle=False,
        )
    return paths["gif"]


def result_path(out: str | Path) -> Path:
    """``OUT.result.json``: the :class:`GenerateResult` of the generation that wrote ``out``."""
    return Path(out).with_suffix(".result.json")


def write_result(result: GenerateResult, out: str | Path) -> Path:
    """Write ``result`` as JSON to :func:`result_path` (atomically: a reader sees all or none)."""
    path = result_path(out)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    tmp.replace(path)
    return path


def read_result(path: str | Path) -> GenerateResult:
    """The :class:`GenerateResult` a generation wrote with :func:`write_result`."""
    d = json.loads(Path(path).read_text())
    d["size"], d["latent_shape"] = tuple(d["size"]), tuple(d["latent_shape"])
    return GenerateResult(**d)


def _refuse_not_finite(latent: torch.Tensor, loaded: LoadedDiT) -> None:
    """A latent holding NaN or inf is never decoded into a video: one line naming the checkpoint
    and, when its weights are the cause, one of the tensors that are not finite."""
    if torch.isfinite(latent).all():
        return
    bad = [n for n, p in loaded.model.named_parameters() if not torch.isfinite(p).all()]
    why = (
        f"{len(bad)} of its weight tensors hold NaN or inf, e.g. {bad[0]}"
        if bad
        else "its weights are finite; a lower --guidance may keep it finite"
    )
    raise GenerateError(
        f"checkpoint {loaded.checkpoint}: the sampled latent holds NaN or inf ({why}); no video "
        "written"
    )


def _resident_bytes(model: torch.nn.Module, decoder: Any) -> float:
    """Weights already loaded on this host: the model on each of its local ranks, the decoder."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    held = local * sum(p.numel() * p.element_size() for p in model.parameters())
    if decoder is not None:
        held += sum(p.numel() * p.element_size() for p in decoder.parameters())
    return float(held)
