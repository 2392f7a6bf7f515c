"""The ``vfm`` command's argparse parser: every subcommand and its flags (:func:`build_parser`).

The forms are the stable contract listed in :mod:`vfm_core.cli`'s docstring; the handlers live
there and in :mod:`vfm_core.cli_sizing`.
"""

from __future__ import annotations

import argparse
import difflib
import math
import sys

from vfm_core.cli_types import int_at_least
from vfm_core.config import ParallelDegrees
from vfm_core.config_fields import add_flags
from vfm_core.launch.launcher import Launch
from vfm_core.recipes import TINY_FSQ_LEVELS
from vfm_core.train.args import TrainArgs


class _Refused(Exception):
    """An error of an intermixed parse: the plain parse reruns and reports it."""


class _Parser(argparse.ArgumentParser):
    """argparse that takes a flag only as spelled in full (with argparse's prefix matching,
    ``vfm shard --in x`` read as ``--index-format x``), reports an unknown flag at the command
    that got it, with the nearest flags it knows, and any error in one line, exit 2."""

    def __init__(self, *args, intermixed: bool = False, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._intermixed = intermixed
        self._passes = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """With ``intermixed`` (a command with an optional positional, ``vfm search DIR --top 3
        "red"``), positionals anywhere among the flags: Python 3.11's plain parse gives the
        optional one nothing at the first flag and refuses it later as unrecognized. When the
        intermixed parse fails or leaves words over, the plain parse reruns and reports them."""
        if self._passes:  # inside parse_known_intermixed_args: its two plain passes
            return super().parse_known_args(args, namespace)
        if self._intermixed:
            self._passes = True
            try:
                ns, extras = self.parse_known_intermixed_args(args, namespace)
                if not extras:
                    return ns, extras
            except _Refused:
                pass
            finally:
                self._passes = False
        self._argv = list(sys.argv[1:] if args is None else args)
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a leaf command: nobody else will take them
            self.error(self._unrecognized(extras))
        return ns, extras

    def _unrecognized(self, extras: list[str]) -> str:
        """'unrecognized arguments: --inp x (--inp: did you mean --input?)': the nearest known
        flags of each unknown one."""
        known = sorted(s for s in self._option_string_actions if s.startswith("--"))
        hints = []
        for flag in (e.split("=", 1)[0] for e in extras if e.startswith("--")):
            near = [k for k in known if k.startswith(flag)]
            near = near or difflib.get_close_matches(flag, known, n=2, cutoff=0.75)
            if near:
                hints.append(f"{flag}: did you mean {' or '.join(near[:3])}?")
        return f"unrecognized arguments: {' '.join(extras)}" + (
            f" ({'; '.join(hints)})" if hints else ""
        )

    def error(self, message: str) -> None:  # type: ignore[override]
        if self._passes:
            raise _Refused(message)
        if message.startswith("the following arguments are required") and self._subparsers is None:
            # "--step 3" is why "--steps" is missing: name the unknown flag first
            unknown = [
                a
                for a in getattr(self, "_argv", [])
                if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions
            ]
            if unknown:
                message = self._unrecognized(unknown)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="vfm", description="vfm: raw videos to a trained video model")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    tr = sub.add_parser(
        "train", help="train a DiT or autoregressive model (one process, or --nproc N: torchrun)"
    )
    add_flags(tr, TrainArgs, skip=("no_progress",))
    add_flags(tr, Launch)
    add_flags(tr, ParallelDegrees, unset="parallel")
    _add_sizing(sub)
    sub.add_parser("recipes", help="list presets")
    _add_checkpoint(sub)
    _add_tokenizer(sub)
    _add_sample(sub)
    _add_report(sub)
    _add_models(sub)

    from vfm_core.data.cli import add_parsers as add_data_parsers
    from vfm_core.search.cli import add_parser as add_search_parser

    add_data_parsers(sub)
    add_search_parser(sub)

    from vfm_core.curate.cli import add_parser as add_curate_parser

    add_curate_parser(sub)

    from vfm_core.infer.cli import add_parser as add_generate_parser

    add_generate_parser(sub)
    return ap


