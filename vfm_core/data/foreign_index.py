"""Bring your own WebDataset: index foreign tars in place (what ``vfm index SHARDS_DIR`` runs).

Stage order of :func:`index_foreign_shards` (the foreign tars are never rewritten):

1. list     ``SHARDS_DIR/*.tar``, sorted (plain tars only: byte ranges need an uncompressed
            tar, so ``.tar.gz`` / ``.tgz`` are refused with a message).
2. scan     each tar's members with their byte offsets, grouped by key as webdataset groups them
            (``webdataset.tariterators.base_plus_ext``: key = path up to the first dot of the file
            name, suffix lower-cased; ``__meta__`` files, links and directories ignored). A key's
            members must be contiguous (one byte range per sample); a key seen in two shards is an
            error naming both.
3. sample   per key: the media member (first of ``video_key`` present; videos and images),
            the caption (``txt`` member or ``json:FIELD``), geometry from a PyAV probe (images
            are one-frame clips). Bad samples are skipped and counted with a reason; missing
            captions are counted and embedded as the empty caption, or skipped
            (``skip_uncaptioned``).
4. embed    captions -> (L, D) or pooled (1, D) embeddings through the shard writer's embedder
            path (``_embed_all``), stored float16.
5. sidecar  ``SHARDS_DIR/_vfm/emb-{i:06d}.tar`` written with ``webdataset.TarWriter``:
            ``{key}.txt_emb.npy`` + ``{key}.vfm.json`` (caption, geometry, origin).
6. index    ``SHARDS_DIR/index.json``: our index with the foreign columns (``member_key``,
            ``media``, ``emb_shard`` / ``emb_offset`` / ``emb_length``, see
            :mod:`vfm_core.data.index`); the loader reads both ranges of a sample.

Why the scan uses :mod:`tarfile` and not ``webdataset.WebDataset``: webdataset's iterators yield
names and bytes but not the members' offsets in the tar, which the index is made of.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.index import INDEX_NAME, DatasetIndex, is_member_key, write_index
from vfm_core.data.shard_reader import ShardError

WRITER = "vfm_core.data.foreign_index"
SIDECAR_DIR = "_vfm"
VIDEO_EXTS = ("mp4", "webm", "mkv", "mov", "m4v", "avi")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
MEDIA_EXTS = VIDEO_EXTS + IMAGE_EXTS
"""Media member extensions PyAV decodes (images as one-frame clips)."""
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.tar$")
_BLOCK = 512
NO_CAPTION = "no caption (--skip-uncaptioned)"


class ForeignIndexError(ShardError):
    """Foreign shards that cannot be indexed (none found, compressed, non-contiguous or duplicate
    keys, no media member anywhere); names the shard or directory and the reason."""


@dataclass(kw_only=True, slots=True)
class ForeignIndexConfig:
    """How :func:`index_foreign_shards` reads foreign samples."""

    caption_key: str = "txt"
    """Caption source: a member extension holding UTF-8 text (``txt``) or ``json:FIELD`` (a field
    of the ``json`` member; dots reach into nested objects)."""
    video_key: str | None = None
    """Media member extension(s), ``;``-separated alternatives in order (``mp4``, ``jpg;png``);
    None: the first of :data:`MEDIA_EXTS` a sample has."""
    skip_uncaptioned: bool = False
    """Skip samples without a caption (counted) instead of using the empty caption."""
    sidecar_shard_bytes: int = 64 << 20
    """Start a new sidecar tar once the current one reaches this size."""
    embed_batch: int = 64
    """Captions per call of the text embedder."""

    def media_exts(self) -> tuple[str, ...]:
        """The media extensions to look for, in order; checks both keys (clear errors)."""
        cap = self.caption_key
        if not re.fullmatch(r"json:[^.\s]+(\.[^.\s]+)*|[a-z0-9_]+(\.[a-z0-9_]+)*", cap):
            raise ForeignIndexError(
                "--caption-key", f"{cap!r}: expected a member extension (txt) or json:FIELD"
            )
        if self.video_key is None:
            return MEDIA_EXTS
        exts = tuple(e.strip().lower().lstrip(".") for e in self.video_key.split(";") if e.strip())
        bad = [e for e in exts if e not in MEDIA_EXTS]
        if bad or not exts:
            raise ForeignIndexError(
                "--video-key", f"{self.video_key!r}: unknown media extension(s) {bad}; "
                f"decodable are {', '.join(MEDIA_EXTS)}"
            )  # fmt: skip
        return exts


@dataclass(kw_only=True, slots=True)
class ForeignSample:
    """One usable foreign sample (its first byte range and what the index records)."""

    key: str
    """Index key (``member_key`` with characters other than ``A-Za-z0-9_-`` replaced by ``_``)."""
    member_key: str
    shard: int
    offset: int
    length: int
    media: str
    caption: str
    captioned: bool
    frames: int
    height: int
    width: int


@dataclass(kw_only=True, slots=True)
class _Group:
    """Consecutive members of one key in a foreign tar."""

    member_key: str
    members: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    start: int = 0
    end: int = 0
    duplicate: str = ""


@dataclass(kw_only=True, slots=True)
class _Scan:
    samples: list[ForeignSample] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    exts: Counter = field(default_factory=Counter)
    ignored_members: int = 0
    owner: dict[str, tuple[str, str]] = field(default_factory=dict)
    """index key -> (shard name, member key) of its first sight: duplicate detection."""

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {reason}{f' ({detail})' if detail else ''}")


# ------------------------------------------------------------------------------------ scanning
def list_foreign_shards(shards_dir: str) -> list[str]:
    """Names of the plain ``*.tar`` files directly under ``shards_dir``, sorted."""
    try:
        files = storage.list_files(shards_dir)
    except storage.StorageError as e:
        raise ForeignIndexError(
            str(shards_dir), f"cannot list the directory ({e.reason})"
        ) from None
    _, root = storage.filesystem(shards_dir)
    rel = [f.split("://", 1)[-1][len(root.rstrip("/")) + 1 :] for f in files]
    top = [r for r in rel if "/" not in r]
    tars = sorted(r for r in top if r.endswith(".tar"))
    packed = sorted(r for r in top if r.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")))
    if not tars:
        extra = f" (compressed tars {packed[:3]}: decompress them, the loader reads byte ranges "
        raise ForeignIndexError(
            str(shards_dir),
            "no .tar shards found" + (extra + "of plain tars)" if packed else ""),
        )
    bad = [t for t in tars if not _SHARD_NAME.match(t)]
    if bad:
        raise ForeignIndexError(
            str(shards_dir), f"shard names must match [A-Za-z0-9_.-]+.tar, rename {bad[:3]}"
        )
    return tars


def _groups(tar: tarfile.TarFile, url: str, scan: _Scan) -> list[_Group]:
    """The tar's samples as webdataset groups them; non-contiguous keys are an error."""
    from webdataset.tariterators import base_plus_ext

    groups: list[_Group] = []
    seen: set[str] = set()
    cur: _Group | None = None
    for m in tar:
        base = m.name.rsplit("/", 1)[-1]
        key, ext = base_plus_ext(m.name) if m.isreg() else (None, None)
        if key is None or (base.startswith("__") and base.endswith("__")):
            scan.ignored_members += 1  # directory, link, __meta__ file or no extension
            cur = None  # never inside a sample's byte range
            continue
        ext = ext.lower()
        if cur is None or cur.member_key != key:
            if key in seen:
                raise ForeignIndexError(
                    url,
                    f"the members of sample {key!r} are not contiguous (member {m.name!r} comes "
                    "after other samples' members); the index needs one byte range per sample: "
                    "rewrite the shard grouped by key (webdataset.TarWriter / ShardWriter do)",
                )
            seen.add(key)
            cur = _Group(member_key=key, start=m.offset)
            groups.append(cur)
        if ext in cur.members:
            cur.duplicate = m.name
        cur.members[ext] = m
        cur.end = m.offset_data + -(-m.size // _BLOCK) * _BLOCK
    return groups


def _json_field(doc: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(part)
    return doc


def _caption(g: _Group, read: Any, caption_key: str, doc: Any) -> tuple[str | None, str]:
    """(caption or None when missing, skip reason when unusable)."""
    if caption_key.startswith("json:"):
        if "json" not in g.members:
            return None, ""
        value = _json_field(doc, caption_key[5:])
        if value is None:
            return None, ""
        if not isinstance(value, str):
            return None, f"caption field {caption_key[5:]!r} is a {type(value).__name__}"
        return value.strip() or None, ""
    if caption_key not in g.members:
        return None, ""
    try:
        text = read(g.members[caption_key]).decode("utf-8")
    except UnicodeDecodeError:
        return None, f"caption member .{caption_key} is not UTF-8 text"
    return text.strip() or None, ""


def _sample(
    g: _Group, tar: tarfile.TarFile, shard: int, name: str, cfg: ForeignIndexConfig, scan: _Scan
) -> ForeignSample | None:
    from vfm_core.video.io import VideoError, probe

    where = f"{name} {g.member_key}"

    def read(m: tarfile.TarInfo) -> bytes:
        f = tar.extractfile(m)
        assert f is not None
        return f.read()

    scan.exts.update(list(g.members))
    if g.duplicate:
        scan.skip(where, "duplicate member", g.duplicate)
        return None
    if not is_member_key(g.member_key):
        scan.skip(where, "unsafe key (absolute or '..')")
        return None
    media = next((e for e in cfg.media_exts() if e in g.members), None)
    if media is None:
        scan.skip(where, "no media member", f"has {sorted(g.members)}")
        return None
    doc = None
    if "json" in g.members:
        try:
            doc = json.loads(read(g.members["json"]))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            scan.skip(where, "invalid json member", str(e))
            return None
    caption, bad = _caption(g, read, cfg.caption_key, doc)
    if bad:
        scan.skip(where, "unusable caption", bad)
        return None
    if caption is None and cfg.skip_uncaptioned:
        scan.skip(where, NO_CAPTION)
        return None
    try:
        info = probe(io.BytesIO(read(g.members[media])))
    except VideoError as e:
        scan.skip(where, "media does not decode", e.reason)
        return None
    frames = 1 if media in IMAGE_EXTS else max(1, int(info.n_frames))
    return ForeignSample(
        key=re.sub(r"[^A-Za-z0-9_-]", "_", g.member_key),
        member_key=g.member_key,
        shard=shard,
        offset=g.start,
        length=g.end - g.start,
        media=media,
        caption=caption or "",
        captioned=caption is not None,
        frames=frames,
        height=int(info.height),
        width=int(info.width),
    )


def scan_shard(url: str, name: str, shard: int, cfg: ForeignIndexConfig, scan: _Scan) -> int:
    """Add the usable samples of one foreign tar to ``scan``; returns how many."""
    with storage.open_url(url, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise ForeignIndexError(url, "gzip-compressed: the loader reads byte ranges of plain "
                                    "tars, decompress it (gunzip) and index again")  # fmt: skip
        f.seek(0)
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                n = 0
                for g in _groups(tar, url, scan):
                    key = re.sub(r"[^A-Za-z0-9_-]", "_", g.member_key)
                    if key in scan.owner:
                        first, mk = scan.owner[key]
                        raise ForeignIndexError(
                            url, f"duplicate sample key {g.member_key!r}: also in shard {first} "
                            f"(as {mk!r}); keys must be unique across shards ({name} and {first})"
                        )  # fmt: skip
                    scan.owner[key] = (name, g.member_key)
                    s = _sample(g, tar, shard, name, cfg, scan)
                    if s is not None:
                        scan.samples.append(s)
                        n += 1
        except tarfile.TarError as e:
            raise ForeignIndexError(url, f"not a readable tar ({e})") from None
    return n


# ------------------------------------------------------------------------------------ writing
def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _sha256_of(url: str) -> str:
    h = hashlib.sha256()
    for chunk in storage.iter_chunks(url):
        h.update(chunk)
    return h.hexdigest()


def _sidecar_sample(s: ForeignSample, emb: np.ndarray, shard_name: str) -> dict[str, Any]:
    doc = {"caption": s.caption, "captioned": s.captioned, "frames": s.frames, "height": s.height,
           "width": s.width, "media": s.media, "kind": "image" if s.frames == 1 else "video",
           "source": {"shard": shard_name, "key": s.member_key}}  # fmt: skip
    return {"__key__": s.key, "txt_emb.npy": _npy_bytes(emb.astype(np.float16)),
            "vfm.json": json.dumps(doc, sort_keys=True).encode()}  # fmt: skip


def write_sidecars(
    shards_dir: str, samples: list[ForeignSample], embs: list[np.ndarray], shard_names: list[str],
    target_bytes: int,
) -> tuple[pd.DataFrame, list[tuple[int, int, int]]]:  # fmt: skip
    """Sidecar tars (``webdataset.TarWriter``) of the caption embeddings; returns the sidecar
    table and per sample (sidecar, offset, length)."""
    import webdataset as wds

    rows: list[dict[str, Any]] = []
    ranges: list[tuple[int, int, int]] = []
    # plain bytes, fixed owner and mtime: the same captions give byte-identical sidecars
    opts: dict[str, Any] = dict(encoder=False, user="", group="", mode=0o644, mtime=0.0,
                                format="PAX_FORMAT")  # fmt: skip
    i = 0
    with tempfile.TemporaryDirectory(prefix="vfm-sidecar-") as tmp:
        while i < len(samples):
            path, first = Path(tmp) / f"emb-{len(rows):06d}.tar", i
            with open(path, "wb") as f, wds.TarWriter(f, **opts) as w:
                while i < len(samples) and (i == first or w.tarstream.offset < target_bytes):
                    start = w.tarstream.offset
                    w.write(_sidecar_sample(samples[i], embs[i], shard_names[samples[i].shard]))
                    ranges.append((len(rows), start, w.tarstream.offset - start))
                    i += 1
            storage.put_file(path, storage.join(shards_dir, SIDECAR_DIR, path.name))
            rows.append({"name": f"{SIDECAR_DIR}/{path.name}", "n_samples": i - first,
                         "bytes": path.stat().st_size,
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})  # fmt: skip
    _remove_stale_sidecars(shards_dir, {r["name"] for r in rows})
    return pd.DataFrame(rows), ranges


def _remove_stale_sidecars(shards_dir: str, keep: set[str]) -> None:
    """Sidecars of an earlier ``vfm index`` run that this one did not rewrite."""
    side = storage.join(shards_dir, SIDECAR_DIR)
    if not storage.exists(side):
        return
    fs, _ = storage.filesystem(side)
    for url in storage.list_files(side):
        name = f"{SIDECAR_DIR}/{url.rsplit('/', 1)[-1]}"
        if re.fullmatch(rf"{SIDECAR_DIR}/emb-\d{{6}}\.tar", name) and name not in keep:
            fs.rm(storage.filesystem(url)[1])


def _refuse_foreign_index_over_ours(shards_dir: str) -> None:
    url = storage.join(shards_dir, INDEX_NAME)
    if not storage.exists(url):
        return
    try:
        writer = json.loads(storage.read_bytes(url)).get("meta", {}).get("writer")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        writer = None
    if writer != WRITER:
        raise ForeignIndexError(
            url, f"an index.json not written by `vfm index` is already there (writer {writer!r}); "
            "a vfm shard directory needs no `vfm index` — move it away to index the tars anew"
        )  # fmt: skip


def index_foreign_shards(
    shards_dir: str,
    *,
    embed: Any,
    config: ForeignIndexConfig | None = None,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Index the foreign WebDataset tars of ``shards_dir`` in place (see the module docstring);
    ``embed``: captions -> (N, D) or N x (L, D). Returns the summary (counts, skip reasons)."""
    from vfm_core.data.shards import _embed_all

    t0 = time.perf_counter()
    cfg = config or ForeignIndexConfig()
    wanted = cfg.media_exts()  # a bad --video-key fails before any reading
    _refuse_foreign_index_over_ours(shards_dir)
    names = list_foreign_shards(shards_dir)
    scan = _Scan()
    per_shard = [scan_shard(storage.join(shards_dir, n), n, i, cfg, scan)
                 for i, n in enumerate(names)]  # fmt: skip
    n_uncaptioned = sum(not s.captioned for s in scan.samples) + scan.skipped[NO_CAPTION]
    if not scan.samples:
        found = ", ".join(f"{e} ({n})" for e, n in scan.exts.most_common(12)) or "none"
        if scan.skipped.get("no media member") and not any(e in scan.exts for e in wanted):
            raise ForeignIndexError(
                str(shards_dir), f"no sample has a media member {'|'.join(wanted)} "
                f"(--video-key); member extensions found: {found}"
            )  # fmt: skip
        raise ForeignIndexError(
            str(shards_dir), f"no usable sample; skipped: {dict(scan.skipped)}; e.g. "
            f"{scan.examples[:3]}; member extensions found: {found}"
        )  # fmt: skip

    # shards without a usable sample stay out of the index (its shard numbers are remapped)
    used = [i for i, n in enumerate(per_shard) if n > 0]
    remap = {old: new for new, old in enumerate(used)}
    shard_rows = []
    for i in used:
        url = storage.join(shards_dir, names[i])
        fs, path = storage.filesystem(url)
        shard_rows.append({"name": names[i], "n_samples": per_shard[i],
                           "bytes": int(fs.size(path)), "sha256": _sha256_of(url)})  # fmt: skip

    embs = _embed_all([s.caption for s in scan.samples], embed, cfg.embed_batch)
    sidecars, ranges = write_sidecars(
        shards_dir, scan.samples, embs, names, cfg.sidecar_shard_bytes
    )
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
            }
            for s, r in zip(scan.samples, ranges)
        ]  # fmt: skip
    )
    samples["latent_shape"] = samples["latent_shape"].astype(object)
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
        "embedding_dim": int(embs[0].shape[-1]),
        "caption_key": cfg.caption_key,
        "video_key": ";".join(wanted),
    }
    index = DatasetIndex(
        root=str(shards_dir),
        shards=pd.DataFrame(shard_rows),
        samples=samples,
        embedding_dim=summary["embedding_dim"],
        meta={
            "writer": WRITER,
            "format": "webdataset",
            "caption_key": cfg.caption_key,
            "video_key": summary["video_key"],
            "skip_uncaptioned": cfg.skip_uncaptioned,
            **(meta or {}),
        },  # fmt: skip
        sidecars=sidecars,
    )
    write_index(index)
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
) -> dict[str, Any]:
    """``vfm index``: :func:`index_foreign_shards` with the caption encoder of ``vfm shard``,
    then the index read back and the shard sizes checked as a loader will."""
    from vfm_core.annotate.text_encoder import TextEncoder, TextSpec
    from vfm_core.data.index import read_index
    from vfm_core.data.shard_reader import verify_shards

    cfg = ForeignIndexConfig(caption_key=caption_key, video_key=video_key,
                             skip_uncaptioned=skip_uncaptioned,
                             sidecar_shard_bytes=int(sidecar_shard_mb * (1 << 20)))  # fmt: skip
    cfg.media_exts()  # a bad --video-key fails before the encoder loads
    encoder = TextEncoder(TextSpec(model=text_model, mode=text_mode))
    meta = {"text_model": text_model or "all-MiniLM-L6-v2", "text": encoder.record()}
    summary = index_foreign_shards(shards_dir, embed=encoder.encode, config=cfg, meta=meta)
    verify_shards(read_index(shards_dir), checksum=False)
    summary["captions_truncated"] = encoder.truncated
    summary["text_mode"] = text_mode
    return summary
