"""Bring your own WebDataset: index foreign tars in place (what ``vfm index SHARDS_DIR`` runs).

Stage order of :func:`index_foreign_shards` (the foreign tars are never rewritten):

1. list     ``SHARDS_DIR/*.tar``, sorted (regular files only, a FIFO is never opened; byte
            ranges need an uncompressed tar). Files that look like shards but are not read
            (``.tar.gz``, ``.TAR``, tars in subdirectories) are listed in the summary
            (``not_read``), an error when no plain tar is left.
2. scan     each tar's members with their byte offsets, grouped by key as webdataset groups them
            (``webdataset.tariterators.base_plus_ext``: key = path up to the first dot of the file
            name, suffix lower-cased; ``__meta__`` files, links and directories ignored and
            counted, ``ignored_members``). A key's
            members must be contiguous (one byte range per sample); a key seen in two shards is an
            error naming both.
3. sample   per key: the media member (first of ``video_key`` present; videos and images),
            the caption (``txt`` member or ``json:FIELD``), geometry from a PyAV probe (images
            are one-frame clips). Bad samples are skipped and counted with a reason; missing
            captions are counted and embedded as the empty caption, or skipped
            (``skip_uncaptioned``).
4. embed    captions -> (L, D) or pooled (1, D) embeddings through the shard writer's embedder
            path (:func:`~vfm_core.data.shards.embed_captions`), stored float16.
5. sidecar  ``SHARDS_DIR/_vfm/emb-{i:06d}.tar`` written with ``webdataset.TarWriter``:
            ``{key}.txt_emb.npy`` + ``{key}.vfm.json`` (caption, geometry, origin).
6. index    ``SHARDS_DIR/index.json``: our index with the foreign columns (``member_key``,
            ``media``, ``emb_shard`` / ``emb_offset`` / ``emb_length``, see
            :mod:`vfm_core.data.index`) and the per-sample checksum over both byte ranges (the
            foreign bytes as they were when indexed); the loader reads both ranges of a sample.

Stages 1-3 live in :mod:`vfm_core.data.foreign_scan`, 4-6 here. Why the scan uses
:mod:`tarfile` and not ``webdataset.WebDataset``: webdataset's iterators yield names and bytes but
not the members' offsets in the tar, which the index is made of.
"""

from __future__ import annotations

import json
import tarfile
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.foreign_scan import (
    NO_CAPTION,
    SIDECAR_DIR,
    ForeignIndexConfig,
    ForeignIndexError,
    ForeignSample,
    Scan,
    list_foreign_shards,
    scan_shard,
)
from vfm_core.data.index import INDEX_NAME, index_writer, write_index
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.data.shards import ShardWriter, embed_captions, npy_bytes, remove_stale_shards

WRITER = "vfm_core.data.foreign_index"


# ------------------------------------------------------------------------------------ writing
def _sidecar_members(s: ForeignSample, emb: np.ndarray, shard_name: str) -> list[tuple[str, bytes]]:
    doc = {
        "caption": s.caption,
        "captioned": s.captioned,
        "frames": s.frames,
        "height": s.height,
        "width": s.width,
        "media": s.media,
        "kind": "image" if s.frames == 1 else "video",
        "source": {"shard": shard_name, "key": s.member_key},
    }
    return [
        (f"{s.key}.txt_emb.npy", npy_bytes(emb.astype(np.float16))),
        (f"{s.key}.vfm.json", json.dumps(doc, sort_keys=True).encode()),
    ]


def write_sidecars(
    shards_dir: str,
    samples: list[ForeignSample],
    embs: list[np.ndarray],
    shard_names: list[str],
    target_bytes: int,
) -> tuple[pd.DataFrame, list[tuple[int, int, int]], list[str]]:
    """Sidecar tars of the caption embeddings (the one :class:`~vfm_core.data.shards.
    ShardWriter`, PAX headers for long foreign keys); returns the sidecar table, per sample
    (sidecar, offset, length) and its checksum (the sha256 begun over its foreign range,
    ``ForeignSample.hasher``, finished over its sidecar range)."""
    out = storage.join(shards_dir, SIDECAR_DIR)
    pax = tarfile.PAX_FORMAT
    with ShardWriter(out, prefix="emb", target_bytes=target_bytes, tar_format=pax) as writer:
        for s, emb in zip(samples, embs, strict=True):
            writer.add(_sidecar_members(s, emb, shard_names[s.shard]), seed=s.hasher)
    rows = [{**r, "name": f"{SIDECAR_DIR}/{r['name']}"} for r in writer.shards]
    ranges = [(r["shard"], r["offset"], r["length"]) for r in writer.samples]
    return pd.DataFrame(rows), ranges, [r["checksum"] for r in writer.samples]


