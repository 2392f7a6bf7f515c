"""The performance planner: rank 4D-parallel layouts of a DiT × sequence length × GPU count.

``plan(cfg, seq_len=, gpus=, hardware=)`` enumerates every valid :class:`Layout` — degrees whose
product is the GPU count, heads (and kv heads) divisible by TP, depth by PP (and by PP × virtual
stages), the sequence by CP (× TP under SP), TP inside one node, all-to-all CP only when the
heads per TP rank divide by CP, the pipeline schedule rules of the trainer — predicts its per-GPU
memory (:mod:`vfm_core.perf.memory`) and step time (:mod:`vfm_core.perf.timing`), drops layouts
that do not fit, and ranks the rest by predicted tokens/s per GPU. Pinned keys (``fixed``)
restrict the search and keep layouts that do not fit, flagged. All four degrees combine: TP
(+ SP) × CP (ring or all-to-all inside every pipeline stage) × PP (1F1B or interleaved 1F1B) ×
FSDP/HSDP.

Throughput and FLOPs are tied by construction: ``tflops_per_gpu = tokens_per_s_per_gpu ×
train_flops_per_token / 1e12`` with the spine's FLOPs model (:mod:`vfm_core.perf.flops`), and
``mfu = tflops_per_gpu / dense bf16 peak`` (:mod:`vfm_core.perf.hardware`).

**One global batch.** Every layout of a query trains the same ``global_batch`` samples per
optimiser step (``data.batch_size``; ``vfm plan --global-batch``, default
:data:`DEFAULT_GLOBAL_BATCH`): the batch is a training hyper-parameter, and a layout that won by
taking a larger one (more pipeline micro-batches always shrink the bubble) would not train the same
run. A layout's data-parallel degree dp = dp_replicate · dp_shard must divide it; each replica's
share global_batch / dp is ``micro_batch`` × ``microbatches``, the micro-batches being the 1F1B
schedule's (``parallel.pp_microbatches``, >= pp) with PP and gradient accumulation
(``train.grad_accum``) without — so choosing the micro-batch size fixes the count.

Search choices (the public guidance this follows: torchtitan's 4D recipes, Megatron-LM's
"Efficient Large-Scale Language Model Training", Narayanan et al. 2021 §2.2 and §3): TP with SP
always on (SP only saves memory in this model, so ``sp=False`` is searched only when pinned);
micro-batch size 1, 2, 4, 8 where it divides the replica's share; with PP ``vpp`` 1, 2 or 4
virtual stages where pp·vpp divides the depth (interleaved 1F1B). When no recomputation fits,
slower recompute modes are not listed. FSDP groups that cross nodes but are smaller than the whole
data-parallel dimension are not searched (unless pinned): in this model they move the same
InfiniBand bytes per GPU as full sharding with more memory and a larger replica all-reduce, so they
never rank higher. Recompute: none, selective, block-wise full with the fewest whole-recomputed
blocks per stage that fit (``full:k``, the rest selective:
``parallel.activation_checkpointing_blocks``), then full.

Which layouts are valid (``check_layout``), the ``--fixed`` pins and the trainer config of a
layout live in :mod:`vfm_core.perf.layout_rules`; the table and the step-time breakdown in
:mod:`vfm_core.perf.plan_format`. :func:`explain_rejections` summarises why layouts were
rejected; fitting the efficiency constants to measured runs lives in :mod:`vfm_core.perf.calibrate`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from vfm_core.config import ConfigError, ModelConfig
from vfm_core.geometry import Grid
from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, Efficiency, GpuSpec, gpu_spec
from vfm_core.perf.layout_rules import (
    BATCH_REASON,
    LAYOUT_KEYS,
    batch_splits,
    check_layout,
    parse_fixed,
)
from vfm_core.perf.layout_rules import global_batch as batch_of
from vfm_core.perf.memory import (
    RECOMPUTE_MODES,
    MemoryEstimate,
    Split,
    busiest_rank_params,
    estimate_memory,
    stage_saved_bytes,
)
from vfm_core.perf.timing import (
    Layout,
    StepTime,
    Workload,
    step_time,
    tokens_per_step_per_gpu,
    workload,
)

MICRO_BATCHES = (1, 2, 4, 8)
"""Searched samples per micro-batch (where they divide a replica's share of the global batch)."""
DEFAULT_GLOBAL_BATCH = 512
"""Samples per optimiser step when none is given. The paper's Table 1 states no global batch and
the paper-scale presets carry ``data.batch_size = 1`` (a smoke-run value no data-parallel layout
can split), so the planner's default is its own: 512 divides the data-parallel degree of each of
the four Table 1 layouts (dp = 32, 4, 16 and 2 at 64, 64, 64 and 256 GPUs) and leaves their
pipelines >= 32 micro-batches per replica, a bubble of 1/33 for row 3's PP2 (at 256 samples it
is 1/17, and row 3 is predicted 11% below the paper). 4.2M tokens per step at 8k tokens per
sample, 38M at 74k: pass ``--global-batch`` for your run's."""
MAX_GLOBAL_BATCH = 2**30
"""The largest ``global_batch`` planned (a billion samples per step: far past any run; it bounds
the per-replica micro-batch counts the step-time model multiplies)."""
VIRTUAL_STAGES = (1, 2, 4)
"""Searched virtual stages per GPU (interleaved 1F1B) where pp·v divides the depth."""
MAX_GPUS = 2**20
"""The largest ``gpus`` planned: several times the largest GPU clusters built, and a search that
still answers in about a second (the degrees are the divisors of the GPU count)."""
MAX_SEQ_LEN = 2**24
"""The longest sequence planned, in video tokens per sample: 16x the longest contexts trained
(~10**6 tokens), and a workload that still builds in about a second (the default token grid
walks the divisors of the length)."""


def check_sizes(*, seq_len: int, gpus: int, global_batch: int = DEFAULT_GLOBAL_BATCH) -> None:
    """``--seq``, ``--gpus`` and ``--global-batch`` out of range raise :class:`ConfigError`
    (checked before any work: the search and the workload grow with them)."""
    if isinstance(global_batch, bool) or not isinstance(global_batch, int):
        raise ConfigError(
            f"--global-batch must be an integer number of samples, got {global_batch!r}"
        )
    if global_batch <= 0:
        raise ConfigError(
            f"--global-batch must be a positive number of samples, got {global_batch}"
        )
    if global_batch > MAX_GLOBAL_BATCH:
        raise ConfigError(
            f"--global-batch must be at most 2**30 = {MAX_GLOBAL_BATCH} samples, got {global_batch}"
        )
    if seq_len <= 0:
        raise ConfigError(f"--seq must be a positive number of tokens, got {seq_len}")
    if seq_len > MAX_SEQ_LEN:
        raise ConfigError(f"--seq must be at most 2**24 = {MAX_SEQ_LEN} tokens, got {seq_len}")
    if gpus <= 0:
        raise ConfigError(f"--gpus must be positive, got {gpus}")
    if gpus > MAX_GPUS:
        raise ConfigError(f"--gpus must be at most 2**20 = {MAX_GPUS}, got {gpus}")


@dataclass(kw_only=True, slots=True)
class Plan:
    """One layout with its predictions."""

    layout: Layout
    memory: MemoryEstimate
    time: StepTime
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    """= tokens_per_s_per_gpu × flops_per_token / 1e12, exactly."""
    mfu: float
    flops_per_token: float

    @property
    def fits(self) -> bool:
        return self.memory.fits

    def to_dict(self) -> dict[str, Any]:
        """Flat JSON-friendly record (the ``vfm plan --json`` contract keys and more)."""
        out: dict[str, Any] = {k: getattr(self.layout, k) for k in LAYOUT_KEYS}
        t = self.time
        out.update(
            global_batch=batch_of(self.layout),
            fits=self.fits,
            memory_gb=self.memory.total_gib,
            memory_margin_gb=self.memory.margin_gib,
            activations_gb=self.memory.activations_gib,
            step_s=t.step_s,
            compute_s=t.compute_s,
            exposed_comm_s=t.exposed_comm_s,
            bubble_s=t.bubble_s,
            pp_sends_s=t.parts["pp_p2p"],
            tflops_per_gpu=self.tflops_per_gpu,
            mfu=self.mfu,
            tokens_per_s_per_gpu=self.tokens_per_s_per_gpu,
            flops_per_token=self.flops_per_token,
        )
        return out


def evaluate(
    work: Workload, layout: Layout, gpu: GpuSpec, eff: Efficiency = DEFAULT_EFFICIENCY
) -> Plan:
    """Memory and time of one layout (no validity checks; see :func:`check_layout`)."""
    return _with_time(work, layout, gpu, eff, memory_of(work, layout, gpu))


def memory_of(work: Workload, lay: Layout, gpu: GpuSpec) -> MemoryEstimate:
    """:func:`estimate_memory` of a layout, memoised on the keys memory depends on."""
    key = ("mem", gpu.name, lay.tp, lay.sp, lay.cp, lay.pp, lay.dp_shard, lay.micro_batch)
    key += (lay.microbatches, lay.recompute, lay.vpp, lay.recompute_blocks, lay.cp_mode)
    if key not in work.cache:
        s0, s_mb, b0, b_mb = _saved(work, lay, lay.recompute)
        full = lay.full_fraction(work.cfg.depth)
        if 0 < full < 1:  # block-wise full: the other blocks selective
            sel = _saved(work, lay, "selective")
            s0, s_mb = full * s0 + (1 - full) * sel[0], full * s_mb + (1 - full) * sel[1]
        okey = ("owned", lay.tp, lay.pp, lay.vpp)
        if okey not in work.cache:
            work.cache[okey] = busiest_rank_params(work.cfg, tp=lay.tp, pp=lay.pp, vpp=lay.vpp)
        mb = lay.micro_batch
        owned = work.cache[okey]
        adapters = work.adapter_params * owned / work.params  # the rank's share of them
        work.cache[key] = estimate_memory(
            work.cfg,
            seq_len=work.seq_len,
            hbm_gb=gpu.hbm_gb,
            micro_batch=lay.micro_batch,
            tp=lay.tp,
            sp=lay.sp,
            cp=lay.cp,
            pp=lay.pp,
            dp_shard=lay.dp_shard,
            microbatches=lay.microbatches,
            vpp=lay.vpp,
            recompute=lay.recompute,
            text_len=work.text_len,
            owned=owned + adapters,
            trained=adapters if work.adapter_params else None,
            layer_params=work.layer_params,
            kinds=work.kinds,
            saved=(s0 + s_mb * mb, b0 + b_mb * mb),
        )
    return work.cache[key]


def _saved(work: Workload, lay: Layout, recompute: str) -> tuple[float, float, float, float]:
    """(a, b) of the stage's saved bytes a + b·mb under ``recompute``, and of one block's without
    recompute (saved bytes are affine in the micro-batch size), memoised per query."""
    skey = ("mem-saved", lay.tp, lay.sp, lay.cp, lay.pp, recompute, lay.cp_mode)
    if skey not in work.cache:
        split = Split(tp=lay.tp, sp=lay.sp, cp=lay.cp, ring=lay.cp_mode == "ring")
        kw = dict(seq_len=work.seq_len, text_len=work.text_len, split=split, kinds=work.kinds)
        stage_layers = range(work.cfg.depth // lay.pp)
        s1, s2 = (
            stage_saved_bytes(work.cfg, stage_layers, micro_batch=k, recompute=recompute, **kw)
            for k in (1, 2)
        )
        b1, b2 = (stage_saved_bytes(work.cfg, range(1), micro_batch=k, **kw) for k in (1, 2))
        work.cache[skey] = (2 * s1 - s2, s2 - s1, 2 * b1 - b2, b2 - b1)
    return work.cache[skey]


def _with_time(
    work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency, mem: MemoryEstimate
) -> Plan:
    st = step_time(work, lay, gpu, eff)
    tok = tokens_per_step_per_gpu(work, lay) / st.step_s
    tflops = tok * work.flops_per_token / 1e12
    return Plan(
        layout=lay,
        memory=mem,
        time=st,
        tokens_per_s_per_gpu=tok,
        tflops_per_gpu=tflops,
        mfu=tflops / gpu.bf16_tflops,
        flops_per_token=work.flops_per_token,
    )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------------- search
@dataclass(kw_only=True, slots=True)
class PlanResult:
    """Ranked plans (fitting first, then by tokens/s/GPU) and the rejected layouts with reasons."""

    plans: list[Plan]
    rejected: list[tuple[Any, Any]] = field(default_factory=list)
    """(layout or partial degrees, reason); see :func:`rejection_reason`."""
    work: Workload | None = None
    gpu: GpuSpec | None = None
    evaluated: int = 0
    global_batch: int = DEFAULT_GLOBAL_BATCH
    """Samples per optimiser step of every plan (``micro_batch · microbatches · dp``)."""


def _check_fixed(
    cfg: ModelConfig,
    fixed: dict[str, Any],
    *,
    seq_len: int,
    gpus: int,
    gpu: GpuSpec,
    batch: int,
) -> None:
    """Pinned values that can never work raise ConfigError at once (clear message, exit 2)."""
    prod = math.prod(fixed.get(k, 1) for k in ("dp_replicate", "dp_shard", "tp", "cp", "pp"))
    if gpus % prod:
        pinned = ", ".join(f"{k}={fixed[k]}" for k in fixed if k in LAYOUT_KEYS[:5])
        raise ConfigError(f"--fixed {pinned}: product {prod} does not divide --gpus {gpus}")
    per_step = math.prod(
        fixed.get(k, 1) for k in ("dp_replicate", "dp_shard", "micro_batch", "microbatches")
    )
    if batch % per_step:  # the pinned factors of the global batch must divide it
        pinned = ", ".join(
            f"{k}={fixed[k]}"
            for k in ("dp_replicate", "dp_shard", "micro_batch", "microbatches")
            if k in fixed
        )
        raise ConfigError(
            f"--global-batch {batch}: the pinned {pinned} (product {per_step}) does not divide it"
        )
    probe = {**fixed, "sp": fixed.get("sp", fixed.get("tp", 1) > 1)}
    if "pp" in fixed:  # the schedule rules need the pipeline; else each searched pp is checked
        probe.setdefault("microbatches", fixed["pp"])
    else:
        probe.update(microbatches=1, vpp=1)
    probe = Layout(**probe)
    why = check_layout(cfg, probe, seq_len=seq_len, gpu=gpu)
    if why:
        raise ConfigError(f"--fixed: {why}")


def plan(
    cfg: ModelConfig,
    *,
    seq_len: int,
    gpus: int,
    global_batch: int = DEFAULT_GLOBAL_BATCH,
    hardware: str | GpuSpec = "h100",
    fixed: str | Mapping[str, Any] | None = None,
    grid: Grid | None = None,
    text_len: int | None = None,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    lora_rank: int = 0,
) -> PlanResult:
    """Enumerate, evaluate and rank the layouts of ``cfg`` on ``gpus`` GPUs of ``hardware``, all
    at ``global_batch`` samples per optimiser step; ``lora_rank`` > 0: of a LoRA fine-tuning run
    (the model frozen, rank-``lora_rank`` adapters train).

    Raises :class:`ConfigError` for nonsense input (sizes outside :func:`check_sizes`, unknown
    hardware, pinned degrees that cannot work, a global batch no layout can split) and when no
    layout is valid at all."""
    check_sizes(seq_len=seq_len, gpus=gpus, global_batch=global_batch)
    try:
        gpu = hardware if isinstance(hardware, GpuSpec) else gpu_spec(hardware)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    pins = parse_fixed(fixed)
    _check_fixed(cfg, pins, seq_len=seq_len, gpus=gpus, gpu=gpu, batch=global_batch)
    work = workload(cfg, seq_len=seq_len, grid=grid, text_len=text_len, lora_rank=lora_rank)
    keep_all = bool(pins)
    plans: list[Plan] = []
    rejected: list[tuple[Any, Any]] = []
    evaluated = 0
    split = 0  # degree sets whose data-parallel replicas can share the global batch
    options = functools.partial(_choices, pins)

    def reject(
        reason: str, lay: Layout | dict[str, Any], mem: MemoryEstimate | None = None
    ) -> None:
        if mem is not None:  # formatted lazily: thousands of layouts may not fit
            rejected.append((lay, (reason, mem)))
        else:
            rejected.append((lay, reason))

    for (tp, cp, pp), shards, splits in _degree_sets(
        cfg, seq_len=seq_len, gpus=gpus, gpu=gpu, batch=global_batch, pins=pins, reject=reject
    ):
        split += 1
        for dp_shard in shards:
            dp = gpus // (tp * cp * pp)
            base = dict(dp_replicate=dp // dp_shard, dp_shard=dp_shard, tp=tp, cp=cp, pp=pp)
            args = (base, splits, pins, options, keep_all, plans, reject)
            evaluated += _search_inner(cfg, work, gpu, efficiency, *args)
    if not plans:
        raise _no_layout_error(
            rejected, split=split, gpus=gpus, seq_len=seq_len, batch=global_batch, pins=pins
        )
    # fitting layouts by throughput; the ones that do not fit (listed with --fixed) after them,
    # closest to fitting first
    plans.sort(key=lambda p: (0, -p.tokens_per_s_per_gpu) if p.fits else (1, p.memory.total_gib))
    return PlanResult(
        plans=plans,
        rejected=rejected,
        work=work,
        gpu=gpu,
        evaluated=evaluated,
        global_batch=global_batch,
    )


def _degree_sets(
    cfg: ModelConfig,
    *,
    seq_len: int,
    gpus: int,
    gpu: GpuSpec,
    batch: int,
    pins: Mapping[str, Any],
    reject: Callable[[str, dict[str, Any]], None],
) -> Iterator[tuple[tuple[int, int, int], list[int], list[tuple[int, int]]]]:
    """The valid (tp, cp, pp) of ``gpus`` GPUs, each with its searched ``dp_shard`` degrees and
    the (micro_batch, microbatches) splits of the global ``batch``; the invalid ones go to
    ``reject`` with their reason."""
    options = functools.partial(_choices, pins)
    for tp in options("tp", _divisors(gpus)):
        if gpus % tp:
            continue
        why = check_layout(cfg, Layout(tp=tp), seq_len=seq_len, gpu=gpu)
        if why:
            reject(why, {"tp": tp})
            continue
        for cp in options("cp", _divisors(gpus // tp)):
            if (gpus // tp) % cp:
                continue
            if seq_len % cp:
                reject(
                    f"cp={cp} does not divide the sequence of {seq_len} tokens",
                    {"tp": tp, "cp": cp},
                )
                continue
            for pp in options("pp", _divisors(gpus // (tp * cp))):
                if (gpus // (tp * cp)) % pp:
                    continue
                if cfg.depth % pp:
                    reject(
                        f"pp={pp} does not divide depth={cfg.depth}", {"tp": tp, "cp": cp, "pp": pp}
                    )
                    continue
                dp = gpus // (tp * cp * pp)
                shards = _shard_degrees(dp, tp=tp, cp=cp, gpu=gpu, pins=pins)
                if not shards:  # the pinned data-parallel degrees need another tp x cp x pp
                    continue
                splits = batch_splits(batch, dp=dp, pp=pp, pins=pins, sizes=MICRO_BATCHES)
                if isinstance(splits, str):
                    reject(splits, {"tp": tp, "cp": cp, "pp": pp})
                    continue
                yield (tp, cp, pp), shards, splits


def _shard_degrees(
    dp: int, *, tp: int, cp: int, gpu: GpuSpec, pins: Mapping[str, Any]
) -> list[int]:
    """The searched ``dp_shard`` of ``dp`` data-parallel ranks: not the cross-node FSDP groups
    short of all of dp (dominated: module docstring), and only those the pins allow."""
    gpn = gpu.gpus_per_node
    shards = [x for x in _divisors(dp) if x == dp or tp * cp * x <= gpn]
    return [
        x
        for x in _choices(pins, "dp_shard", shards)
        if dp % x == 0 and pins.get("dp_replicate", dp // x) == dp // x
    ]


def _no_layout_error(
    rejected: list[tuple[Any, Any]],
    *,
    split: int,
    gpus: int,
    seq_len: int,
    batch: int,
    pins: Mapping[str, Any],
) -> ConfigError:
    """Why no layout came out: the global batch when every degree set left was refused for it
    (none of them could ``split`` it), else the three commonest rejection reasons."""
    pinned = f" with --fixed {_fmt(pins)}" if pins else ""
    why = Counter(r for r in map(rejection_reason, rejected) if BATCH_REASON in r)
    if not split and why:
        return ConfigError(
            f"--global-batch {batch}: no layout of {gpus} GPU(s){pinned}"
            f" can split it (e.g. {why.most_common(1)[0][0]})"
        )
    reasons = Counter(rejection_reason(e).split(":")[0] for e in rejected)
    top = "; ".join(f"{r} ({n}x)" for r, n in reasons.most_common(3))
    return ConfigError(
        f"no valid layout for {gpus} GPU(s), sequence {seq_len}{pinned}"
        + (f": {top}" if top else "")
    )


def _choices(pins: Mapping[str, Any], key: str, default: Iterable[Any]) -> list[Any]:
    """The pinned value of ``key``, else every ``default``."""
    return [pins[key]] if key in pins else list(default)


def _fmt(d: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in d.items())


def _search_inner(cfg, work, gpu, eff, base, splits, pins, options, keep_all, plans, reject) -> int:
    """Recompute × micro-batching (``splits``: the (micro_batch, microbatches) pairs of the
    global batch) × SP × CP mode for one set of degrees; returns the evaluated count."""
    tp, cp, pp = base["tp"], base["cp"], base["pp"]
    sps = options("sp", [True] if tp > 1 else [False])
    modes = options("cp_mode", ["ring", "a2a"] if cp > 1 else ["ring"])
    interleave = [v for v in VIRTUAL_STAGES if cfg.depth % (pp * v) == 0] if pp > 1 else [1]
    vpps = options("vpp", interleave)
    count = 0
    for sp in sps:
        for mode in modes:
            for vpp in vpps:
                for mb, m in splits:
                    probe = Layout(
                        **base, sp=sp, micro_batch=mb, microbatches=m, cp_mode=mode, vpp=vpp
                    )
                    why = check_layout(cfg, probe, seq_len=work.seq_len, gpu=gpu)
                    if why:  # e.g. interleaved rounds: another micro-batch count may pass
                        reject(why, probe)
                        continue
                    fitted = False
                    for lay in _recompute_options(work, probe, gpu, pins, options):
                        count += 1
                        mem = memory_of(work, lay, gpu)
                        if mem.fits or keep_all:
                            plans.append(_with_time(work, lay, gpu, eff, mem))
                        if mem.fits:
                            fitted = True
                            if not keep_all:
                                break  # slower recompute modes would only cost time
                        elif not keep_all:
                            reject(_OOM, lay, mem)
                    if not fitted and not keep_all and "micro_batch" not in pins:
                        break  # a larger micro-batch needs more memory still
    return count


def _recompute_options(work: Workload, probe: Layout, gpu: GpuSpec, pins, options):
    """The layout under each recompute mode, cheapest first: none, selective, block-wise full
    with the fewest whole-recomputed blocks per stage that fit (``full:k``), full."""
    for rc in options("recompute", RECOMPUTE_MODES):
        lay = dataclasses.replace(probe, recompute=rc)
        if rc == "full" and "recompute_blocks" in pins:
            lay = dataclasses.replace(lay, recompute_blocks=pins["recompute_blocks"])
        elif rc == "full":
            k = _fewest_full_blocks(work, lay, gpu)
            if k:
                yield dataclasses.replace(lay, recompute_blocks=k)
        yield lay


def _fewest_full_blocks(work: Workload, lay: Layout, gpu: GpuSpec) -> int:
    """Smallest k < blocks per stage whose ``full:k`` fits (memory falls as k grows), 0: none."""
    part = lay.stage_blocks(work.cfg.depth)

    def fits(k: int) -> bool:
        return memory_of(work, dataclasses.replace(lay, recompute_blocks=k), gpu).fits

    if part < 2 or not fits(part - 1):
        return 0
    lo, hi = 1, part - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def _short(lay: Layout | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(lay, Mapping):
        return dict(lay)
    return {k: getattr(lay, k) for k in LAYOUT_KEYS}


_OOM = "out of memory"


def rejection_reason(entry: tuple[Any, Any]) -> str:
    """The text of one ``PlanResult.rejected`` entry."""
    _, why = entry
    if isinstance(why, tuple):
        reason, mem = why
        return f"{reason}: {mem.total_gib:.1f} GiB > {mem.capacity_gib:.1f} GiB usable"
    return why


def explain_rejections(result: PlanResult, *, examples: int = 2) -> list[str]:
    """One line per rejection reason: how many layouts it removed and a few of them."""
    by_reason: dict[str, list[tuple[Any, Any]]] = {}
    for entry in result.rejected:
        why = entry[1]
        key = why[0] if isinstance(why, tuple) else re.sub(r"\d+", "N", why)
        by_reason.setdefault(key, []).append(entry)
    lines = []
    for reason, entries in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"{len(entries):6d} layouts: {reason}")
        for lay, why in entries[:examples]:
            lines.append(f"         e.g. {_fmt(_short(lay))}: {rejection_reason((lay, why))}")
    return lines
