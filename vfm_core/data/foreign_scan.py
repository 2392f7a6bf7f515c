"""Scanning foreign WebDataset tars for :mod:`vfm_core.data.foreign_index` (stages 1-3 of its
docstring): the shards listed, each tar's members grouped by key with their byte ranges, and one
:class:`ForeignSample` per usable key (media member, caption, geometry); bad samples are counted
with a reason in a :class:`ScanResult`.

Every video member is test-decoded (``decode_check``): by default every frame, as the loader will
decode it, so a clip that decodes only in part (flipped or lost bytes past its first frame) is
skipped and named here instead of failing a training step; its frame count in the index is the
decoded one. The sha256 of each sample's byte range starts here (the index's per-sample checksum,
finished over its sidecar range in :mod:`vfm_core.data.foreign_index`)."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from vfm_core import storage
from vfm_core.data.index_tables import is_member_key
from vfm_core.data.shard_reader import ShardError, check_directory, relative_files

VIDEO_EXTS = ("mp4", "webm", "mkv", "mov", "m4v", "avi")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
MEDIA_EXTS = VIDEO_EXTS + IMAGE_EXTS
"""Media member extensions PyAV decodes (images as one-frame clips)."""
_SHARD_NAME = re.compile(r"^[A-Za-z0-9_.-]+\.tar$")
NO_CAPTION = "no caption (--skip-uncaptioned)"
SIDECAR_DIR = "_vfm"
"""Where ``vfm index`` writes its caption sidecars (inside SHARDS_DIR)."""


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
    decode_check: Literal["first", "all"] = "all"
    """Test decode of every video member: ``all`` its frames (what the loader decodes; a clip that
    decodes to fewer frames than it declares is skipped), ``first`` only the probe's first frame
    (faster: one frame per clip instead of all)."""

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
                "--video-key",
                f"{self.video_key!r}: unknown media extension(s) {bad}; "
                f"decodable are {', '.join(MEDIA_EXTS)}",
            )
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
    hasher: Any = None
    """sha256 over the sample's byte range in the foreign tar (the sidecar range is added when
    the sidecar is written: the per-sample checksum covers both)."""


@dataclass(kw_only=True, slots=True)
class _Group:
    """Consecutive members of one key in a foreign tar."""

    member_key: str
    members: dict[str, tarfile.TarInfo] = field(default_factory=dict)
    start: int = 0
    end: int = 0
    duplicate: str = ""


@dataclass(kw_only=True, slots=True)
class Scan:
    samples: list[ForeignSample] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    exts: Counter = field(default_factory=Counter)
    ignored_members: int = 0
    """Tar members that belong to no sample (directories, links, ``__meta__`` files, names
    without an extension); ``ignored_example`` names the first."""
    ignored_example: str = ""
    owner: dict[str, tuple[str, str]] = field(default_factory=dict)
    """index key -> (shard name, member key) of its first sight: duplicate detection."""

    def skip(self, where: str, reason: str, detail: str = "") -> None:
        self.skipped[reason] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{where}: {reason}{f' ({detail})' if detail else ''}")


# ------------------------------------------------------------------------------------ scanning
_COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")


def _not_read(rel: str) -> str | None:
    """Why a file that looks like a shard (a ``.tar`` in any case, compressed or not, at any
    depth) is not read; None for other files."""
    low = rel.lower()
    if not low.endswith((".tar", *_COMPRESSED)):
        return None  # not a shard by its name
    if "/" in rel:
        return "in a subdirectory: only tars directly under SHARDS_DIR are read"
    if low.endswith(_COMPRESSED):
        return "compressed: the loader reads byte ranges of plain tars, decompress it"
    return "extension not .tar in lower case: rename it"


def list_foreign_shards(shards_dir: str) -> tuple[list[str], list[str]]:
    """Names of the plain ``*.tar`` files directly under ``shards_dir``, sorted, and the files
    that look like shards but are not read (``"name: reason"``: compressed, in a subdirectory,
    ``.TAR``, no regular file such as a FIFO, which is never opened)."""
    check_directory(shards_dir, "SHARDS_DIR")
    try:
        rel = relative_files(shards_dir)
    except storage.StorageError as e:
        raise ForeignIndexError(
            str(shards_dir), f"cannot list the directory ({e.reason})"
        ) from None
    rel = [r for r in rel if not r.startswith(f"{SIDECAR_DIR}/")]  # our own sidecars
    local = not storage.is_remote(shards_dir)
    tars, not_read = [], []
    for r in rel:
        if r.endswith(".tar") and "/" not in r:
            kind = storage.not_regular(storage.join(shards_dir, r)) if local else None
            if kind is None:
                tars.append(r)
            else:
                not_read.append(f"{r}: {kind}, not a regular file (never opened)")
        elif (why := _not_read(r)) is not None:
            not_read.append(f"{r}: {why}")
    if not tars:
        extra = f"; not read: {'; '.join(not_read[:3])}" if not_read else ""
        raise ForeignIndexError(str(shards_dir), f"no plain .tar shards directly under it{extra}")
    bad = [t for t in tars if not _SHARD_NAME.match(t)]
    if bad:
        raise ForeignIndexError(
            str(shards_dir), f"shard names must match [A-Za-z0-9_.-]+.tar, rename {bad[:3]}"
        )
    return sorted(tars), not_read


def _groups(tar: tarfile.TarFile, url: str, scan: Scan) -> list[_Group]:
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
            scan.ignored_example = scan.ignored_example or f"{url.rsplit('/', 1)[-1]}: {m.name}"
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
        cur.end = m.offset_data + -(-m.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
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
    g: _Group, tar: tarfile.TarFile, shard: int, name: str, cfg: ForeignIndexConfig, scan: Scan
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
    data = read(g.members[media])
    try:
        info = probe(io.BytesIO(data))
    except VideoError as e:
        scan.skip(where, "media does not decode", e.reason)
        return None
    frames = 1 if media in IMAGE_EXTS else max(1, int(info.n_frames))
    if media not in IMAGE_EXTS and cfg.decode_check == "all":
        from vfm_core.video.io import count_frames

        try:
            count = count_frames(io.BytesIO(data))
        except VideoError as e:
            scan.skip(where, "media does not decode", e.reason)
            return None
        if count.declared and count.decoded < count.declared:
            detail = f"{count.decoded} of its {count.declared} frames decode"
            scan.skip(where, "media decodes only in part (damaged)", detail)
            return None
        frames = count.decoded
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


def scan_shard(url: str, name: str, shard: int, cfg: ForeignIndexConfig, scan: Scan) -> int:
    """Add the usable samples of one foreign tar to ``scan``; returns how many."""
    with storage.open_url(url, "rb") as f:
        if f.read(2) == b"\x1f\x8b":
            raise ForeignIndexError(
                url,
                "gzip-compressed: the loader reads byte ranges of plain "
                "tars, decompress it (gunzip) and index again",
            )
        f.seek(0)
        try:
            with tarfile.open(fileobj=f, mode="r:") as tar:
                n = 0
                for g in _groups(tar, url, scan):
                    key = re.sub(r"[^A-Za-z0-9_-]", "_", g.member_key)
                    if key in scan.owner:
                        first, mk = scan.owner[key]
                        raise ForeignIndexError(
                            url,
                            f"duplicate sample key {g.member_key!r}: also in shard {first} "
                            f"(as {mk!r}); keys must be unique across shards ({name} and {first})",
                        )
                    scan.owner[key] = (name, g.member_key)
                    s = _sample(g, tar, shard, name, cfg, scan)
                    if s is not None:
                        f.seek(g.start)  # the sample's byte range, as the loader will read it
                        s.hasher = hashlib.sha256(f.read(g.end - g.start))
                        scan.samples.append(s)
                        n += 1
        except tarfile.TarError as e:
            raise ForeignIndexError(url, f"not a readable tar ({e})") from None
    return n
