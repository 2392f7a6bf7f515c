"""``vfm shard`` (a curation output -> our shards) and ``vfm index`` (foreign WebDataset tars
indexed in place): their flags and their runs. Bad input raises the data layer's errors, which
``vfm`` prints as one line (exit 2)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from vfm_core import storage
from vfm_core.cli_types import number
from vfm_core.config import ConfigError


def add_text_args(
    p: argparse.ArgumentParser, *, mode: bool = True, mode_default: str | None = "tokens"
) -> None:
    """``--text-model`` (and ``--text-mode``): the caption encoder, as ``vfm shard`` uses it."""
    p.add_argument(
        "--text-model",
        help="caption encoder path (default: all-MiniLM-L6-v2; a T5 encoder dir works too)",
    )
    if mode:
        p.add_argument(
            "--text-mode",
            choices=("tokens", "pooled"),
            default=mode_default,
            help="per-token caption embeddings (default) or one pooled vector",
        )


def add_parsers(sub: argparse._SubParsersAction) -> None:
    sh = sub.add_parser("shard", help="curation output -> WebDataset shards + index (local/s3)")
    sh.add_argument("clips_dir", help="curation output dir (clips.parquet, clips/)")
    sh.add_argument("shards_dir", help="where shards and index.json go (local or s3://)")
    sh.add_argument(
        "--target-shard-mb",
        type=number("--target-shard-mb", above=0),
        default=64.0,
        help="shard size target",
    )
    add_text_args(sh)
    add_format_arg(sh)
    sh.add_argument("--json", action="store_true", help="print the summary as JSON")

    ix = sub.add_parser(
        "index", help="index foreign WebDataset tars in place (+ caption embedding sidecars)"
    )
    ix.add_argument("shards_dir", help="directory of WebDataset .tar shards (local or s3://)")
    ix.add_argument(
        "--caption-key",
        help="caption member extension (default txt) or json:FIELD of the json member",
    )
    ix.add_argument(
        "--video-key",
        help="media member extension(s), ';'-separated alternatives (mp4, webm, "
        "jpg;png, ...); default: the first video or image member a sample has",
    )
    ix.add_argument(
        "--skip-uncaptioned",
        action="store_true",
        help="skip samples without a caption (default: count them, use the empty caption)",
    )
    add_text_args(ix, mode_default=None)
    ix.add_argument(
        "--sidecar-shard-mb",
        type=number("--sidecar-shard-mb", above=0),
        help="size target of the caption-embedding sidecar tars (default 64)",
    )
    add_format_arg(ix, default=None)
    ix.add_argument(
        "--decode-check",
        choices=("all", "first"),
        help="test decode of every video member: all its frames (default; clips that decode "
        "only in part are skipped and counted) or only the first (faster)",
    )
    ix.add_argument(
        "--migrate",
        action="store_true",
        help="convert SHARDS_DIR's index.json (any vfm dataset) to the columnar "
        "form in place (samples.parquet; the old index kept as index.v1.json), "
        "nothing re-indexed",
    )
    ix.add_argument("--json", action="store_true", help="print the summary as JSON")


def add_format_arg(p: argparse.ArgumentParser, *, default: str | None = "json") -> None:
    p.add_argument(
        "--index-format",
        choices=("json", "parquet"),
        default=default,
        help="json: every sample row in index.json; parquet: the rows in "
        "samples.parquet, read a row group at a time (datasets of 10^7+ samples)",
    )


INDEX_DEFAULTS = {
    "caption_key": "txt",
    "video_key": None,
    "skip_uncaptioned": False,
    "text_model": None,
    "text_mode": "tokens",
    "sidecar_shard_mb": 64.0,
    "index_format": "json",
    "decode_check": "all",
}
"""``vfm index``'s indexing options (their parser default is None / False: given or not is
known) and their defaults; ``--migrate`` takes none of them."""


def _index_options(args: argparse.Namespace) -> None:
    """Refuse indexing options with ``--migrate``; fill in the defaults of the others."""
    given = [k for k in INDEX_DEFAULTS if getattr(args, k) not in (None, False)]
    if args.migrate and given:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ConfigError(
            f"--migrate converts the existing index as it is (to the columnar form): it takes "
            f"no {flags}; run `vfm index` without --migrate to index anew"
        )
    for k, default in INDEX_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, default)


def run_shard(args: argparse.Namespace) -> int:
    from vfm_core.data.make_shards import shard_clips_dir

    storage.check_access(args.shards_dir)  # before the captions are embedded
    before = _local_files(args.shards_dir)
    try:
        summary = shard_clips_dir(
            args.clips_dir,
            args.shards_dir,
            target_shard_mb=args.target_shard_mb,
            text_model=args.text_model,
            text_mode=args.text_mode,
            index_format=args.index_format,
        )
    except OSError as e:
        if e.errno not in storage.DISK_FULL or before is None:
            raise
        raise _disk_full(args.shards_dir, before, e) from None
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"{summary['n_samples']} samples ({summary['images']} images) in "
        f"{summary['n_shards']} shards, {summary['bytes'] / 1e6:.1f} MB -> {summary['index']}"
    )
    if summary["captions_truncated"]:
        print(
            f"{summary['captions_truncated']} captions cut to the text encoder's limit",
            file=sys.stderr,
        )
    _say_some(
        summary["rejected"],
        "clips left out (listed in the index meta 'rejected')",
        lambda r: f"{r['clip_id']} ({r['uri']}): {r['reason']}",
    )
    _say_some(summary["stale_shards_removed"], "shards of an earlier run removed", str)
    return 0


def _local_files(url: str) -> set[Path] | None:
    """The files under a local output folder now (None for a remote one)."""
    if storage.is_remote(url):
        return None
    root = Path(url)
    return {p for p in root.rglob("*") if p.is_file()} if root.is_dir() else set()


def _disk_full(url: str, before: set[Path], error: OSError) -> storage.StorageError:
    """A shard run that met a full disk: the files it wrote are removed (what was there before
    is kept), one line says so, with the space then free."""
    root = Path(url)
    written = [p for p in root.rglob("*") if p.is_file() and p not in before]
    size = sum(p.stat().st_size for p in written)
    for p in written:
        p.unlink(missing_ok=True)
    if not before and root.is_dir() and not any(root.iterdir()):
        root.rmdir()
    try:
        free = f"{shutil.disk_usage(root if root.exists() else root.parent).free / 1e6:.1f} MB"
    except OSError:
        free = "unknown space"
    return storage.StorageError(
        url,
        f"the disk is full ({error.strerror}): the {len(written)} files this run wrote "
        f"({size / 1e6:.1f} MB) are removed, {free} free there; free space and run it again",
    )


def _say_some(items: list, what: str, show) -> None:
    """One stderr line: how many ``items`` and the first, e.g. ``2 clips left out, e.g. ...``."""
    if items:
        print(f"{len(items)} {what}, e.g. {show(items[0])}", file=sys.stderr)


def run_index(args: argparse.Namespace) -> int:
    """``vfm index SHARDS_DIR``: a summary line (or JSON); ``--migrate``: convert the index."""
    _index_options(args)
    if args.migrate:
        from vfm_core.data.index import migrate_index

        done = migrate_index(args.shards_dir)
        if args.json:
            print(json.dumps(done))
        else:
            what = "migrated to" if done["migrated"] else "already columnar:"
            print(f"{done['n_samples']} samples, {what} {done['index']} + samples.parquet")
        return 0
    from vfm_core.data.foreign_index import index_shards_dir

    summary = index_shards_dir(
        args.shards_dir,
        caption_key=args.caption_key,
        video_key=args.video_key,
        skip_uncaptioned=args.skip_uncaptioned,
        text_model=args.text_model,
        text_mode=args.text_mode,
        sidecar_shard_mb=args.sidecar_shard_mb,
        index_format=args.index_format,
        decode_check=args.decode_check,
    )
    if summary["n_samples"] and summary["n_uncaptioned"] == summary["n_samples"]:
        print(
            f"warning: none of the {summary['n_samples']} samples has a caption at --caption-key "
            f"{args.caption_key}: give the member extension (txt) or json:FIELD that holds them",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(summary))
        return 0
    print(
        f"{summary['n_samples']} samples ({summary['n_videos']} videos, {summary['n_images']} "
        f"images) in {summary['n_shards']} shards; {summary['n_uncaptioned']} uncaptioned, "
        f"{summary['n_skipped']} skipped -> {summary['index']}"
    )
    for reason, n in summary["skipped"].items():
        print(f"  skipped {n}: {reason}", file=sys.stderr)
    for example in summary["skipped_examples"][:5]:
        print(f"    e.g. {example}", file=sys.stderr)
    if summary["ignored_members"]:
        print(
            f"  ignored {summary['ignored_members']} tar members that belong to no sample "
            f"(directories, links, __meta__ files, names without an extension), e.g. "
            f"{summary['ignored_example']}",
            file=sys.stderr,
        )
    _say_some(summary["not_read"], "files that look like shards not read", str)
    return 0
