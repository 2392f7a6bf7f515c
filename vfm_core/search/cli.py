"""``vfm search CLIPS_DIR "QUERY" | --like CLIP_ID``: its flags and its run. Bad input
(:class:`~vfm_core.search.errors.SearchError`) is printed by ``vfm`` as one line, exit 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from vfm_core.cli_types import int_at_least


def add_parser(sub: argparse._SubParsersAction) -> None:
    from vfm_core.data.cli import add_text_args

    se = sub.add_parser(
        "search", help="clips of a curated dir by caption text or like a clip", intermixed=True
    )
    se.add_argument("clips_dir", help="curated clips dir with clips.parquet (local or s3://)")
    se.add_argument("query", nargs="?", help="text matched against the clip captions")
    se.add_argument("--top", type=int_at_least("--top", 1), default=10, help="hits to show")
    se.add_argument("--like", metavar="CLIP_ID", help="clips nearest this clip's embedding")
    se.add_argument("--sheet", metavar="OUT.png", help="also write a contact sheet of the hits")
    se.add_argument(
        "--exact", action="store_true", help="exact numpy search instead of the faiss IVF index"
    )
    add_text_args(se, mode=False)
    se.add_argument("--json", action="store_true", help="print the hits as a JSON list")


def run(args: argparse.Namespace) -> int:
    """A table (or JSON list) of the hits, best first; the index used and the clips it leaves
    out (no caption / no embedding) on stderr."""
    from vfm_core.search import ClipSearchConfig, IndexConfig, contact_sheet_of, search_clips
    from vfm_core.search.clips import sheet_path

    sheet = sheet_path(args.sheet) if args.sheet else None  # refused before the search
    index = IndexConfig(backend="exact" if args.exact else "faiss")
    cfg = ClipSearchConfig(top_k=args.top, text_model=args.text_model, index=index)
    search, hits = search_clips(args.clips_dir, args.query, like=args.like, config=cfg)
    if args.json:
        print(json.dumps([dataclasses.asdict(h) for h in hits]))
    else:
        print(f"{'rank':>4}  {'score':>6}  {'clip_id':<24}  {'caption':<48}  uri")
        for h in hits:
            cap = h.caption if len(h.caption) <= 48 else h.caption[:45] + "..."
            print(f"{h.rank:>4}  {h.score:>6.3f}  {h.clip_id:<24}  {cap:<48}  {h.uri}")
    field = "caption" if args.like is None else "embedding"
    used = search.index(field)
    n, total = len(used.index), len(search.manifest)
    left_out = f" ({total - n} more without a {field}: not searched)" if n < total else ""
    how = "built" if used.built else "cached"
    print(
        f"{len(hits)} of {n} clips{left_out}, {used.index.config.backend} index ({how}: "
        f"{used.url})",
        file=sys.stderr,
    )
    if sheet is not None:
        print(f"contact sheet: {contact_sheet_of(hits, sheet)}", file=sys.stderr)
    return 0
