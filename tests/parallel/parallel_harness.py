"""The one spawning harness of the parallel tests: run ``fn(rank, world, *args)`` in ``world``
processes joined by a gloo process group (file:// rendezvous, so no ports), collect what each rank
returns.

``fn`` must be a module-level function of an importable module (spawned children unpickle it by
name; pytest's sys.path travels with them). Each rank returns a JSON-serialisable value; an
exception in any rank fails the caller with that rank's traceback.

Also what the parallel training tests share: the trainer of a rank (:func:`build_trainer`,
:func:`resume_trainer`), an in-memory metrics logger (:class:`MetricsCollector`), launching
``torchrun`` / ``vfm train`` (:func:`launch`, :func:`launch_ok`; in this process:
:func:`vfm_main_ok`), the one-process run in this process (:func:`one_process`) and a small
latent shard set (:func:`write_moving_clip_shards`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from vfm_core.parallel.world import exit_process

TINY_RUN = [
    "model.hidden=64",
    "model.depth=2",
    "model.heads=4",
    "model.text_dim=32",
    "data.latent_height=8",
    "data.latent_width=8",
    "data.batch_size=4",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
]
"""Overrides that shrink a preset to a few-second run (the layout-equality tests share them)."""


def _entry(rank: int, world: int, store: str, out: str, fn: Callable, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # nobody closes its connections while a peer still talks to it
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()
    exit_process(0)  # a gloo worker thread may outlive finalisation (see exit_process)


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn`` on ``world`` gloo ranks; return the per-rank results, rank order."""
    with tempfile.TemporaryDirectory(prefix="vfm-dist-") as tmp:
        store = os.path.join(tmp, "store")
        try:
            mp.spawn(_entry, args=(world, store, tmp, fn, args), nprocs=world, join=True)
        except Exception as e:
            errs = sorted(Path(tmp).glob("rank*.err"))
            detail = "\n".join(f"--- {p.stem}\n{p.read_text()}" for p in errs)
            raise AssertionError(f"distributed run failed: {e}\n{detail}") from None
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]


def one_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(0, 1, *args)`` in this process: the one-process run (one rank, no process group), with
    one intra-op thread as the spawned ranks have, its result as :func:`run_ranks` returns a
    rank's (through JSON). A spawn of one rank would re-import torch and the package (~8 s of a
    loaded CI core)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return json.loads(json.dumps(fn(0, 1, *args)))
    finally:
        torch.set_num_threads(threads)


def vfm_main_ok(*args: Any) -> None:
    """``vfm ARGS`` called in this process (``vfm_core.cli.main``; no interpreter importing the
    library once more: the ranks it launches are torchrun's processes, one intra-op thread
    each); it must exit 0."""
    import pytest

    from vfm_core.cli import main as vfm_main

    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        assert vfm_main([str(a) for a in args]) == 0


class MetricsCollector:
    """An in-memory metrics logger (``log`` / ``close``): ``rows`` keeps every logged dict with
    its step; ``losses`` and ``column`` read them back."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def log(self, step: int, metrics: dict) -> None:
        self.rows.append({"step": step, **metrics})

    def close(self) -> None:
        pass

    @property
    def losses(self) -> list[float]:
        return self.column("loss")

    def column(self, *keys: str) -> list:
        """One key: its values per step; several: a dict of those keys per step."""
        if len(keys) == 1:
            return [r[keys[0]] for r in self.rows]
        return [{k: r[k] for k in keys} for r in self.rows]


def build_trainer(config: Any, world: int, degrees: dict | None = None) -> Any:
    """The trainer of this gloo rank: ``config`` a YAML path or a config object, its parallel
    degrees replaced by ``degrees`` when given (``{}``: all 1, one process)."""
    import dataclasses

    from vfm_core.config import DEGREES, ParallelConfig, load_yaml
    from vfm_core.train.trainer import Trainer

    cfg = load_yaml(config) if isinstance(config, str | Path) else config
    if degrees is not None:  # the degrees replaced, the config's other parallel settings kept
        plain = {k: getattr(ParallelConfig(), k) for k in DEGREES}
        layout = dataclasses.replace(cfg.parallel, **{**plain, **degrees})
        cfg = dataclasses.replace(cfg, parallel=layout)
    return Trainer(cfg)


def resume_trainer(trainer: Any, path: str | Path) -> Path:
    """Load the checkpoint folder ``path`` (``.../checkpoints/step_N``) into ``trainer``."""
    from vfm_core.checkpoints.manager import CheckpointManager, load_trainer

    path = Path(path)
    return load_trainer(CheckpointManager(path.parent.parent), trainer, path)


def fit_collect(trainer: Any, **fit_kwargs: Any) -> MetricsCollector:
    """``trainer.fit`` with a fresh :class:`MetricsCollector` as its only logger."""
    log = MetricsCollector()
    trainer.fit(loggers=[log], **fit_kwargs)
    return log


def launch(argv: list, timeout: int = 400) -> subprocess.CompletedProcess:
    """Run a training command (torchrun / ``vfm train``) with one OMP thread per process."""
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def launch_ok(argv: list, out: Path, timeout: int = 400) -> list[dict]:
    """:func:`launch` that must succeed; the rows of its ``out/metrics.jsonl``."""
    proc = launch(argv, timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return metrics_rows(out)


def metrics_rows(out: Path) -> list[dict]:
    """The rows of a run folder's ``metrics.jsonl``."""
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").open()]


def vfm_argv(*args: Any) -> list[str]:
    """``python -m vfm_core.cli ARGS``."""
    return [sys.executable, "-m", "vfm_core.cli", *map(str, args)]


def set_args(overrides: list[str]) -> list[str]:
    """``--set K=V`` for every override."""
    return [a for s in overrides for a in ("--set", s)]


def write_moving_clip_shards(
    clips: Path, out: Path, n_clips: int, embed: Callable[[list[str]], Any]
) -> Path:
    """``n_clips`` real 32x32 H.264 clips of 5 moving frames under ``clips`` with stored
    (4, 2, 4, 4) latents (a class-dependent mean, so a few steps learn something), captions
    embedded by ``embed``, written as ~6 kB shards to ``out``."""
    import numpy as np
    import pandas as pd

    from vfm_core.data.shards import ShardWriterConfig, write_shards
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    (clips / "clips").mkdir()
    rows, lat = [], {}
    rng = np.random.default_rng(0)
    for i in range(n_clips):
        cid = f"clip{i:03d}"
        spec = VideoSpec(
            width=32, height=32, fps=8.0, seed=i, segments=(Segment(kind="moving", n_frames=5),)
        )
        make_video(clips / "clips" / f"{cid}.mp4", spec)
        rows.append(
            {
                "clip_id": cid,
                "video_id": f"v{i}",
                "source_uri": f"/raw/v{i}.mp4",
                "start_s": 0.0,
                "end_s": 0.625,
                "uri": f"clips/{cid}.mp4",
                "caption": f"shapes moving, clip {i}",
                "width": 32,
                "height": 32,
                "fps": 8.0,
                "n_frames": 5,
            }
        )
        lat[cid] = (rng.standard_normal((4, 2, 4, 4)) * 0.5 + (i % 4 - 1.5) * 0.4).astype(
            np.float32
        )
    write_shards(
        pd.DataFrame(rows),
        str(out),
        embed=embed,
        base_url=str(clips),
        latents=lat,
        config=ShardWriterConfig(target_shard_bytes=6_000),
    )
    return out