def _refuse_foreign_index_over_ours(shards_dir: str) -> None:
    writer = index_writer(shards_dir)
    if writer not in (None, WRITER):
        raise ForeignIndexError(
            storage.join(shards_dir, INDEX_NAME),
            "an index.json not written by `vfm index` is already there (writer "
            f"{writer or None!r}); "
            "a vfm shard directory needs no `vfm index` — move it away to index the tars anew",
        )


def _refuse_empty_scan(shards_dir: str, scan: Scan, wanted: Sequence[str]) -> None:
    """No usable sample in the tars: say why (no media member of the ``wanted`` extensions, or
    the skip reasons) and which member extensions were found."""
    if scan.samples:
        return
    found = ", ".join(f"{e} ({n})" for e, n in scan.exts.most_common(12)) or "none"
    if scan.skipped.get("no media member") and not any(e in scan.exts for e in wanted):
        raise ForeignIndexError(
            str(shards_dir),
            f"no sample has a media member {'|'.join(wanted)} "
            f"(--video-key); member extensions found: {found}",
        )
    raise ForeignIndexError(
        str(shards_dir),
        f"no usable sample; skipped: {dict(scan.skipped)}; e.g. "
        f"{scan.examples[:3]}; member extensions found: {found}",
    )


def _shard_row(shards_dir: str, name: str, n_samples: int) -> dict[str, Any]:
    """The index's row of one tar: name, usable samples, size and content hash."""
    url = storage.join(shards_dir, name)
    fs, path = storage.filesystem(url)
    return {
        "name": name,
        "n_samples": n_samples,
        "bytes": int(fs.size(path)),
        "sha256": storage.content_hash(url, length=64),
    }


def _sample_table(
    scanned: Sequence[ForeignSample],
    ranges: Sequence[tuple[int, int, int]],
    checksums: Sequence[str],
    remap: dict[int, int],
) -> pd.DataFrame:
    """The index's sample rows: where each sample lies in its tar (shard numbers ``remap``-ped
    to the indexed tars), its media, and its caption embedding's sidecar range."""
    samples = pd.DataFrame(
        [
            {
                "key": s.key,
                "shard": remap[s.shard],
                "offset": s.offset,
                "length": s.length,
                "frames": s.frames,
                "height": s.height,
                "width": s.width,
                "latent_shape": None,
                "member_key": s.member_key,
                "media": s.media,
                "emb_shard": r[0],
                "emb_offset": r[1],
                "emb_length": r[2],
                "checksum": c,
            }
            for s, r, c in zip(scanned, ranges, checksums)
        ]
    )
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    return samples


def _index_meta(
    cfg: ForeignIndexConfig, *, video_key: str, extra: dict[str, Any] | None
) -> dict[str, Any]:
    """The index meta of foreign tars: who wrote it, their format and keys, and ``extra``."""
    return {
        "writer": WRITER,
        "format": "webdataset",
        "caption_key": cfg.caption_key,
        "video_key": video_key,
        "skip_uncaptioned": cfg.skip_uncaptioned,
        **(extra or {}),
    }


def _write_index_and_prune(
    index: DatasetIndex, shards_dir: str, sidecars: pd.DataFrame, *, index_format: str
) -> None:
    """Write ``index``, then remove the caption sidecars of earlier runs that it does not list
    (``sidecars``: its sidecar table)."""
    write_index(index, format=index_format)
    keep = {n.removeprefix(f"{SIDECAR_DIR}/") for n in sidecars["name"]}
    remove_stale_shards(storage.join(shards_dir, SIDECAR_DIR), "emb", keep)


