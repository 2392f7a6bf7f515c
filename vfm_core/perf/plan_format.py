"""The planner's output: the ranked-layout table, its column legend and the step-time breakdown
of one plan (``vfm plan``, ``vfm plan --explain``)."""

from __future__ import annotations

from vfm_core.perf.layout_rules import global_batch
from vfm_core.perf.planner import Plan, PlanResult
from vfm_core.perf.timing import bubble_fraction


def format_table(result: PlanResult, *, top: int | None = None) -> str:
    """Readable table: layout, memory, step-time breakdown, TFLOPS/GPU, MFU, tokens/s/GPU."""
    head = (
        f"{'#':>3} {'dp_r':>4} {'dp_s':>4} {'tp':>2} {'sp':>2} {'cp':>3} {'mode':>4} {'pp':>2} "
        f"{'v':>1} {'mb':>2} {'m':>3} {'gbs':>5} {'recomp':>9} {'mem GiB':>8} {'fits':>4} "
        f"{'step s':>8} {'compute':>8} {'comm':>7} {'bubble':>7} {'TFLOPS':>7} {'MFU':>6} "
        f"{'tok/s/GPU':>10}"
    )
    lines = [head, "-" * len(head)]
    for i, p in enumerate(result.plans[:top] if top else result.plans, 1):
        lay, t = p.layout, p.time
        lines.append(
            f"{i:>3} {lay.dp_replicate:>4} {lay.dp_shard:>4} {lay.tp:>2} "
            f"{'y' if lay.sp else 'n':>2} {lay.cp:>3} {lay.cp_mode if lay.cp > 1 else '-':>4} "
            f"{lay.pp:>2} {lay.vpp:>1} "
            f"{lay.micro_batch:>2} {lay.microbatches:>3} {global_batch(lay):>5} "
            f"{lay.recompute_label:>9} "
            f"{p.memory.total_gib:>8.1f} {'yes' if p.fits else 'NO':>4} {t.step_s:>8.3f} "
            f"{t.compute_s:>8.3f} {t.exposed_comm_s:>7.3f} {t.bubble_s:>7.3f} "
            f"{p.tflops_per_gpu:>7.1f} {p.mfu:>6.1%} {p.tokens_per_s_per_gpu:>10.0f}"
        )
    return "\n".join(lines)


LEGEND = """\
columns: dp_r = replicated data parallel (DDP / HSDP outer), dp_s = FSDP shards, tp = tensor
parallel, sp = sequence parallel inside TP, cp = context parallel, mode = CP attention (ring P2P or
a2a all-to-all; ST-DiT ring = the trainer's hybrid), pp = pipeline stages, v = virtual stages per
GPU (v > 1: interleaved 1F1B), mb = samples per micro-batch per replica, m = micro-batches per step
(pp > 1: the 1F1B schedule's, >= pp; pp = 1: gradient accumulation), gbs = global batch (samples
per optimiser step = mb x m x dp_r x dp_s, the same for every layout compared: --global-batch),
recomp = activation checkpointing (none | selective | full | full:k = the first k blocks of each
stage full, the rest selective), mem GiB = predicted peak memory per GPU, fits = within usable
HBM, step s = predicted step time, compute = GEMM + attention + element-wise + recompute
seconds, comm = exposed communication (TP/SP, CP, PP sends, FSDP/DP not hidden, contention of
hidden collectives), bubble = pipeline fill/drain ((pp-1)/(v*m+pp-1) of the pipelined time),
TFLOPS = model TFLOP/s per GPU, MFU = TFLOPS / dense bf16 peak, tok/s/GPU = video tokens per
second per GPU."""


def explain_plan(p: Plan) -> str:
    """The step-time breakdown of one plan (``vfm plan --explain``): seconds per step and share."""
    t, lay = p.time, p.layout
    parts = t.parts
    if lay.pp > 1:
        sched = f"interleaved 1F1B, v={lay.vpp}" if lay.vpp > 1 else "1F1B"
        frac = bubble_fraction(lay.pp, lay.microbatches, lay.vpp)
        bubble = f"pipeline bubble ({sched}, m={lay.microbatches}, {frac:.1%})"
        across, used = t.pp_across_nodes
        link = "IB" if across else "NVLink"  # the slowest boundary paces the stages
        sends = f"PP stage sends ({2 * lay.vpp} per micro-batch, {link} {across}/{used} off-node)"
        tail = "overlap, end-of-step reduction"
    else:
        bubble, sends = "pipeline bubble (no pipeline)", "PP stage sends"
        tail = "phase overlap, last-layer tail"
    rows = [
        ("GEMMs", parts["gemm"]),
        ("attention", parts["attention"]),
        ("element-wise (norms, modulation, RoPE, copies)", parts["pointwise"]),
        (f"recompute ({lay.recompute_label})", parts["recompute"]),
        ("conditioning (every rank / stage recomputes it)", parts["conditioning"]),
        ("TP/SP collectives (exposed)", parts["tp"]),
        ("CP ring / all-to-all (exposed)", parts["cp"]),
        (sends, parts["pp_p2p"]),
        (f"FSDP/DP not hidden ({tail})", parts["fsdp_dp_exposed"]),
        ("contention of hidden collectives", parts["contention"]),
        (bubble, t.bubble_s),
        ("optimizer step (AdamW, memory-bound)", t.optimizer_s),
    ]
    lines = [
        f"  dp {lay.dp_replicate}x{lay.dp_shard} tp {lay.tp}{' sp' if lay.sp else ''} "
        f"cp {lay.cp}{' ' + lay.cp_mode if lay.cp > 1 else ''} pp {lay.pp}"
        f"{f' vpp {lay.vpp}' if lay.vpp > 1 else ''} mb {lay.micro_batch} m {lay.microbatches} "
        f"gbs {global_batch(lay)} recompute {lay.recompute_label}"
    ]
    for name, sec in rows:
        lines.append(f"    {name:56s} {sec:9.4f} s {sec / t.step_s:7.1%}")
    lines.append(f"    {'total step':56s} {t.step_s:9.4f} s")
    lines.append(
        f"    -> {p.tokens_per_s_per_gpu:,.0f} tok/s/GPU, {p.tflops_per_gpu:.1f} TFLOP/s/GPU, "
        f"MFU {p.mfu:.1%}"
    )
    return "\n".join(lines)
