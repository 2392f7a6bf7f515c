"""The library's one entry for a generation request: what ``vfm generate`` and the Prefect
generation task call (:func:`generate_request`), and the flags it hands to ``nproc`` ranks
(:func:`rank_args`). The generation itself is :func:`vfm_core.infer.generate.generate`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from vfm_core.config import Config
from vfm_core.infer.family_generation import generation_of
from vfm_core.infer.generate import (
    GenerateRequest,
    GenerateResult,
    embed_prompt,
    generate,
    read_result,
    result_path,
)
from vfm_core.infer.request import ar_prompt_ids, check_guidance, check_options, check_prompt
from vfm_core.infer.shapes import GenerateError
from vfm_core.infer.video_out import check_writable


def generate_request(
    checkpoint: str | Path,
    request: GenerateRequest,
    out: str | Path,
    *,
    tokenizer: str | Path | None = None,
    nproc: int = 1,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
) -> GenerateResult:
    """Generate one video for ``request`` from the run at ``checkpoint`` (or the registered
    version ``models:/NAME@ALIAS`` / ``models:/NAME/VERSION``, resolved here once) on ``nproc``
    context-parallel ranks: what ``vfm generate`` and the Prefect generation task call.

    The cheap checks come first (:func:`check_request`); an autoregressive run's token prompt
    is read and checked here too. The prompt is
    embedded once (the text model loads here, not on every rank); ``nproc`` 1 then runs
    :func:`generate` in this process, ``nproc`` N starts N ranks through the one launcher
    (:func:`vfm_core.launch.launcher.launch_generation`; ``env``, ``on_line`` as there) and reads
    their result from ``OUT.result.json``. Bad input raises a :class:`~vfm_core.errors.UserError`
    (GenerateError, CheckpointError); ranks that fail raise
    :class:`~vfm_core.launch.launcher.LaunchError`."""
    import tempfile

    from vfm_core.checkpoints.load import read_text_record
    from vfm_core.launch.launcher import LaunchError, launch_generation

    checkpoint, run_dir, cfg = check_request(
        checkpoint, request, out, tokenizer=tokenizer, nproc=nproc
    )
    ids = None  # an autoregressive run's token prompt (K, h, w), read and checked here
    given = request.prompt_tokens or request.prompt_video or request.prompt_image
    if given and generation_of(cfg).token_prompt:
        ids = ar_prompt_ids(cfg, request, tokenizer=tokenizer)
    # (l, Dt) as the run's captions were embedded (RUN/text.json); empty prompt -> GenerateError
    emb = embed_prompt(
        request.prompt, record=read_text_record(run_dir), text_len=cfg.model.text_len
    )
    with tempfile.TemporaryDirectory(prefix="vfm-generate-") as tmp:
        emb_path, ids_path = Path(tmp) / "prompt.npy", Path(tmp) / "prompt.tokens.npy"
        if ids is not None:  # the checked ids go on as the prompt (a video is encoded once)
            np.save(ids_path, ids, allow_pickle=False)
            request = replace(
                request, prompt_tokens=str(ids_path), prompt_video=None, prompt_image=None
            )
        if nproc == 1:
            return generate(checkpoint, request, out, tokenizer=tokenizer, text_emb=emb)
        np.save(emb_path, emb, allow_pickle=False)
        args = rank_args(checkpoint, request, out, text_emb=emb_path, tokenizer=tokenizer)
        res = launch_generation(nproc, args, result=result_path(out), env=env, on_line=on_line)
    if res.returncode != 0:
        raise LaunchError(f"{nproc} ranks", res.returncode, res.error_line())
    if res.summary is None:
        raise LaunchError(f"{nproc} ranks", 1, f"no {result_path(out)} written")
    return read_result(result_path(out))


def check_request(
    checkpoint: str | Path,
    request: GenerateRequest,
    out: str | Path,
    *,
    tokenizer: str | Path | None = None,
    nproc: int = 1,
) -> tuple[str | Path, Path, Config]:
    """The cheap checks of :func:`generate_request`, before the text model, the weights or any
    rank: prompt, options, guidance, ``nproc``, that ``out`` can be written, the run's config,
    then the plan and its estimated memory and time against ``request.bounds``
    (:func:`~vfm_core.infer.request.preflight`); returns (the local checkpoint, its run dir, its
    config). A flow runs them for every prompt before it starts its MLflow run."""
    from vfm_core.checkpoints.load import resolve_checkpoint
    from vfm_core.checkpoints.manager import CheckpointError
    from vfm_core.checkpoints.uri import local_checkpoint
    from vfm_core.config import ConfigError, load_yaml, validate
    from vfm_core.infer.request import preflight

    check_prompt(request.prompt)
    check_options(request)
    if request.guidance is not None:
        check_guidance(request.guidance)
    if nproc < 1:
        raise GenerateError(f"--nproc: must be >= 1, got {nproc}")
    check_writable(out)
    checkpoint = local_checkpoint(checkpoint)  # models:/NAME@ALIAS: resolved (downloaded) once
    run_dir, _ = resolve_checkpoint(checkpoint, check=False)  # verified when loaded
    try:
        cfg = validate(load_yaml(run_dir / "config.yaml"))
    except ConfigError as e:
        raise CheckpointError(f"--checkpoint {run_dir}: {e}") from None
    # the plan and its estimated memory / time against the bounds, from the config alone
    preflight(cfg, request, tokenizer=tokenizer, world=nproc)
    return checkpoint, run_dir, cfg


def rank_args(
    checkpoint: str | Path,
    request: GenerateRequest,
    out: str | Path,
    *,
    text_emb: str | Path,
    tokenizer: str | Path | None = None,
) -> list[str]:
    """The flags of :mod:`vfm_core.infer.main` for ``request`` (every rank parses the same):
    ``text_emb``, the prompt's embedding (l, Dt) .npy written by the launcher."""
    r, b = request, request.bounds
    argv = ["--checkpoint", str(checkpoint), "--prompt", r.prompt]
    argv += ["--frames", str(r.frames), "--size", f"{r.height}x{r.width}", "--seed", str(r.seed)]
    argv += ["--out", str(out), "--fps", str(r.fps), "--text-emb", str(text_emb)]
    argv += ["--temperature", repr(r.temperature), "--top-k", str(r.top_k)]
    argv += ["--top-p", repr(r.top_p), "--max-minutes", repr(b.max_minutes)]
    if r.prompt_tokens is not None:  # the checked ids (K, h, w) of an autoregressive run
        argv += ["--prompt-tokens", r.prompt_tokens, "--prompt-frames", str(r.prompt_frames)]
    for flag, path in (("--prompt-video", r.prompt_video), ("--prompt-image", r.prompt_image)):
        if path is not None:  # a diffusion run's clean frames: every rank encodes them
            argv += [flag, path, "--prompt-frames", str(r.prompt_frames)]
    for flag, value in (
        ("--steps", r.steps),
        ("--guidance", r.guidance),
        ("--tokenizer", tokenizer),
        ("--max-memory-gib", b.max_memory_gib),
        ("--device-tflops", b.device_tflops),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--no-gif"] if not r.gif else []) + (["--force"] if b.force else [])