def _add_sizing(sub: argparse._SubParsersAction) -> None:
    """``vfm flops`` and ``vfm plan``."""
    fl = sub.add_parser("flops", help="parameters and training FLOPs per token of a preset")
    fl.add_argument("--recipe", required=True)
    seq = int_at_least("--seq", 1)
    fl.add_argument("--seq", type=seq, required=True, help="video tokens/sample")
    fl.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    fl.add_argument("--json", action="store_true", help="print one JSON object")

    pl = sub.add_parser("plan", help="predict memory/TFLOPS/MFU and rank 4D-parallel layouts")
    pl.add_argument("--recipe", required=True)
    pl.add_argument(
        "--seq", type=seq, required=True, help="video tokens/sample (at most 2**24 = 16777216)"
    )
    pl.add_argument(
        "--gpus", type=int_at_least("--gpus", 1), required=True, help="GPU count (at most 2**20)"
    )
    pl.add_argument(
        "--global-batch",
        type=int_at_least("--global-batch", 1),
        metavar="SAMPLES",
        help="samples per optimiser step (data.batch_size) that every compared layout trains "
        "(default 512: the paper-scale presets' batch of 1 is a smoke-run value)",
    )
    pl.add_argument("--hardware", default="h100", help="h100 | h200 | a100 | b200")
    pl.add_argument(
        "--fixed",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="pin layout keys (repeatable: the pins add up; one key pinned twice is an error)",
    )
    pl.add_argument(
        "--top", type=int_at_least("--top"), help="layouts to show (default 10; 0: all)"
    )
    pl.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a model.* field (with --check, a field of the run it builds); the "
        "layout is searched, not set: pin its keys with --fixed",
    )
    pl.add_argument("--json", action="store_true", help="print a JSON list, best first")
    pl.add_argument(
        "--explain",
        action="store_true",
        help="column legend, step-time breakdown per shown layout, why layouts were rejected",
    )
    pl.add_argument("--calibrate", metavar="RUNS", help="JSON/JSONL measured runs to fit")
    pl.add_argument(
        "--check",
        action="store_true",
        help="build the real model under the best (--fixed) layout at --gpus ranks in this "
        "process (fake process group, meta tensors) and print its per-rank bytes of "
        "parameters, gradients, optimizer state and EMA beside the planner's memory model "
        "(one layout: not with --top or --explain)",
    )
    pl.add_argument(
        "--on-gpu",
        action="store_true",
        help="with --check: also run that rank's training step for real on this machine's GPU "
        "(the same fake process group: collectives move nothing) and print its measured peak "
        "beside the trace; pp=1 layouts",
    )


def _add_checkpoint(sub: argparse._SubParsersAction) -> None:
    """``vfm checkpoint verify``, ``vfm checkpoint merge``."""
    ck = sub.add_parser("checkpoint", help="training checkpoints")
    cks = ck.add_subparsers(dest="ckpt_cmd", required=True, parser_class=_Parser)
    cv = cks.add_parser("verify", help="check checkpoints against their manifests (sha256)")
    cv.add_argument("path", help="a run directory (every checkpoint) or one step_* folder")
    cv.add_argument("--json", action="store_true", help="one JSON object per checkpoint")
    cm = cks.add_parser(
        "merge", help="a LoRA / partly frozen run's checkpoint as a plain model (run directory)"
    )
    cm.add_argument(
        "path", help="a run directory (its newest intact checkpoint) or a step_* folder"
    )
    cm.add_argument("--out", required=True, help="the new run directory (missing or empty)")


