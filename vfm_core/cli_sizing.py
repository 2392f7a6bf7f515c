"""The ``vfm`` sizing commands: ``vfm flops``, ``vfm plan`` (with ``--check``), ``vfm recipes``.

Parameters and FLOPs of a preset, the planner's ranked parallel layouts, and the preset list.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from vfm_core.config import ConfigError, apply_overrides, parse_override, validate
from vfm_core.recipes import RECIPES, get_recipe


def cmd_flops(args: argparse.Namespace) -> int:
    from vfm_core.families import build_model
    from vfm_core.models.dit import count_params
    from vfm_core.perf.flops import train_flops_per_token
    from vfm_core.perf.planner import check_sizes

    check_sizes(seq_len=args.seq, gpus=1)  # a huge --seq walked every number up to it
    cfg = validate(apply_overrides(get_recipe(args.recipe), args.set))
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
    from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, gpu_spec
    from vfm_core.perf.plan_format import LEGEND, explain_plan, format_table
    from vfm_core.perf.planner import DEFAULT_GLOBAL_BATCH, check_sizes, explain_rejections, plan

    refuse_check_extras(args)
    batch = DEFAULT_GLOBAL_BATCH if args.global_batch is None else args.global_batch
    check_sizes(seq_len=args.seq, gpus=args.gpus, global_batch=batch)
    try:
        gpu_spec(args.hardware)  # before --calibrate, whose records default to this GPU
    except ValueError as e:
        raise ConfigError(f"--hardware: {e}") from None
    cfg = validate(apply_overrides(get_recipe(args.recipe), args.set))
    refuse_unread_sets(args.set, check=args.check)
    pins = fixed_pins(args.fixed)
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
        global_batch=batch,
        hardware=args.hardware,
        fixed=pins,
        efficiency=eff,
        lora_rank=cfg.train.lora.rank,
    )
    if args.check:
        return plan_check(cfg, result, args)
    top = 10 if args.top is None else (args.top or None)  # 0: all
    if args.json:
        print(json.dumps([p.to_dict() for p in result.plans[:top]]))
    else:
        gpu = result.gpu
        print(
            f"{cfg.recipe} at {args.seq} tokens on {args.gpus} x {gpu.name} "
            f"({gpu.bf16_tflops:.0f} TFLOP/s bf16, {gpu.hbm_gb:.0f} GB), global batch "
            f"{result.global_batch} samples: "
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


def refuse_check_extras(args: argparse.Namespace) -> None:
    """``--check`` builds one layout, the best: ``--top`` and ``--explain`` have nothing to do."""
    extras = [f for f, on in (("--top", args.top is not None), ("--explain", args.explain)) if on]
    if args.check and extras:
        raise ConfigError(
            f"--check builds and measures the best layout only: {' and '.join(extras)} would be "
            "ignored; drop it"
        )
    if getattr(args, "on_gpu", False) and not args.check:
        raise ConfigError("--on-gpu runs the step that --check builds: add --check")


def fixed_pins(texts: Sequence[str]) -> dict[str, Any]:
    """The pins of every ``--fixed`` flag, merged (``--fixed tp=2 --fixed cp=2`` pins both); one
    key pinned to two values, in one flag or two, is an error naming both."""
    from vfm_core.perf.layout_rules import parse_fixed

    pins: dict[str, Any] = {}
    given: dict[str, str] = {}
    for text in texts:
        if not text.strip():
            continue  # --fixed "": nothing pinned
        for part in text.split(","):
            if not part.strip():
                raise ConfigError(f"--fixed {text}: an empty entry between commas")
            for key, value in parse_fixed(part).items():
                if key in pins and pins[key] != value:
                    raise ConfigError(
                        f"--fixed: {given[key]} and {part.strip()} pin two values of {key}; "
                        "keep one"
                    )
                pins[key], given[key] = value, part.strip()
    return pins


_LAYOUT_FIELDS = {  # --set keys the searched layout decides -> the --fixed key that pins them
    "parallel.dp_replicate": "dp_replicate",
    "parallel.dp_shard": "dp_shard",
    "parallel.tp": "tp",
    "parallel.cp": "cp",
    "parallel.pp": "pp",
    "parallel.sequence_parallel": "sp",
    "parallel.pp_virtual_stages": "vpp",
    "parallel.pp_microbatches": "microbatches",
    "parallel.activation_checkpointing_blocks": "recompute_blocks",
    "parallel.cp_mode": "cp_mode",
    "parallel.activation_checkpointing": "recompute",
    "parallel.activation_checkpointing_mode": "recompute",
    "parallel.pp_schedule": "vpp",
    "train.grad_accum": "microbatches",
    "data.batch_size": "global_batch",
}
_SAME_VALUE = ("dp_replicate", "dp_shard", "tp", "cp", "pp", "sp", "vpp", "microbatches")


def refuse_unread_sets(overrides: Sequence[str], *, check: bool) -> None:
    """``vfm plan --set`` reaches what the plan reads: model fields and ``train.lora.rank`` (a
    LoRA fine-tuning run; with ``--check``, the run it builds too). A field of the searched
    layout, or one nothing reads, is an error naming it (with the ``--fixed`` key that pins a
    layout field) instead of being ignored."""
    for text in overrides:
        parts, value = parse_override(text)
        key, section = ".".join(parts), parts[0]
        pin = _LAYOUT_FIELDS.get(key)
        if pin == "global_batch":
            raise ConfigError(
                f"--set {text.strip()}: vfm plan compares layouts at one global batch; give it "
                f"with --global-batch {value}"
            )
        if pin:
            shown = f"{pin}={value}".lower() if pin in _SAME_VALUE else f"{pin}=..."
            raise ConfigError(
                f"--set {text.strip()}: vfm plan searches the layout, --set does not set it; "
                f"pin it with --fixed {shown}"
            )
        if section != "model" and key != "train.lora.rank" and not check:
            raise ConfigError(
                f"--set {text.strip()}: vfm plan reads only model.* fields and train.lora.rank "
                f"({section}.* counts only with --check, which builds the run)"
            )


def plan_check(cfg, result, args: argparse.Namespace) -> int:
    """``vfm plan --check``: the planner's best layout (with the --fixed pins) built for real at
    ``--gpus`` ranks — the model states of every pipeline rank, measured vs planned for the
    busiest — and one training step of pipeline rank 0 (the one that holds the most
    activations) traced under fake tensors: activations, FSDP buffers and the peak, measured vs
    planned; exit 1 when the measured peak does not fit the GPU."""
    import dataclasses
    import resource

    from vfm_core.perf.layout_rules import trainer_config
    from vfm_core.perf.memory_check import (
        busiest,
        check_report,
        format_check,
        measure_states,
        planned_states,
    )
    from vfm_core.train.step_check import fit_verdict, peak_rows

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
    traced, seconds = _trace_step(run, recipe=cfg.recipe, seq=args.seq, gpus=args.gpus)
    rows = peak_rows(traced, measured[0], best.memory)
    fits, verdict = fit_verdict(rows, best.memory, result.gpu.name)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    on_gpu = (
        _gpu_step(run, recipe=cfg.recipe, seq=args.seq, gpus=args.gpus) if args.on_gpu else None
    )
    if args.json:
        print(
            json.dumps(
                {
                    "recipe": cfg.recipe,
                    "seq": args.seq,
                    "gpus": args.gpus,
                    "hardware": result.gpu.name,
                    "layout": lay,
                    "pp_rank": rank,
                    "components": report,
                    "per_pp_rank": [m.as_dict() for m in measured],
                    **rows,
                    "traced": {
                        "pp_rank": traced.pp_rank,
                        "components": traced.components,
                        "seconds": seconds,
                        "check_rss_bytes": rss,
                    },
                    "fits": fits,
                    "verdict": verdict,
                    "on_gpu": on_gpu,
                }
            )
        )
        return 0 if fits else 1
    shown = " ".join(f"{k}={v}" for k, v in lay.items())
    print(f"{cfg.recipe} at {args.seq} tokens on {args.gpus} x {result.gpu.name}, layout {shown}")
    print(f"model states of the busiest rank (pipeline rank {rank}), built for real vs planned:")
    print(format_check(report))
    print(
        f"one training step of pipeline rank 0, traced under fake tensors ({seconds:.0f} s, "
        f"this process peaked at {rss / 2**30:.2f} GiB):"
    )
    print(format_check(rows, header=False))
    if on_gpu is not None:
        traced_gib = rows["peak"]["measured_bytes"] / 2**30
        print(
            f"the same step run on this {on_gpu['gpu']} (collectives do nothing): peak "
            f"{on_gpu['peak_allocated_bytes'] / 2**30:.2f} GiB allocated (traced "
            f"{traced_gib:.2f}), {on_gpu['peak_reserved_bytes'] / 2**30:.2f} GiB reserved, "
            f"{on_gpu['seconds']:.3f} s per step without communication"
        )
    print(verdict)
    return 0 if fits else 1


def _gpu_step(run, *, recipe: str, seq: int, gpus: int) -> dict:
    """``--on-gpu``: pipeline rank 0's step run for real on this machine's GPU
    (:func:`~vfm_core.train.step_check.device_step`); no GPU is one line."""
    import torch

    from vfm_core.train.step_check import device_step

    if not torch.cuda.is_available():
        raise ConfigError("vfm plan --check --on-gpu: this machine has no CUDA GPU")
    if run.parallel.pp > 1:
        raise ConfigError(
            "vfm plan --check --on-gpu runs layouts without a pipeline (pp=1); this one has "
            f"pp={run.parallel.pp} (pin --fixed pp=1, or drop --on-gpu)"
        )
    step = device_step(run, gpus, seq_len=seq, device="cuda")
    return {
        "gpu": torch.cuda.get_device_name(),
        "peak_allocated_bytes": step.peak_allocated,
        "peak_reserved_bytes": step.peak_reserved,
        "seconds": step.seconds,
    }


def _trace_step(run, *, recipe: str, seq: int, gpus: int) -> tuple[Any, float]:
    """(one training step of ``run`` traced under fake tensors, the seconds it took); a failure
    raises ConfigError in one line naming what was traced (``--debug`` shows the traceback)."""
    import time

    from vfm_core.train.step_check import measure_step

    t0 = time.perf_counter()
    try:
        traced = measure_step(run, gpus, seq_len=seq)
    except ConfigError:
        raise
    except Exception as e:
        root = e
        while root.__cause__ is not None:  # the failure under a schedule's wrapping error
            root = root.__cause__
        text = str(root).strip()
        why = f"{type(root).__name__}: {text.splitlines()[-1] if text else ''}"
        raise ConfigError(
            f"--check: cannot trace a training step of {recipe} at --seq {seq} tokens "
            f"on {gpus} GPU(s): {why}"
        ) from e
    return traced, time.perf_counter() - t0


def cmd_recipes(args: argparse.Namespace) -> int:
    from vfm_core.families import build_model
    from vfm_core.models.dit import count_params

    for name in RECIPES:
        cfg = get_recipe(name)
        n = count_params(build_model(cfg.model, device="meta"))
        m = cfg.model
        print(
            f"{name:16s} {m.arch:9s} {n / 1e6:10.1f}M  depth {m.depth:3d}  hidden {m.hidden:5d}  "
            f"heads {m.heads:3d}/{m.n_kv_heads:<3d} adaln {m.adaln}"
        )
    return 0
