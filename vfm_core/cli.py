"""The ``vfm`` command. The forms below are a stable contract (acceptance checks use them):

vfm train --recipe NAME --steps N --out DIR [--seed S] [--resume | --resume-from CKPT_DIR] [--debug]
          [--set section.field=value ...]
          [--nproc N] [--tp --cp --pp --dp-shard --dp-replicate D] [--max-restarts K]
          [--nnodes N --node-rank R --rdzv-endpoint HOST:PORT [--rdzv-timeout S]]
vfm flops --recipe NAME --seq TOKENS [--json]
vfm plan --recipe NAME --seq TOKENS --gpus N --hardware h100 [--fixed key=value,...] [--top K]
         [--json] [--explain] [--calibrate RUNS]
vfm recipes
vfm checkpoint verify RUN_DIR|CKPT_DIR [--json]
vfm shard CLIPS_DIR SHARDS_DIR [--target-shard-mb MB] [--text-model PATH]
          [--text-mode tokens|pooled] [--index-format json|parquet] [--json]
vfm index SHARDS_DIR [--caption-key txt|json:FIELD] [--video-key mp4|webm|jpg|png|...]
          [--skip-uncaptioned] [--text-model PATH] [--text-mode tokens|pooled]
          [--index-format json|parquet] [--json]
vfm index --migrate SHARDS_DIR   (index.json -> columnar samples.parquet, in place)
vfm curate SRC DST [--executor local|ray] [--splitter color|stride|transnetv2] [--json] [...]
vfm generate --checkpoint DIR --prompt "..." --frames F --size HxW --seed S --out FILE.mp4
             [--nproc N] [--steps K] [--guidance G] [--tokenizer PATH]
vfm tokenizer train --shards DIR --out DIR [--preset tok-tiny] [--steps N] [--frames F] [--size S]
vfm report --study NAME [--out DIR] [--json]
vfm track backfill RUN_DIR [--tracking-uri URI] [--json]
vfm search CLIPS_DIR "QUERY" [--top K] [--json] [--like CLIP_ID] [--sheet OUT.png] [--exact]
vfm sample DST [--videos N] [--seed S] [--held-out] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vfm_core.cli_types import int_at_least
from vfm_core.config import ConfigError, apply_overrides, load_yaml, merge, validate
from vfm_core.errors import UserError
from vfm_core.recipes import RECIPES, get_recipe


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line and exits 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="vfm", description="vfm: raw videos to a trained video DiT")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    tr = sub.add_parser("train", help="train a DiT (one process, or --nproc N under torchrun)")
    tr.add_argument("--recipe", default="dit-tiny", help=f"preset ({', '.join(RECIPES)})")
    tr.add_argument("--config", help="YAML config applied on top of the recipe")
    tr.add_argument("--steps", type=int_at_least("--steps"), required=True, help="total steps")
    tr.add_argument("--out", required=True, help="output dir (metrics.jsonl, checkpoints)")
    tr.add_argument("--seed", type=int_at_least("--seed"), help="seed for init, sigma and noise")
    tr.add_argument(
        "--resume", action="store_true", help="continue from the newest intact checkpoint"
    )
    tr.add_argument(
        "--resume-from",
        metavar="CKPT_DIR",
        help="continue from this checkpoint folder (implies --resume)",
    )
    tr.add_argument("--debug", action="store_true", help="show the traceback behind an error")
    tr.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field (repeatable)",
    )
    tr.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    tr.add_argument(
        "--nproc",
        type=int_at_least("--nproc"),
        default=1,
        help="processes (GPUs) on this node; > 1 runs torchrun (gloo on CPU)",
    )
    for degree in ("dp-replicate", "dp-shard", "tp", "cp", "pp"):
        tr.add_argument(
            f"--{degree}",
            type=int_at_least(f"--{degree}"),
            help=f"parallel.{degree.replace('-', '_')} degree",
        )
    tr.add_argument(
        "--nnodes",
        type=int_at_least("--nnodes"),
        default=1,
        help="nodes of a multi-node run (torchrun c10d rendezvous)",
    )
    tr.add_argument(
        "--node-rank",
        type=int_at_least("--node-rank"),
        default=0,
        help="this node's index (0 hosts the rendezvous)",
    )
    tr.add_argument(
        "--rdzv-endpoint",
        default="",
        metavar="HOST:PORT",
        help="rendezvous endpoint of a multi-node run",
    )
    tr.add_argument(
        "--rdzv-timeout",
        type=int_at_least("--rdzv-timeout"),
        default=300,
        help="seconds to wait for the other nodes before giving up",
    )
    tr.add_argument(
        "--max-restarts",
        type=int_at_least("--max-restarts"),
        default=0,
        help="restart all ranks after one dies, from the last checkpoint",
    )

    fl = sub.add_parser("flops", help="parameters and training FLOPs per token of a preset")
    fl.add_argument("--recipe", required=True)
    fl.add_argument("--seq", type=int_at_least("--seq"), required=True, help="video tokens/sample")
    fl.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    fl.add_argument("--json", action="store_true", help="print one JSON object")

    pl = sub.add_parser("plan", help="predict memory/TFLOPS/MFU and rank 4D-parallel layouts")
    pl.add_argument("--recipe", required=True)
    pl.add_argument("--seq", type=int_at_least("--seq"), required=True, help="video tokens/sample")
    pl.add_argument("--gpus", type=int_at_least("--gpus"), required=True, help="GPU count")
    pl.add_argument("--hardware", default="h100", help="h100 | h200 | a100 | b200")
    pl.add_argument("--fixed", default="", metavar="KEY=VALUE,...", help="pin layout keys")
    pl.add_argument(
        "--top", type=int_at_least("--top"), default=10, help="layouts to show (0: all)"
    )
    pl.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
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
        "parameters, gradients, optimizer state and EMA beside the planner's memory model",
    )

    sub.add_parser("recipes", help="list presets")

    ck = sub.add_parser("checkpoint", help="training checkpoints")
    cks = ck.add_subparsers(dest="ckpt_cmd", required=True, parser_class=_Parser)
    cv = cks.add_parser("verify", help="check checkpoints against their manifests (sha256)")
    cv.add_argument("path", help="a run directory (every checkpoint) or one step_* folder")
    cv.add_argument("--json", action="store_true", help="one JSON object per checkpoint")

    tk = sub.add_parser("tokenizer", help="causal video tokenizer")
    tks = tk.add_subparsers(dest="tok_cmd", required=True, parser_class=_Parser)
    tt = tks.add_parser("train", help="train a tokenizer on the clips in shards")
    tt.add_argument("--shards", required=True, help="shard directory with index.json")
    tt.add_argument("--out", required=True, help="where tokenizer.safetensors + config go")
    tt.add_argument("--preset", default="tok-tiny", help="tokenizer preset")
    tt.add_argument("--steps", type=int_at_least("--steps"), default=200)
    tt.add_argument("--frames", type=int_at_least("--frames"), default=5, help="1 + 4k frames")
    tt.add_argument("--size", type=int_at_least("--size"), default=32, help="square crop, pixels")
    tt.add_argument("--seed", type=int_at_least("--seed"), default=0)
    tt.add_argument(
        "--discrete",
        nargs="?",
        const="8,5,5,5",
        metavar="LEVELS",
        help="discrete tokens: FSQ levels per channel (default 8,5,5,5 = 1000 ids)",
    )

    sp = sub.add_parser("sample", help="write the built-in captioned sample videos")
    sp.add_argument("dst", help="folder for sample_XX.mp4 and their per-shot caption sidecars")
    sp.add_argument("--videos", type=int_at_least("--videos", 1), default=3, help="how many videos")
    sp.add_argument("--seed", type=int_at_least("--seed"), default=0, help="first video's seed")
    sp.add_argument(
        "--held-out",
        action="store_true",
        help="only the combinations held out of training (an evaluation set)",
    )
    sp.add_argument("--json", action="store_true", help="print the written paths as JSON")

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

    from vfm_core.data.cli import add_parsers as add_data_parsers
    from vfm_core.search.cli import add_parser as add_search_parser

    add_data_parsers(sub)
    add_search_parser(sub)

    from vfm_core.curate.cli import add_parser as add_curate_parser

    add_curate_parser(sub)

    from vfm_core.infer.cli import add_parser as add_generate_parser

    add_generate_parser(sub)
    return ap


def _config(args: argparse.Namespace):
    cfg = get_recipe(args.recipe)
    if getattr(args, "config", None):
        cfg = load_yaml(args.config, base=cfg)
    cfg = apply_overrides(cfg, args.set)
    extra: dict = {}
    if getattr(args, "steps", None) is not None:
        extra.setdefault("train", {})["steps"] = args.steps
    if getattr(args, "seed", None) is not None:
        extra.setdefault("train", {})["seed"] = args.seed
    if getattr(args, "out", None):
        extra.setdefault("train", {})["out_dir"] = args.out
    if getattr(args, "no_mlflow", False):
        extra["tracking"] = {"mlflow": False}
    return validate(merge(cfg, extra))


def cmd_train(args: argparse.Namespace) -> int:
    from vfm_core.config import DEGREES
    from vfm_core.parallel.layout import validate_layout, with_degrees
    from vfm_core.train.launch import Launch, launch_training
    from vfm_core.train.main import check_restartable, run_training

    degrees = {k: getattr(args, k) for k in DEGREES}
    cfg = with_degrees(_config(args), **degrees)
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
        if res.returncode != 0:
            print(f"vfm train: error: torchrun exited with code {res.returncode}", file=sys.stderr)
            return res.returncode if res.returncode in (1, 2) else 1
        return 0
    # one process: the entry point in this process (the layout checked first, one clear line)
    validate_layout(cfg, launch.world_size)
    check_restartable(cfg, launch.max_restarts)
    summary = run_training(
        cfg,
        out_dir=args.out,
        resume=args.resume,
        progress=sys.stderr.isatty(),
        resume_from=args.resume_from,
    )
    m = summary["metrics"]
    print(
        f"trained {cfg.recipe} to step {summary['step']}: loss {m.get('loss', float('nan')):.4f}, "
        f"{m.get('tokens_per_s', 0):.0f} tokens/s, MFU {m.get('mfu', 0):.1%}"
    )
    print(f"metrics: {args.out}/metrics.jsonl   checkpoint: {summary['checkpoint']}")
    if summary["mlflow_run_id"]:
        print(f"MLflow run {summary['mlflow_run_id']}: {summary['mlflow_ui']}")
    return 0


def cmd_checkpoint(args: argparse.Namespace) -> int:
    """``vfm checkpoint verify PATH``: one line per checkpoint, oldest first; exit 1 when any is
    damaged or unfinished (``--resume`` would skip it), 2 when PATH holds no checkpoint."""
    from vfm_core.train.checkpoint import CheckpointManager
    from vfm_core.train.integrity import MANIFEST_FILE, verify

    path = Path(args.path)
    if (path / MANIFEST_FILE).exists() or (path / "state.json").exists():
        folders = [path]
    else:
        root = path.parent if path.name == "checkpoints" else path
        folders = CheckpointManager(root).candidates()
    if not folders:
        print(f"vfm checkpoint: error: no checkpoint under {path}", file=sys.stderr)
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


def cmd_flops(args: argparse.Namespace) -> int:
    from vfm_core.models.dit import build_model, count_params
    from vfm_core.perf.flops import train_flops_per_token

    cfg = apply_overrides(get_recipe(args.recipe), args.set)
    if args.seq <= 0:
        raise ConfigError(f"--seq must be positive, got {args.seq}")
    params = count_params(build_model(cfg.model, device="meta"))
    fpt = train_flops_per_token(cfg.model, seq_len=args.seq, text_len=cfg.model.text_len)
    if args.json:
        print(
            json.dumps(
                {"recipe": cfg.recipe, "seq": args.seq, "params": params, "flops_per_token": fpt}
            )
        )
    else:
        print(
            f"{cfg.recipe}: {params / 1e9:.3f} B params, {fpt / 1e9:.2f} GFLOPs/token "
            f"(training, seq {args.seq}), {fpt / params:.2f} x params"
        )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from vfm_core.perf.calibrate import calibrate
    from vfm_core.perf.hardware import DEFAULT_EFFICIENCY
    from vfm_core.perf.planner import (
        LEGEND,
        explain_plan,
        explain_rejections,
        format_table,
        plan,
    )

    cfg = apply_overrides(get_recipe(args.recipe), args.set)
    eff = DEFAULT_EFFICIENCY
    if args.calibrate:
        cal = calibrate(args.calibrate, hardware=args.hardware)
        eff = cal.efficiency
        fitted = ", ".join(f"{k}={v:.3f}" for k, v in cal.fitted.items())
        print(
            f"calibrated on {cal.runs} run(s): {fitted} (rms log error "
            f"{cal.rms_log_error_before:.3f} -> {cal.rms_log_error_after:.3f})",
            file=sys.stderr,
        )
    result = plan(
        cfg.model,
        seq_len=args.seq,
        gpus=args.gpus,
        hardware=args.hardware,
        fixed=args.fixed,
        efficiency=eff,
    )
    if args.check:
        return plan_check(cfg, result, args)
    top = args.top or None
    if args.json:
        print(json.dumps([p.to_dict() for p in result.plans[:top]]))
    else:
        gpu = result.gpu
        print(
            f"{cfg.recipe} at {args.seq} tokens on {args.gpus} x {gpu.name} "
            f"({gpu.bf16_tflops:.0f} TFLOP/s bf16, {gpu.hbm_gb:.0f} GB): "
            f"{len(result.plans)} layouts ranked, {result.evaluated} evaluated, "
            f"{len(result.rejected)} rejected"
        )
        print(format_table(result, top=top))
    if args.explain:
        out = sys.stderr if args.json else sys.stdout
        print(LEGEND, file=out)
        print("step-time breakdown (busiest GPU, one optimiser step):", file=out)
        for i, p in enumerate(result.plans[:top], 1):
            print(f"#{i}", explain_plan(p).lstrip(), file=out)
        print("rejected layouts, by reason:", file=out)
        for line in explain_rejections(result) or ["  (none)"]:
            print(line, file=out)
    return 0


def plan_check(cfg, result, args: argparse.Namespace) -> int:
    """``vfm plan --check``: the planner's best layout (with the --fixed pins) built for real at
    ``--gpus`` ranks; measured vs planned model-state bytes of the busiest rank."""
    import dataclasses

    from vfm_core.perf.memory_check import (
        busiest,
        check_report,
        format_check,
        measure_states,
        planned_states,
    )
    from vfm_core.perf.planner import trainer_config

    if not result.plans:
        raise ConfigError("vfm plan --check: no layout to build (see vfm plan --explain)")
    best = result.plans[0]
    run = trainer_config(cfg, best.layout)
    measured = measure_states(run, args.gpus)
    rank, mine = busiest(measured)
    planned = planned_states(best.memory)
    if not run.train.ema_decay:
        planned = dataclasses.replace(planned, ema=0.0)
    report = check_report(mine, planned)
    lay = {k: v for k, v in dataclasses.asdict(best.layout).items()}
    if args.json:
        print(
            json.dumps(
                {
                    "recipe": cfg.recipe,
                    "seq": args.seq,
                    "gpus": args.gpus,
                    "layout": lay,
                    "pp_rank": rank,
                    "components": report,
                    "per_pp_rank": [m.as_dict() for m in measured],
                }
            )
        )
        return 0
    shown = " ".join(f"{k}={v}" for k, v in lay.items())
    print(f"{cfg.recipe} at {args.seq} tokens on {args.gpus} GPUs, layout {shown}")
    print(f"model states of the busiest rank (pipeline rank {rank}), built for real vs planned:")
    print(format_check(report))
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from vfm_core.models.dit import build_model, count_params

    for name in RECIPES:
        cfg = get_recipe(name)
        n = count_params(build_model(cfg.model, device="meta"))
        m = cfg.model
        print(
            f"{name:16s} {m.arch:9s} {n / 1e6:10.1f}M  depth {m.depth:3d}  hidden {m.hidden:5d}  "
            f"heads {m.heads:3d}/{m.n_kv_heads:<3d} adaln {m.adaln}"
        )
    return 0


def cmd_tokenizer(args: argparse.Namespace) -> int:
    from vfm_core.tokenizer.from_shards import train_tokenizer_on_shards

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
    usage = "" if levels is None else f", codebook usage {100 * m.codebook_usage:.1f}%"
    print(
        f"tokenizer {args.preset}: {m.steps} steps, loss {m.loss_first:.4f} -> "
        f"{m.loss_last:.4f}, PSNR {m.psnr:.1f} dB (mean-colour baseline "
        f"{m.baseline_psnr:.1f}){usage} -> {args.out}"
    )
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from vfm_core.perf import report

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
    tags, artifacts and end status a server outage left unsent (vfm_core.train.mlflow_backlog)."""
    from vfm_core.train.mlflow_backlog import backfill

    done = backfill(args.run_dir, tracking_uri=args.tracking_uri)
    if args.json:
        print(json.dumps(done))
    else:
        status = f", ended {done['status']}" if done["status"] else ""
        print(
            f"MLflow run {done['run_id']} at {done['tracking_uri']}: sent {done['metrics']} "
            f"metric values, {done['tags']} tags, {done['artifacts']} artifacts{status}"
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
            args.dst, n=args.videos, seed=args.seed, train=not args.held_out
        )
    except (ValueError, OSError) as e:
        print(f"vfm sample: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"videos": [str(p) for p in paths]}))
    else:
        kind = "held-out" if args.held_out else "training"
        print(
            f"{len(paths)} sample videos of {kind} combinations in {args.dst} (captions per "
            f"shot in the .json beside each; `vfm curate {args.dst} OUT` cuts them into clips)"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    from vfm_core.infra_env import use_running_services

    use_running_services()  # the servers of `make up`, when they run: one MLflow store
    try:
        return {
            "train": cmd_train,
            "flops": cmd_flops,
            "plan": cmd_plan,
            "recipes": cmd_recipes,
            "report": cmd_report,
            "track": cmd_track,
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


if __name__ == "__main__":
    sys.exit(main())
