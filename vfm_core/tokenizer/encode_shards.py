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

import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vfm_core import storage
from vfm_core.data.index import read_index, write_index
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.data.shard_reader import RawSample, ShardError, parse_indexed, read_raw
from vfm_core.data.shards import ShardWriter, npy_bytes
from vfm_core.output_lock import output_lock
from vfm_core.progress import Progress
from vfm_core.tokenizer.autoencoder import TokenizerShapeError
from vfm_core.video.io import VideoError, decode_frames

__all__ = ["EncodeShardsResult", "encode_shards"]

_log = logging.getLogger(__name__)


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


def encode_clip(tokenizer, frames: np.ndarray, *, where: str) -> np.ndarray:
    """RGB uint8 (F, H, W, 3) -> normalised latent (C, T', h, w) float32 (see module docstring;
    the crop, frame cut and pixel convention are the tokenizer's ``encode_frames``)."""
    try:
        z = tokenizer.encode_frames(frames)  # (C, T', h, w)
    except TokenizerShapeError as e:
        raise ShardError(where, str(e)) from None
    return z.cpu().numpy().astype(np.float32)


def encode_shards(
    src: str,
    dst: str,
    *,
    tokenizer: str | Path,
    overwrite: bool = False,
) -> EncodeShardsResult:
    """Write a copy of the shard dataset ``src`` under ``dst`` with latents (module docstring);
    a progress line every few seconds through :mod:`logging` (:class:`vfm_core.progress.Progress`).
    One writer per ``dst`` (:mod:`vfm_core.output_lock`): a second is refused, naming the first.
    """
    if storage.join(src, "") == storage.join(dst, ""):
        raise ShardError(dst, "the output directory must differ from the source shards")
    with output_lock(dst, what="shards folder"):
        return _encode_shards(src, dst, tokenizer=tokenizer, overwrite=overwrite)


def _encode_shards(
    src: str, dst: str, *, tokenizer: str | Path, overwrite: bool
) -> EncodeShardsResult:
    """:func:`encode_shards` once the writer lock of ``dst`` is held."""
    import time

    from vfm_core.tokenizer import load_tokenizer

    t0 = time.perf_counter()
    index = read_index(src)
    tok = load_tokenizer(tokenizer)
    rows: list[dict[str, Any]] = []
    encoded = 0
    bar = Progress(len(index), desc="encoding latents", unit="sample", logger=_log)
    # the one shard writer, one output shard per source shard (same names)
    with bar, ShardWriter(dst, target_bytes=1 << 62) as writer:
        for shard_id, shard in index.shards.iterrows():
            writer.new_shard(str(shard["name"]))
            for i in np.flatnonzero(index.samples["shard"].to_numpy() == shard_id):
                row = index.samples.iloc[int(i)]
                key = str(row["key"])
                where = f"{index.shard_url(int(shard_id))} sample {key}"
                s = parse_indexed(
                    index, int(i), read_raw(index, int(i)), where=index.shard_url(int(shard_id))
                )
                latent = s.latent
                if latent is None or overwrite:
                    latent = _encoded_latent(tok, s.mp4, where=where)  # (C, T', h, w)
                    encoded += 1
                placed = writer.add(_members(key, s, latent, tok))
                rows.append(
                    {
                        **{k: row[k] for k in ("key", "frames", "height", "width")},
                        "latent_shape": [int(d) for d in latent.shape],
                        "placed": placed,
                    }
                )
                bar.update()
    shard_rows = writer.shards
    samples = _sample_table(rows)
    meta = {**index.meta, "latents": _latents_meta(tok, tokenizer=tokenizer, src=src)}
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


def _encoded_latent(tok: Any, mp4: bytes, *, where: str) -> np.ndarray:
    """The tokenizer's latent (C, T', h, w) of one encoded clip; ShardError naming ``where``
    when the clip does not decode."""
    try:
        frames = decode_frames(io.BytesIO(mp4), threads="SLICE")  # (F, H, W, 3)
    except VideoError as e:
        raise ShardError(where, f"cannot decode the clip ({e})") from None
    return encode_clip(tok, frames, where=where)


def _members(key: str, s: RawSample, latent: np.ndarray, tok: Any) -> list[tuple[str, bytes]]:
    """The tar members of one sample: the source's metadata, clip and caption embedding, the
    latent (C, T', h, w), and for a discrete tokenizer the ids (T', h, w) int32 too."""
    members = [
        (f"{key}.json", json.dumps(s.meta, sort_keys=True).encode()),
        (f"{key}.mp4", s.mp4),
        (f"{key}.txt_emb.npy", npy_bytes(s.txt_emb)),
        (f"{key}.latent.npy", npy_bytes(latent)),
    ]
    if tok.fsq is not None:
        codes = torch.from_numpy(np.ascontiguousarray(latent)).movedim(0, -1)  # (T', h, w, C)
        ids = tok.fsq.codes_to_indices(codes).numpy().astype(np.int32)
        members.append((f"{key}.tokens.npy", npy_bytes(ids)))
    return members


def _sample_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The index's sample table of the written rows (each with where the writer ``placed`` it:
    shard, offset, length, checksum)."""
    rows = [{**r.pop("placed"), **r} for r in rows]
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
    return samples


def _latents_meta(tok: Any, *, tokenizer: str | Path, src: str) -> dict[str, Any]:
    """The index meta ``latents``: which tokenizer encoded them, from which shards."""
    return {
        "tokenizer": str(tokenizer),
        "normalized": True,
        "compression": [
            tok.cfg.temporal_factor,
            tok.cfg.spatial_factor,
            tok.cfg.spatial_factor,
        ],
        "source": str(src),
        "fsq_levels": list(tok.cfg.fsq_levels),
    }