def _add_tokenizer(sub: argparse._SubParsersAction) -> None:
    """``vfm tokenizer train``."""
    tk = sub.add_parser("tokenizer", help="causal video tokenizer")
    tks = tk.add_subparsers(dest="tok_cmd", required=True, parser_class=_Parser)
    tt = tks.add_parser("train", help="train a tokenizer on the clips in shards")
    tt.add_argument("--shards", required=True, help="shard directory with index.json")
    tt.add_argument("--out", required=True, help="where tokenizer.safetensors + config go")
    tt.add_argument("--preset", default="tok-tiny", help="tokenizer preset")
    tt.add_argument("--steps", type=int_at_least("--steps", 1), default=200)
    tt.add_argument("--frames", type=int_at_least("--frames"), default=5, help="1 + 4k frames")
    tt.add_argument(
        "--size", type=int_at_least("--size", 1), default=32, help="square crop, pixels"
    )
    tt.add_argument("--seed", type=int_at_least("--seed"), default=0)
    tt.add_argument("--force", action="store_true", help="replace a tokenizer already in --out")
    tiny_levels = ",".join(map(str, TINY_FSQ_LEVELS))
    tt.add_argument(
        "--discrete",
        nargs="?",
        const=tiny_levels,
        metavar="LEVELS",
        help=f"discrete tokens: FSQ levels per channel (default {tiny_levels} = "
        f"{math.prod(TINY_FSQ_LEVELS)} ids, ar-tiny's vocabulary; 8,5,5,5 = 1000)",
    )


def _add_sample(sub: argparse._SubParsersAction) -> None:
    """``vfm sample``."""
    sp = sub.add_parser("sample", help="write the built-in captioned sample videos")
    sp.add_argument("dst", help="folder for sample_XX.mp4 and their per-shot caption sidecars")
    sp.add_argument("--videos", type=int_at_least("--videos", 1), default=3, help="how many videos")
    sp.add_argument("--seed", type=int_at_least("--seed"), default=0, help="first video's seed")
    sp.add_argument(
        "--held-out",
        action="store_true",
        help="only the combinations held out of training (an evaluation set)",
    )
    sp.add_argument(
        "--concept",
        metavar="COLOUR",
        help="only shots of a colour the sample never shows (magenta | cyan): fine-tuning data",
    )
    sp.add_argument("--json", action="store_true", help="print the written paths as JSON")


def _add_report(sub: argparse._SubParsersAction) -> None:
    """``vfm report`` and ``vfm track backfill``."""
    rp = sub.add_parser("report", help="scaling-study table from MLflow runs (+ plots with --out)")
    rp.add_argument("--study", required=True, help="study name (MLflow tag vfm.study)")
    rp.add_argument("--out", help="also write report.md, rows.json and PNG plots here")
    rp.add_argument("--tracking-uri", help="MLflow tracking URI (default: the project store)")
    rp.add_argument("--json", action="store_true", help="print the rows as JSON")

    tk = sub.add_parser("track", help="MLflow tracking of training runs")
    tks = tk.add_subparsers(dest="track_cmd", required=True, parser_class=_Parser)
    bf = tks.add_parser(
        "backfill",
        help="send what a run could not send to its MLflow server (metrics.jsonl, tags, status)",
    )
    bf.add_argument("run_dir", metavar="RUN_DIR", help="the training run's --out directory")
    bf.add_argument("--tracking-uri", help="MLflow tracking URI (default: the run's own)")
    bf.add_argument("--json", action="store_true", help="print the counts as JSON")


def _add_models(sub: argparse._SubParsersAction) -> None:
    """``vfm models copy``."""
    md = sub.add_parser("models", help="registered models (MLflow Model Registry)")
    mds = md.add_subparsers(dest="models_cmd", required=True, parser_class=_Parser)
    cp = mds.add_parser(
        "copy",
        help="copy registered versions with their runs to another store (the server of make up)",
    )
    cp.add_argument(
        "--from",
        dest="source",
        metavar="URI",
        help="the store to copy from (default: the sqlite store under the data dir)",
    )
    cp.add_argument(
        "--to",
        dest="target",
        metavar="URI",
        help="the store to copy to (default: MLFLOW_TRACKING_URI, the server of make up)",
    )
    cp.add_argument(
        "--name",
        action="append",
        dest="names",
        metavar="MODEL",
        help="a registered model to copy (repeatable; default: every vfm-* model)",
    )
    cp.add_argument("--dry-run", action="store_true", help="print what would be copied")