def index_foreign_shards(
    shards_dir: str,
    *,
    embed: Any,
    config: ForeignIndexConfig | None = None,
    meta: dict[str, Any] | None = None,
    index_format: str = "json",
) -> dict[str, Any]:
    """Index the foreign WebDataset tars of ``shards_dir`` in place (see the module docstring);
    ``embed``: captions -> (N, D) or N x (L, D). Returns the summary (counts, skip reasons)."""
    t0 = time.perf_counter()
    cfg = config or ForeignIndexConfig()
    wanted = cfg.media_exts()  # a bad --video-key fails before any reading
    _refuse_foreign_index_over_ours(shards_dir)
    names, not_read = list_foreign_shards(shards_dir)
    scan = Scan()
    per_shard = [
        scan_shard(storage.join(shards_dir, n), n, i, cfg, scan) for i, n in enumerate(names)
    ]
    n_uncaptioned = sum(not s.captioned for s in scan.samples) + scan.skipped[NO_CAPTION]
    _refuse_empty_scan(shards_dir, scan, wanted)

    # shards without a usable sample stay out of the index (its shard numbers are remapped)
    used = [i for i, n in enumerate(per_shard) if n > 0]
    remap = {old: new for new, old in enumerate(used)}
    shard_rows = [_shard_row(shards_dir, names[i], per_shard[i]) for i in used]

    embs = embed_captions([s.caption for s in scan.samples], embed, cfg.embed_batch)
    sidecars, ranges, checksums = write_sidecars(
        shards_dir, scan.samples, embs, names, cfg.sidecar_shard_bytes
    )
    samples = _sample_table(scan.samples, ranges, checksums, remap)
    n_images = int((samples["frames"] == 1).sum())
    summary = {
        "shards_dir": str(shards_dir),
        "index": storage.join(shards_dir, INDEX_NAME),
        "n_samples": len(samples),
        "n_images": n_images,
        "n_videos": len(samples) - n_images,
        "n_uncaptioned": n_uncaptioned,
        "n_skipped": sum(scan.skipped.values()),
        "skipped": {k: v for k, v in scan.skipped.items() if v},
        "skipped_examples": scan.examples,
        "media": dict(Counter(samples["media"])),
        "n_shards": len(used),
        "shards_without_samples": [names[i] for i, n in enumerate(per_shard) if n == 0],
        "n_sidecars": len(sidecars),
        "bytes": int(sum(r["bytes"] for r in shard_rows)),
        "sidecar_bytes": int(sidecars["bytes"].sum()),
        "ignored_members": scan.ignored_members,
        "ignored_example": scan.ignored_example,
        "not_read": not_read,
        "embedding_dim": int(embs[0].shape[-1]),
        "caption_key": cfg.caption_key,
        "video_key": ";".join(wanted),
        "decode_check": cfg.decode_check,
    }
    index = DatasetIndex(
        root=str(shards_dir),
        shards=pd.DataFrame(shard_rows),
        samples=samples,
        embedding_dim=summary["embedding_dim"],
        meta=_index_meta(cfg, video_key=summary["video_key"], extra=meta),
        sidecars=sidecars,
    )
    _write_index_and_prune(index, shards_dir, sidecars, index_format=index_format)
    summary["index_format"] = index_format
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    return summary


def index_shards_dir(
    shards_dir: str,
    *,
    caption_key: str = "txt",
    video_key: str | None = None,
    skip_uncaptioned: bool = False,
    text_model: str | None = None,
    text_mode: str = "tokens",
    sidecar_shard_mb: float = 64.0,
    index_format: str = "json",
    decode_check: str = "all",
) -> dict[str, Any]:
    """``vfm index``: :func:`index_foreign_shards` with the caption encoder of ``vfm shard``,
    then the index read back and the shard sizes checked as a loader will."""
    from vfm_core.annotate.text_encoder import TextEncoder, TextSpec
    from vfm_core.data.index import read_index
    from vfm_core.data.shard_reader import verify_shards

    cfg = ForeignIndexConfig(
        caption_key=caption_key,
        video_key=video_key,
        skip_uncaptioned=skip_uncaptioned,
        sidecar_shard_bytes=int(sidecar_shard_mb * (1 << 20)),
        decode_check=decode_check,  # type: ignore[arg-type]
    )
    cfg.media_exts()  # a bad --video-key fails before the encoder loads
    encoder = TextEncoder(TextSpec(model=text_model, mode=text_mode))
    meta = {"text_model": text_model or "all-MiniLM-L6-v2", "text": encoder.record()}
    summary = index_foreign_shards(
        shards_dir, embed=encoder.encode, config=cfg, meta=meta, index_format=index_format
    )
    verify_shards(read_index(shards_dir), checksum=False)
    summary["captions_truncated"] = encoder.truncated
    summary["text_mode"] = text_mode
    return summary
