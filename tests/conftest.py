"""Test-wide environment: every store (MLflow, Prefect, runs) under a per-session temp dir."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs two xdist workers on this 2-core machine: one intra-op thread each, or the
    # two torch thread pools fight over the cores (measured 4x slower than one worker)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")

_ROOT = Path(tempfile.mkdtemp(prefix="vfm-tests-"))
os.environ["VFM_DATA_DIR"] = str(_ROOT / "data")
os.environ["PREFECT_HOME"] = str(_ROOT / "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("MLFLOW_RUN_ID", None)
os.environ.pop("VFM_INFRA_DIR", None)  # servers a developer started with `make up` stay out

REPO = Path(__file__).resolve().parents[1]


# the slowest test files (or folders, sharing a package fixture) go first, so that the two xdist
# workers end together (longest first); by their summed `--durations=0` in a CI run (2026-11-30:
# 4922 s of test time in 2512 s on two workers)
SLOW_FIRST = (
    "tests/infra/",
    "tests/parallel/test_multinode.py",
    "tests/train/test_compile.py",
    "tests/flows/test_pipeline_flow.py",
    "tests/train/test_step_check.py",
    "tests/parallel/test_4d_training.py",
    "tests/parallel/test_shard_training.py",
    "tests/parallel/test_parallel_packed_training.py",
    "tests/train/test_tracking_outage.py",
    "tests/parallel/test_pipeline_trainer.py",
    "tests/parallel/test_pipeline_checkpoint.py",
    "tests/train/test_preemption.py",
    "tests/train/test_trainer.py",
    "tests/parallel/test_resharding.py",
    "tests/infer/test_ar_cp_prefill.py",
    "tests/parallel/test_cli_train.py",
    "tests/test_cli.py",
    "tests/flows/test_train_flow.py",
    "tests/flows/test_demo.py",
    "tests/flows/test_curate_ray_cluster.py",
)


def xdist_group(nodeid: str) -> str:
    """One xdist work unit per test file, except ``tests/infra``: its modules share one set of
    servers (the package fixture ``make_up``), so they run on one worker."""
    path = nodeid.split("::", 1)[0]
    return "tests/infra/" if path.startswith("tests/infra/") else path


class FileUnits:
    """``--dist loadscope`` with the work units of ``xdist_group``, in collection order (xdist's
    own ``loadgroup`` cannot be used: it renames ``item._nodeid``, which pytest 9 no longer
    reads). A plugin registered only where xdist is installed: pytest rejects unknown hooks."""

    def pytest_xdist_make_scheduler(self, config, log):
        if config.getvalue("dist") != "loadscope":
            return None
        from xdist.scheduler import LoadScopeScheduling

        class FileScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return xdist_group(nodeid)

        config.option.loadscopereorder = False
        return FileScheduling(config, log)


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(FileUnits(), "vfm-file-units")


def slow_rank(group: str) -> int:
    for i, prefix in enumerate(SLOW_FIRST):
        if group.startswith(prefix):
            return i
    return len(SLOW_FIRST)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    import torch

    # whole files per worker (`--dist loadscope`), slowest first; the sort is stable, so tests keep
    # their order inside a file
    items.sort(key=lambda item: slow_rank(xdist_group(item.nodeid)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def small_disk(tmp_path):
    """(mount point, resize(size)): a real full disk, a tmpfs of 200 kB in tmp_path (needs root
    and ``mount``; skipped elsewhere), unmounted afterwards; ``resize("1M")`` as a person frees
    space."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {r.stderr.strip()}")

    def resize(size: str) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mnt)], check=True)

    try:
        yield mnt, resize
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def data_root() -> Path:
    return Path(os.environ["VFM_DATA_DIR"])


