"""Encode shards: copy a shard dataset adding ``{key}.latent.npy`` (pre-encoded tokenizer latents)
to every video sample, so training reads latents instead of decoding and encoding video. With a
discrete (FSQ) tokenizer the latents are its codes and ``{key}.tokens.npy`` holds their int32 ids
(T', h, w) as well; the index records the FSQ levels.

Stage order of :func:`encode_shards`: read the source ``index.json`` → per sample, one byte-range
read, parse (the data package's defensive reader) → decode the MP4 to RGB frames → keep the first
``1 + t_c·k`` frames and centre-crop H, W to multiples of the spatial factor → tokenizer
``encode`` (normalised latents, the convention of
:class:`vfm_core.data.shard_source.ShardLatentSource`; causal, so the first T latent frames
equal those of a clip cut to its first 1 + t_c(T-1) frames)
→ write the sample's original records plus ``latent.npy`` (C, T', h, w) float32 into a new tar →
new validated ``index.json`` with per-sample ``latent_shape`` and the tokenizer recorded in
``meta.latents``. Output goes to a new directory (local or ``s3://``): source shards and their
checksums are never modified. Samples already carrying latents are copied unchanged unless
``overwrite``; samples smaller than one spatial factor are rejected with the key named.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vfm_core import storage
from vfm_core.data.index import DatasetIndex, read_index, write_index
from vfm_core.data.shard_reader import ShardError, parse_indexed, read_raw, sample_checksum
from vfm_core.data.shards import npy_bytes
from vfm_core.video.io import VideoError, decode_frames

__all__ = ["EncodeShardsResult", "encode_shards"]


@dataclass(kw_only=True, slots=True)
class EncodeShardsResult:
    """Summary of one :func:`encode_shards` run (JSON-friendly)."""

    index: str
    """URL of the written ``index.json``."""
    samples: int
    """Samples written."""
    encoded: int
    """Samples that got a new ``latent.npy``."""
    shards: int
    """Shards written."""
    seconds: float
    """Wall time."""


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


@torch.no_grad()
def encode_clip(tokenizer, frames: np.ndarray, *, where: str) -> np.ndarray:
    """RGB uint8 (F, H, W, 3) -> normalised latent (C, T', h, w) float32 (see module docstring)."""
    t_c, s = tokenizer.cfg.temporal_factor, tokenizer.cfg.spatial_factor
    f, h, w = frames.shape[:3]
    hh, ww = (h // s) * s, (w // s) * s
    if hh == 0 or ww == 0:
        raise ShardError(where, f"{h}x{w} frames are smaller than the spatial factor {s}")
    keep = 1 + t_c * ((f - 1) // t_c)
    y0, x0 = (h - hh) // 2, (w - ww) // 2
    clip = frames[:keep, y0 : y0 + hh, x0 : x0 + ww]  # (F', H', W', 3)
    x = torch.from_numpy(np.ascontiguousarray(clip)).permute(3, 0, 1, 2).float()  # (3, F', H', W')
    z = tokenizer.encode(x[None] / 127.5 - 1.0)  # (1, C, T', h, w) normalised
    return z[0].numpy().astype(np.float32)


def encode_shards(
    src: str,
    dst: str,
    *,
    tokenizer: str | Path,
    overwrite: bool = False,
    progress: Any = None,
) -> EncodeShardsResult:
    """Write a copy of the shard dataset ``src`` under ``dst`` with latents (module docstring).

    ``progress``: optional callable ``(done, total)`` for logging."""
    import time

    from vfm_core.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    if storage.join(src, "") == storage.join(dst, ""):
        raise ShardError(dst, "the output directory must differ from the source shards")
    index = read_index(src)
    tok = load_tokenizer(tokenizer)
    rows: list[dict[str, Any]] = []
    shard_rows: list[dict[str, Any]] = []
    encoded = 0
    tmp = Path(tempfile.mkdtemp(prefix="vfm-encode-"))
    try:
        for shard_id, shard in index.shards.iterrows():
            name = str(shard["name"])
            path = tmp / name
            n = 0
            with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
                for i in np.flatnonzero(index.samples["shard"].to_numpy() == shard_id):
                    row = index.samples.iloc[int(i)]
                    key = str(row["key"])
                    where = f"{index.shard_url(int(shard_id))} sample {key}"
                    s = parse_indexed(
                        index, int(i), read_raw(index, int(i)), where=index.shard_url(int(shard_id))
                    )
                    latent = s.latent
                    if latent is None or overwrite:
                        try:
                            frames = decode_frames(io.BytesIO(s.mp4))  # (F, H, W, 3)
                        except VideoError as e:
                            raise ShardError(where, f"cannot decode the clip ({e})") from None
                        latent = encode_clip(tok, frames, where=where)
                        encoded += 1
                    start = tar.offset
                    _add(tar, f"{key}.json", json.dumps(s.meta, sort_keys=True).encode())
                    _add(tar, f"{key}.mp4", s.mp4)
                    _add(tar, f"{key}.txt_emb.npy", npy_bytes(s.txt_emb))
                    _add(tar, f"{key}.latent.npy", npy_bytes(latent))
                    if tok.fsq is not None:  # discrete: the ids (T', h, w) int32 too
                        codes = torch.from_numpy(np.ascontiguousarray(latent)).movedim(0, -1)
                        ids = tok.fsq.codes_to_indices(codes).numpy().astype(np.int32)
                        _add(tar, f"{key}.tokens.npy", npy_bytes(ids))
                    rows.append(
                        {
                            **{k: row[k] for k in ("key", "frames", "height", "width")},
                            "shard": len(shard_rows),
                            "offset": start,
                            "length": tar.offset - start,
                            "latent_shape": [int(d) for d in latent.shape],
                        }
                    )
                    n += 1
                    if progress is not None:
                        progress(len(rows), len(index))
            data = path.read_bytes()
            for r in rows[len(rows) - n :]:  # this shard's samples: their per-sample checksums
                r["checksum"] = sample_checksum(data[r["offset"] : r["offset"] + r["length"]])
            storage.put_file(path, storage.join(dst, name))
            shard_rows.append(
                {
                    "name": name,
                    "n_samples": n,
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
            )
            path.unlink()
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    samples = pd.DataFrame(rows)[
        [
            "key",
            "shard",
            "offset",
            "length",
            "frames",
            "height",
            "width",
            "latent_shape",
            "checksum",
        ]
    ]
    for c in ("shard", "offset", "length", "frames", "height", "width"):
        samples[c] = samples[c].astype(int)
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    meta = {
        **index.meta,
        "latents": {
            "tokenizer": str(tokenizer),
            "normalized": True,
            "compression": [
                tok.cfg.temporal_factor,
                tok.cfg.spatial_factor,
                tok.cfg.spatial_factor,
            ],
            "source": str(src),
            "fsq_levels": list(tok.cfg.fsq_levels),
        },
    }
    out = DatasetIndex(
        root=str(dst),
        shards=pd.DataFrame(shard_rows),
        samples=samples,
        embedding_dim=index.embedding_dim,
        meta=meta,
    )
    url = write_index(out)
    return EncodeShardsResult(
        index=url,
        samples=len(samples),
        encoded=encoded,
        shards=len(shard_rows),
        seconds=time.perf_counter() - t0,
    )
