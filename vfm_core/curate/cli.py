"""`vfm curate SRC DST [--executor local|ray [--ray-address ADDR]] [...]`: front of `curate()`.

SRC is a local folder, an s3:// prefix or one video file; DST a local folder or s3:// prefix.
Writes DST/clips/*.mp4, DST/clips.parquet, DST/rejects.parquet, DST/videos.parquet; a rerun
skips finished videos; `--recaption` captions their clips again (new or fixed sidecars) without
splitting or encoding. Exit status 2 with a one-line message for user errors.
"""

from __future__ import annotations

import argparse
import json
import sys

from vfm_core.cli_types import int_at_least
from vfm_core.config_fields import add_flags
from vfm_core.curate.options import CurateOptions
from vfm_core.errors import UserError

FLAGS = (
    "splitter",
    "min_len_s",
    "max_len_s",
    "out_width",
    "out_fps",
    "stitch",
    "encoder",
    "preset",
    "crf",
    "audio",
    "vlm",
    "image_model",
)
"""The `CurateOptions` fields that are `vfm curate` flags (generated from the fields: flag names,
types, bounds, choices, defaults and help declared there once)."""


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    cu = sub.add_parser(
        "curate",
        help="raw videos -> H.264 clips + manifests (resumable)",
        description="Raw videos -> H.264 clips + manifests. Every second of an input is in a "
        "clip or a reject row (with start / end and the reason, e.g. a shot shorter than "
        "--min-len); the summary counts the rejected seconds.",
    )
    cu.add_argument("src", metavar="SRC", help="folder, s3:// prefix or video file")
    cu.add_argument("dst", metavar="DST", help="output folder or s3:// prefix")
    cu.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where the stages run (default: %(default)s)",
    )
    add_flags(cu, CurateOptions, FLAGS, show_defaults=True)
    cu.add_argument(
        "--workers",
        type=int_at_least("--workers", 1),
        default=None,
        metavar="N",
        help="with --executor local: items (a video's split, a clip's transcode) worked on at "
        "once, on threads (default: the CPUs this process may use)",
    )
    cu.add_argument(
        "--ray-cpus",
        type=int,
        default=2,
        help="CPUs of a local Ray instance (default: %(default)s)",
    )
    cu.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDR",
        help="with --executor ray: auto or HOST:PORT of a running cluster (default: local)",
    )
    cu.add_argument(
        "--semdedup",
        type=_cosine_or_auto,
        nargs="?",
        const="auto",
        default=None,
        metavar="COSINE",
        help="remove near-duplicate clips at this embedding cosine similarity (SemDeDup); "
        "without a value: the threshold calibrated for the colour embedding (0.995); "
        "with --image-model give the one measured for the model (default: off)",
    )
    cu.add_argument(
        "--recaption",
        action="store_true",
        help="caption the clips of finished videos again (after adding or fixing caption "
        "sidecars); clips are not split or encoded again. A changed --vlm recaptions anyway",
    )
    cu.add_argument("--json", action="store_true", help="print the summary as JSON")
    cu.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    return cu


def _cosine_or_auto(text: str) -> float | str:
    return text if text == "auto" else float(text)


def summary_line(out: dict) -> str:
    """One line: inputs, clips (how many have no caption, how many sound) and rejects with the
    seconds of source each holds, recaptioned videos and unusable caption sidecars."""
    done = f"{out['n_skipped']} already done"
    if out.get("n_recaptioned"):
        done += f", {out['n_recaptioned']} recaptioned"
    took = f" in {out['wall_s']:.1f} s" if "wall_s" in out else ""
    sound = f", {out['n_audio']} with sound" if out.get("n_audio") else ""
    line = (
        f"curated {out['n_inputs']} videos ({done}){took}: "
        f"{out['n_clips']} clips ({out['clip_s']:.1f} s, {out.get('n_uncaptioned', 0)} without "
        f"caption{sound}), {out['n_rejects']} rejects ({out['rejected_s']:.1f} s rejected)"
    )
    problems = out.get("caption_problems") or []
    if problems:
        more = f" (+{len(problems) - 1} more, see the log)" if len(problems) > 1 else ""
        line += f"; unusable caption sidecar: {problems[0]}{more}"
    if out.get("coverage_gaps"):
        line += f"; {len(out['coverage_gaps'])} range(s) unaccounted for (see the log)"
    return line


class CurationFailed(UserError, RuntimeError):
    """A curation that produced no clip: every input was rejected."""


def nothing_curated(out: dict) -> str | None:
    """The failure of a curation whose every input was rejected (no clip from any of its
    videos), with the count and the commonest causes; None when it produced clips or had no
    input."""
    if out["n_clips"] or not out["n_inputs"]:
        return None
    causes = ", ".join(f"{c} x{n}" for c, n in list(out.get("reject_causes", {}).items())[:3])
    return (
        f"curation of {out['n_inputs']} videos produced no clip: every input was rejected "
        f"({out['n_rejects']} rejects, {out['rejected_s']:.1f} s; {causes or 'no reason'}); the "
        f"reasons are in {out['rejects']}"
    )


def run(args: argparse.Namespace) -> int:
    from vfm_core import storage
    from vfm_core.contracts import ContractError
    from vfm_core.curate.config import CurateConfig
    from vfm_core.curate.executors import LocalExecutor, RayClusterError, RayExecutor
    from vfm_core.curate.pipeline import curate
    from vfm_core.curate.semdedup import SemDedupConfig, default_threshold
    from vfm_core.storage import StorageError
    from vfm_core.video.transcode import EncoderError, select_encoder

    try:
        cfg = CurateConfig(
            **{name: getattr(args, name) for name in FLAGS},
            semdedup=SemDedupConfig(
                threshold=default_threshold(args.image_model)
                if args.semdedup == "auto"
                else args.semdedup
            ),
        )
        select_encoder(cfg.encoder, setting="--encoder")  # fail before any work
        for url in (args.src, args.dst):
            storage.check_access(url)  # a remote store without credentials: one line, now
        if args.ray_address and args.executor != "ray":
            raise ValueError("--ray-address needs --executor ray")
        if args.workers is not None and args.executor != "local":
            raise ValueError("--workers is for --executor local (Ray sizes its own pools)")
        executor = (
            RayExecutor(num_cpus=args.ray_cpus, address=args.ray_address)
            if args.executor == "ray"
            else LocalExecutor(workers=args.workers)
        )
        out = curate(
            args.src,
            args.dst,
            executor=executor,
            config=cfg,
            progress=args.progress,
            recaption=args.recaption,
        )
    except (
        StorageError,
        ContractError,
        ValueError,
        FileNotFoundError,
        EncoderError,
        RayClusterError,
    ) as e:
        print(f"vfm curate: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out))
    else:
        print(summary_line(out))
        print(f"clips: {out['clips']}   rejects: {out['rejects']}")
    failed = nothing_curated(out)
    if failed:
        print(f"vfm curate: error: {failed}", file=sys.stderr)
        return 1
    return 0
