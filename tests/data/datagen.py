"""Test inputs for the data tests: synthetic clips as a curation-style manifest, a fast
deterministic caption embedding."""

from __future__ import annotations

import hashlib
import io
import json
import socket
from pathlib import Path

import numpy as np
import pandas as pd

from vfm_core.video.synthetic import Segment, VideoSpec, make_video

# (frames, height, width): images and clips of several sizes and durations
SHAPES = [(1, 32, 32), (9, 32, 48), (5, 48, 32), (1, 64, 48), (13, 32, 32), (9, 48, 48)]


def hash_embed(captions: list[str], dim: int = 16) -> np.ndarray:
    """Deterministic caption embedding for fast tests (the real MiniLM one is tested on its own):
    a unit vector seeded by the caption's sha256."""
    out = []
    for c in captions:
        seed = int.from_bytes(hashlib.sha256(c.encode()).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
        out.append(v / np.linalg.norm(v))
    return np.stack(out)  # (N, dim)


def make_clips(root: Path, n: int, *, seed: int = 0) -> pd.DataFrame:
    """Write ``n`` synthetic clips under ``root/clips`` and ``root/clips.parquet``."""
    (root / "clips").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        frames, h, w = SHAPES[i % len(SHAPES)]
        cid = f"clip{seed:02d}{i:04d}"
        spec = VideoSpec(
            width=w,
            height=h,
            fps=8.0,
            seed=seed * 1000 + i,
            segments=(Segment(kind="moving", n_frames=frames),),
        )
        make_video(root / "clips" / f"{cid}.mp4", spec)
        rows.append(
            {
                "clip_id": cid,
                "video_id": f"vid{i // 3}",
                "source_uri": f"/raw/vid{i // 3}.mp4",
                "start_s": 0.0,
                "end_s": frames / 8.0,
                "uri": f"clips/{cid}.mp4",
                "caption": f"moving shapes number {i}",
                "width": w,
                "height": h,
                "fps": 8.0,
                "n_frames": frames,
                "motion_score": 0.5,
            }
        )
    df = pd.DataFrame(rows)
    df.to_parquet(root / "clips.parquet")
    return df


def npy(a: np.ndarray) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def good_members(key: str, mp4: bytes, dim: int = 16) -> list[tuple[str, bytes]]:
    meta = {"caption": key, "frames": 1, "height": 32, "width": 32}
    return [
        (f"{key}.json", json.dumps(meta).encode()),
        (f"{key}.mp4", mp4),
        (f"{key}.txt_emb.npy", npy(hash_embed([key], dim)[0][None])),
    ]


def craft_dataset(root: Path, samples: dict[str, list[tuple[str, bytes]]], dim: int = 16):
    """One shard with exactly the given members per sample (good or deliberately bad) and a
    valid index, as the writer would produce: for the bad-input tests."""
    import tarfile

    from vfm_core.data.index import write_index
    from vfm_core.data.index_tables import DatasetIndex

    root.mkdir(parents=True, exist_ok=True)
    rows = []
    with tarfile.open(root / "shard-000000.tar", "w", format=tarfile.GNU_FORMAT) as tar:
        for key, members in samples.items():
            start = tar.offset
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            rows.append(
                {
                    "key": key,
                    "shard": 0,
                    "offset": start,
                    "length": tar.offset - start,
                    "frames": 1,
                    "height": 32,
                    "width": 32,
                    "latent_shape": None,
                }
            )
    data = (root / "shard-000000.tar").read_bytes()
    shards = pd.DataFrame(
        [
            {
                "name": "shard-000000.tar",
                "n_samples": len(rows),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        ]
    )
    samples_df = pd.DataFrame(rows)
    samples_df["latent_shape"] = samples_df["latent_shape"].astype(object)
    index = DatasetIndex(root=str(root), shards=shards, samples=samples_df, embedding_dim=dim)
    write_index(index)
    return index


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