class MixedShards:
    """Shards of images and videos at several native latent sizes, shared by the packed-training
    tests of one process (tests/train) and of several (tests/parallel)."""

    LATENTS = [
        (4, 1, 4, 4),
        (4, 2, 4, 4),
        (4, 3, 4, 6),
        (4, 1, 6, 4),
        (4, 2, 5, 4),
        (4, 4, 4, 4),
        (4, 2, 6, 6),
        (4, 1, 4, 7),
        (4, 3, 4, 4),
        (4, 1, 8, 8),
        (4, 2, 4, 6),
        (4, 1, 4, 4),
    ]
    """Latent (C, T, H, W) of every sample; patch (1, 2, 2): images (T = 1) and videos of 4..18
    tokens, two with an odd H or W (cropped to the patch multiple: 5 -> 4, 7 -> 6)."""

    @staticmethod
    def caption_embed(captions: list[str]):
        """One caption -> (1, words, 16) token vectors seeded by the words: captions of different
        lengths (call with ``embed_batch=1``)."""
        import numpy as np

        rng = np.random.default_rng(sum(map(ord, captions[0])))
        return rng.standard_normal((1, len(captions[0].split()), 16)).astype(np.float32) / 4

    @classmethod
    def write(
        cls,
        root: Path,
        *,
        latents: bool = True,
        seed: int = 0,
        embed=None,
        meta: dict | None = None,
    ) -> Path:
        """Real one-frame / multi-frame H.264 clips under ``root`` with stored latents of the
        ``LATENTS`` sizes (pixels = latent * 8, frames = 1 + 4 (T - 1); latent values drawn from
        ``seed``) and captions of 2-11 words, in 3+ shards; ``latents=False``: the clips alone
        (for the tokenizer). ``embed`` / ``meta``: another caption encoder and index meta."""
        import numpy as np
        import pandas as pd

        from vfm_core.data.shards import ShardWriterConfig, write_shards
        from vfm_core.video.synthetic import Segment, VideoSpec, make_video

        (root / "clips").mkdir(parents=True)
        rows, lat = [], {}
        rng = np.random.default_rng(seed)
        for i, (c, t, h, w) in enumerate(cls.LATENTS):
            cid, frames = f"mixed{i:03d}", 1 + 4 * (t - 1)
            spec = VideoSpec(
                width=8 * w,
                height=8 * h,
                fps=8.0,
                seed=i,
                segments=(Segment(kind="moving", n_frames=frames),),
            )
            make_video(root / "clips" / f"{cid}.mp4", spec)
            caption = " ".join(["shapes"] * (2 + i % 10))
            rows.append(
                {
                    "clip_id": cid,
                    "video_id": f"v{i}",
                    "source_uri": f"/raw/v{i}.mp4",
                    "start_s": 0.0,
                    "end_s": frames / 8.0,
                    "uri": f"clips/{cid}.mp4",
                    "caption": caption,
                    "width": 8 * w,
                    "height": 8 * h,
                    "fps": 8.0,
                    "n_frames": frames,
                }
            )
            # a class-dependent mean: something to learn in a few steps
            z = rng.standard_normal((c, t, h, w)) * 0.5 + (i % 3 - 1) * 0.5
            lat[cid] = z.astype(np.float32)
        out = root / ("shards" if latents else "clip-shards")
        cfg = ShardWriterConfig(target_shard_bytes=8_000, embed_batch=1)
        write_shards(
            pd.DataFrame(rows),
            str(out),
            embed=embed or cls.caption_embed,
            base_url=str(root),
            latents=lat if latents else None,
            config=cfg,
            meta=meta,
        )
        return out


@pytest.fixture(scope="session")
def mixed_shards() -> type[MixedShards]:
    """The mixed image / video shard builder: ``mixed_shards.write(root)``, its
    ``mixed_shards.LATENTS`` sizes."""
    return MixedShards


@pytest.fixture(scope="session")
def token_shards(tmp_path_factory):
    """(root, tokenizer dir): 4 real 64x64 H.264 clips of 9 frames encoded by a discrete
    tokenizer (tok-tiny-discrete) into shards of token ids under ``root / "dst"`` (grid 3x8x8,
    192 tokens each; 256 ids), for the autoregressive family."""
    import numpy as np
    import pandas as pd

    from vfm_core.data.shards import ShardWriterConfig, write_shards
    from vfm_core.tokenizer import save_tokenizer
    from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
    from vfm_core.tokenizer.config import get_tokenizer_config
    from vfm_core.tokenizer.encode_shards import encode_shards
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    def embed(captions: list[str]) -> np.ndarray:
        rng = np.random.default_rng(len(captions))
        return rng.standard_normal((len(captions), 384)).astype(np.float32)

    root = tmp_path_factory.mktemp("ar-shards")
    rows = []
    for i in range(4):
        path = root / "clips" / f"c{i}.mp4"
        path.parent.mkdir(exist_ok=True)
        make_video(
            path,
            VideoSpec(
                width=64, height=64, fps=8.0, seed=i, segments=(Segment(kind="moving", n_frames=9),)
            ),
        )
        rows.append(
            {
                "clip_id": f"c{i}",
                "uri": str(path),
                "caption": f"clip {i}",
                "n_frames": 9,
                "height": 64,
                "width": 64,
            }
        )
    write_shards(
        pd.DataFrame(rows),
        str(root / "src"),
        embed=embed,
        config=ShardWriterConfig(target_shard_bytes=1),
    )
    tok = save_tokenizer(
        CausalVideoAutoencoder(get_tokenizer_config("tok-tiny-discrete")), root / "tok"
    ).parent
    encode_shards(str(root / "src"), str(root / "dst"), tokenizer=tok)
    return root, tok


@pytest.fixture(autouse=True)
def _mlflow_tracking_uri_restored():
    """A test that points MLflow's process-global tracking URI at its own (short-lived) server
    must not leave it there for the next test: ``mlflow.set_tracking_uri`` sets the module global
    and ``MLFLOW_TRACKING_URI`` in the environment, which the next run would read."""
    import os
    import sys

    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    before = getattr(utils, "_tracking_uri", None)
    env = os.environ.get("MLFLOW_TRACKING_URI")  # mlflow.set_tracking_uri sets it too
    yield
    utils = sys.modules.get("mlflow.tracking._tracking_service.utils")
    if utils is not None and getattr(utils, "_tracking_uri", None) != before:
        utils._tracking_uri = before
    if os.environ.get("MLFLOW_TRACKING_URI") != env:
        if env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = env
