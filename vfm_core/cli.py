"""The ``vfm`` command. The forms below are a stable contract (acceptance checks use them):

vfm train --recipe NAME --steps N --out DIR [--seed S] [--resume | --resume-from CKPT_DIR] [--debug]
          [--init RUN_DIR|CKPT_DIR|models:/NAME@ALIAS]
          [--set section.field=value ...]
          [--nproc N] [--tp --cp --pp --dp-shard --dp-replicate D] [--max-restarts K]
          [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--rdzv-timeout S]]
vfm flops --recipe NAME --seq TOKENS [--json]
vfm plan --recipe NAME --seq TOKENS --gpus N --hardware h100 [--global-batch SAMPLES]
         [--fixed key=value,...] [--top K] [--json] [--explain] [--calibrate RUNS] [--check]
vfm recipes
vfm checkpoint verify RUN_DIR|CKPT_DIR [--json]
vfm checkpoint merge RUN_DIR|CKPT_DIR --out DIR
vfm shard CLIPS_DIR SHARDS_DIR [--target-shard-mb MB] [--text-model PATH]
          [--text-mode tokens|pooled] [--index-format json|parquet] [--json]
vfm index SHARDS_DIR [--caption-key txt|json:FIELD] [--video-key mp4|webm|jpg|png|...]
          [--skip-uncaptioned] [--text-model PATH] [--text-mode tokens|pooled]
          [--index-format json|parquet] [--json]
vfm index --migrate SHARDS_DIR   (index.json -> columnar samples.parquet, in place)
vfm curate SRC DST [--executor local|ray] [--splitter hybrid|color|stride|transnetv2] [--json] [...]
vfm generate --checkpoint DIR --prompt "..." --frames F --size HxW --seed S --out FILE.mp4
             [--nproc N] [--steps K] [--guidance G] [--tokenizer PATH]
             [--temperature T --top-k K --top-p P] [--prompt-video PATH | --prompt-tokens FILE]
vfm tokenizer train --shards DIR --out DIR [--preset tok-tiny] [--steps N] [--frames F] [--size S]
                    [--discrete [LEVELS]]
vfm report --study NAME [--out DIR] [--json]
vfm track backfill RUN_DIR [--tracking-uri URI] [--json]
vfm models copy [--from URI] [--to URI] [--name MODEL ...] [--dry-run]
vfm search CLIPS_DIR "QUERY" [--top K] [--json] [--like CLIP_ID] [--sheet OUT.png] [--exact]
vfm sample DST [--videos N] [--seed S] [--held-out | --concept COLOUR] [--json]

The parser is built in :mod:`vfm_core.cli_parser`, the sizing commands (flops, plan, recipes)
run in :mod:`vfm_core.cli_sizing`; the other handlers and the dispatch are here.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import warnings
from pathlib import Path

from vfm_core.cli_parser import build_parser
from vfm_core.cli_sizing import cmd_flops, cmd_plan, cmd_recipes
from vfm_core.config import ConfigError, apply_overrides, merge, merge_file, read_yaml, validate
from vfm_core.errors import UserError
from vfm_core.recipes import get_recipe


def run_config(args: argparse.Namespace):
    """The run's config: the recipe (``--recipe``, else the config file's ``recipe``, else
    dit-tiny), the config file on top, then ``--set`` and the flags."""
    if getattr(args, "out", None) is not None and not args.out.strip():
        raise ConfigError("--out is empty: name the run's directory")  # '' read as the cwd
    path = getattr(args, "config", None)
    data = read_yaml(path) if path else {}
    named = data.get("recipe")
    if args.recipe and named is not None and named != args.recipe:
        raise ConfigError(
            f"config file {path}: recipe: {named} but --recipe {args.recipe}: the file's "
            "sections would go on top of another recipe; keep one of the two"
        )
    recipe = args.recipe or named or _init_recipe(args) or "dit-tiny"
    if not isinstance(recipe, str):
        raise ConfigError(f"config file {path}: recipe: expected a preset name, got {recipe!r}")
    cfg = merge_file(data, path, get_recipe(recipe)) if path else get_recipe(recipe)
    cfg = apply_overrides(cfg, args.set)
    _refuse_flag_conflicts(args, data, path, cfg)
    extra: dict = {}
    if getattr(args, "steps", None) is not None:
        extra.setdefault("train", {})["steps"] = args.steps
    if getattr(args, "seed", None) is not None:
        extra.setdefault("train", {})["seed"] = args.seed
    if getattr(args, "out", None):
        extra.setdefault("train", {})["out_dir"] = args.out
    if getattr(args, "init", None) is not None:
        extra.setdefault("train", {})["init"] = args.init
    if getattr(args, "no_mlflow", False):
        extra["tracking"] = {"mlflow": False}
    return validate(merge(cfg, extra))


def _init_recipe(args: argparse.Namespace) -> str | None:
    """The recipe of the model ``--init`` names (a run started from it, no recipe given)."""
    if not getattr(args, "init", None):
        return None
    from vfm_core.checkpoints.init import open_init

    return open_init(args.init, check=False).cfg.recipe


def user_keys(args: argparse.Namespace) -> set[str]:
    """The dotted config keys the user set in the config file or with ``--set``."""
    from vfm_core.config import flatten, override_keys

    path = getattr(args, "config", None)
    data = read_yaml(path) if path else {}
    sections = {s: fields for s, fields in data.items() if isinstance(fields, dict)}
    return set(flatten(sections)) | set(override_keys(args.set))


def _refuse_flag_conflicts(args: argparse.Namespace, data: dict, path, cfg) -> None:
    """A flag and ``--set`` / the config file naming the same field with other values is an
    error naming both (the flag would otherwise win silently)."""
    from vfm_core.config import DEGREES, flatten, override_keys, refuse_disagreement

    sections = {s: fields for s, fields in data.items() if isinstance(fields, dict)}
    given = {key: f"config file {path}: {key}: {value}" for key, value in flatten(sections).items()}
    given |= {k: f"--set {text}" for k, text in override_keys(args.set).items()}
    flags = {"steps": "train.steps", "seed": "train.seed", "out": "train.out_dir"}
    flags |= {"init": "train.init"}
    flags |= {d: f"parallel.{d}" for d in DEGREES}
    for attr, key in flags.items():
        if (flag := getattr(args, attr, None)) is not None:
            refuse_disagreement(key, flag, f"--{attr.replace('_', '-')} {flag}", cfg, given)
    if getattr(args, "no_mlflow", False):
        refuse_disagreement("tracking.mlflow", False, "--no-mlflow", cfg, given)


def cmd_train(args: argparse.Namespace) -> int:
    from vfm_core.checkpoints.init import check_init, with_init_settings
    from vfm_core.config import DEGREES
    from vfm_core.families.data_settings import with_data_settings
    from vfm_core.launch.launcher import Launch
    from vfm_core.launch.preempt import Preempted
    from vfm_core.parallel.apply import check_conversions
    from vfm_core.parallel.layout import validate_layout, with_degrees
    from vfm_core.train.launch import launch_training
    from vfm_core.train.main import check_restartable, run_training

    degrees = {k: getattr(args, k) for k in DEGREES}
    given = user_keys(args)
    # the init model's network, then what the shards give the model, unless the user set it
    cfg = with_init_settings(with_degrees(run_config(args), **degrees), given)
    cfg = with_data_settings(cfg, given)
    if not (args.resume or args.resume_from):  # a resumed run has its own weights
        check_init(cfg)  # another family or architecture: one line before any process starts
    check_conversions(cfg)  # LoRA targets and rank, train.trainable patterns
    launch = Launch(
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        rdzv_timeout=args.rdzv_timeout,
        max_restarts=args.max_restarts,
    )
    if not launch.in_process:  # the one launcher: layout checked before any process starts
        res = launch_training(
            cfg,
            args.out,
            launch=launch,
            resume=args.resume,
            resume_from=args.resume_from,
            debug=args.debug,
        )
        if res.signum:  # forwarded to the ranks, which saved and said so
            return 128 + res.signum
        if res.returncode != 0:
            print(f"vfm train: error: torchrun exited with code {res.returncode}", file=sys.stderr)
            return res.returncode if res.returncode in (1, 2) else 1
        return 0
    # one process: the entry point in this process (the layout checked first, one clear line)
    validate_layout(cfg, launch.world_size)
    check_restartable(cfg, launch.max_restarts)
    try:
        summary = run_training(
            cfg,
            out_dir=args.out,
            resume=args.resume,
            progress=sys.stderr.isatty(),
            resume_from=args.resume_from,
        )
    except Preempted as e:  # SIGTERM / SIGUSR1: saved after the step; the signal's status
        print(f"vfm train: {e}", file=sys.stderr)
        return e.exit_code
    m = summary["metrics"]
    if "loss" in m:
        print(
            f"trained {cfg.recipe} to step {summary['step']}: loss {m['loss']:.4f}, "
            f"{m.get('tokens_per_s', 0):.0f} tokens/s, MFU {m.get('mfu', 0):.1%}"
        )
    else:
        print(f"{cfg.recipe} is at step {summary['step']}: no step trained now")
    print(f"metrics: {args.out}/metrics.jsonl   checkpoint: {summary['checkpoint']}")
    if summary["mlflow_run_id"]:
        print(f"MLflow run {summary['mlflow_run_id']}: {summary['mlflow_ui']}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """``vfm checkpoint verify PATH``: one line per checkpoint, oldest first; exit 1 when any is
    damaged or unfinished (``--resume`` would skip it), 2 when PATH holds no checkpoint.
    ``vfm checkpoint merge PATH --out DIR``: the plain model of a LoRA / partly frozen run."""
    if args.ckpt_cmd == "merge":
        from vfm_core.checkpoints.merge import merge_checkpoint

        merged = merge_checkpoint(args.path, args.out)
        print(f"merged {merged.source} on {merged.base} -> {merged.checkpoint}")
        return 0
    from vfm_core.checkpoints.integrity import MANIFEST_FILE, verify
    from vfm_core.checkpoints.manager import CheckpointManager

    path = Path(args.path)
    leftovers: list[Path] = []
    if (path / MANIFEST_FILE).exists() or (path / "state.json").exists():
        folders = [path]
    else:
        manager = CheckpointManager(path.parent if path.name == "checkpoints" else path)
        folders, leftovers = manager.candidates(), manager.leftovers()
    for left in leftovers:  # not checkpoints: said apart, never counted as damaged
        why = "a save that never finished (--resume removes it)"
        line = json.dumps({"leftover": str(left), "reason": why}) if args.json else ""
        print(line or f"left {left}: {why}")
    if not folders:
        print(f"vfm checkpoint: error: no checkpoint under {args.path}", file=sys.stderr)
        return 2
    bad = 0
    for folder in folders:
        problems = verify(folder)
        bad += bool(problems)
        if args.json:
            print(
                json.dumps(
                    {
                        "checkpoint": str(folder),
                        "ok": not problems,
                        "problems": [{"file": p.file, "reason": p.reason} for p in problems],
                    }
                )
            )
        elif problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            print(f"BAD  {folder}: {problems[0].file}: {problems[0].reason}{more}")
        else:
            print(f"ok   {folder}")
    if not args.json:
        print(f"{len(folders) - bad} of {len(folders)} checkpoint(s) intact")
    return 1 if bad else 0


def _check_tokenizer_out(out: str, *, force: bool) -> None:
    """``--out`` of ``vfm tokenizer train``, before the training: a local folder (empty, remote,
    a file, or one that already holds a tokenizer without ``--force``: one line each)."""
    from vfm_core import storage
    from vfm_core.tokenizer.io import WEIGHTS_FILE

    path = storage.local_folder(out, "--out", "the tokenizer")
    if (path / WEIGHTS_FILE).exists() and not force:
        raise ConfigError(
            f"--out {out}: already holds a tokenizer ({WEIGHTS_FILE}); pass --force to replace "
            "it, or choose another --out"
        )


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from vfm_core.tokenizer.from_shards import train_tokenizer_on_shards

    _check_tokenizer_out(args.out, force=args.force)
    levels = None
    if args.discrete is not None:
        try:
            levels = tuple(int(v) for v in args.discrete.split(","))
        except ValueError:
            raise ConfigError(
                f"--discrete: expected comma-separated integers such as 8,5,5,5, got "
                f"{args.discrete!r}"
            ) from None
    m = train_tokenizer_on_shards(
        args.shards,
        args.out,
        preset=args.preset,
        steps=args.steps,
        frames=args.frames,
        size=args.size,
        seed=args.seed,
        fsq_levels=levels,
    )
    from vfm_core.perf.hardware import cpu_speed

    usage = "" if levels is None else f", codebook usage {100 * m.codebook_usage:.1f}%"
    speed, _ = cpu_speed(m.steps, m.seconds, m.train_flops_per_s)
    print(
        f"tokenizer {args.preset}: {m.steps} steps in {m.seconds:.0f} s ({speed}), loss "
        f"{m.loss_first:.4f} -> {m.loss_last:.4f}, PSNR {m.psnr:.1f} dB (mean-colour baseline "
        f"{m.baseline_psnr:.1f}){usage} -> {args.out}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from vfm_core.perf import report

    if args.out is not None:  # before any MLflow work: a local folder, not a file or a URL
        report.check_out_dir(args.out, "--out")
    if args.out:
        summary = report.build_report(args.study, args.out, tracking_uri=args.tracking_uri)
        rows = json.loads((Path(args.out) / "rows.json").read_text())
        table = summary["table"]
    else:
        found = report.add_derived(report.study_runs(args.study, tracking_uri=args.tracking_uri))
        rows, table = [report.row_dict(r) for r in found], report.format_table(found)
    print(json.dumps(rows, indent=1) if args.json else table)
    if args.out and not args.json:
        print(f"report: {args.out}/report.md (plots: throughput.png, efficiency.png)")
    return 0


def cmd_track(args: argparse.Namespace) -> int:
    """``vfm track backfill RUN_DIR``: the steps of metrics.jsonl the MLflow run lacks, the
    tags, artifacts and end status a server outage left unsent (vfm_core.tracking_backlog)."""
    from vfm_core.tracking_backlog import backfill

    done = backfill(args.run_dir, tracking_uri=args.tracking_uri)
    if args.json:
        print(json.dumps(done))
    else:
        status = f", ended {done['status']}" if done["status"] else ""
        gone = done["missing_artifacts"]
        not_sent = f" ({len(gone)} not found: see the warnings)" if gone else ""
        print(
            f"MLflow run {done['run_id']} at {done['tracking_uri']}: sent {done['metrics']} "
            f"metric values, {done['tags']} tags, {done['artifacts']} artifacts{not_sent}{status}"
        )
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """``vfm models copy``: one line per version copied, then a summary
    (:mod:`vfm_core.registry.copy`)."""
    from vfm_core.registry.copy import copy_models, resolve_stores

    source, target, _ = resolve_stores(args.source, args.target)  # the same, a missing one

    def line(v) -> None:
        aliases = "".join(f", @{a}" for a in v.aliases)
        if v.target_version is None:
            print(f"{v.name} v{v.version} -> {target}: would copy{aliases}")
        else:
            at = f" as v{v.target_version}" if v.target_version != v.version else ""
            print(f"{v.name} v{v.version} -> {target}{at}: runs {v.runs}{aliases}")

    done = copy_models(
        source=source, target=target, names=args.names, dry_run=args.dry_run, on_version=line
    )
    verb = "would copy" if args.dry_run else "copied"
    models = ", ".join(done.models) or "no vfm-* model"
    print(
        f"{verb} {len(done.copied)} version(s) of {models} from {done.source} to {done.target}"
        f" ({done.present} already there)"
    )
    return 0


def cmd_shard(args: argparse.Namespace) -> int:
    from vfm_core.data.cli import run_shard

    return run_shard(args)


def cmd_index(args: argparse.Namespace) -> int:
    from vfm_core.data.cli import run_index

    return run_index(args)


def cmd_search(args: argparse.Namespace) -> int:
    from vfm_core.search.cli import run

    return run(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from vfm_core.infer.cli import run

    return run(args)


def cmd_curate(args: argparse.Namespace) -> int:
    from vfm_core.curate.cli import run

    return run(args)


def cmd_sample(args: argparse.Namespace) -> int:
    from vfm_core.video.sample_set import write_sample_videos

    try:
        paths = write_sample_videos(
            args.dst, n=args.videos, seed=args.seed, train=not args.held_out, concept=args.concept
        )
    except (ValueError, OSError) as e:
        print(f"vfm sample: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"videos": [str(p) for p in paths]}))
    else:
        kind = "held-out" if args.held_out else "training"
        kind = f"new-concept ({args.concept})" if args.concept else kind
        print(
            f"{len(paths)} sample videos of {kind} combinations in {args.dst} (captions per "
            f"shot in the .json beside each; `vfm curate {shlex.quote(str(args.dst))} OUT` "
            "cuts them into clips)"
        )
    return 0


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
    """A warning on the command line as the CLI's own warnings print: ``warning: <message>``
    (Python's format adds the file, line and source of the ``warn`` call, which mean nothing to a
    user; ``--debug`` keeps it)."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    from vfm_core.infra_env import use_running_services

    python_format = warnings.formatwarning
    if not getattr(args, "debug", False):
        warnings.formatwarning = _one_line_warning
    use_running_services()  # the servers of `make up`, when they run: one MLflow store
    try:
        return {
            "train": cmd_train,
            "flops": cmd_flops,
            "plan": cmd_plan,
            "recipes": cmd_recipes,
            "report": cmd_report,
            "track": cmd_track,
            "models": cmd_models,
            "tokenizer": cmd_tokenizer,
            "shard": cmd_shard,
            "index": cmd_index,
            "curate": cmd_curate,
            "generate": cmd_generate,
            "checkpoint": cmd_checkpoint,
            "search": cmd_search,
            "sample": cmd_sample,
        }[args.cmd](args)
    except UserError as e:  # a bad input, named: one line (vfm_core.errors)
        if getattr(args, "debug", False):
            import traceback

            traceback.print_exception(e)
        print(f"vfm {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback
        hint = ": --resume continues from the last checkpoint" if args.cmd == "train" else ""
        print(f"\nvfm {args.cmd}: interrupted{hint}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `vfm ... | head`: the reader went away; what is left goes nowhere
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a tool killed by SIGPIPE
    except Exception as e:  # a remote store's client refusing access mid-run: one line too
        from vfm_core.storage import remote_failure

        reason = remote_failure(e)
        if reason is None or getattr(args, "debug", False):
            raise
        print(f"vfm {args.cmd}: error: {reason}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = python_format  # main() called in-process (tests, flows)


if __name__ == "__main__":
    sys.exit(main())
