"""Step-time model of DiT training on a GPU cluster for one 4D-parallel layout.

Per micro-batch and pipeline stage a GPU spends (the constants are
:class:`vfm_core.perf.hardware.Efficiency`)

* **GEMMs**: FLOPs from :func:`vfm_core.perf.flops.train_flops` (every component but attention) /
  (efficiency · dense peak) plus a fixed cost per GEMM call — a size-dependent efficiency
  f / (f + eff·peak·launch): tensor parallelism shrinks GEMMs and pays for it. The blocks' work is
  split evenly over the stages; the patch embedding runs on the first stage, the final layer (and
  the causal model's vocabulary head) on the last, and the pipeline runs at the pace of the busier
  end. The conditioning (timestep MLP, AdaLN-LoRA global term) is replicated: every TP / CP rank
  computes it for its samples and every pipeline stage recomputes it from the raw ``c_noise``
  (``vfm_core.parallel.pipeline``: cheaper than sending the embeddings and their gradients).
* **attention**: the ``attention`` and ``cross_attention`` FLOPs at FlashAttention-class throughput
  that ramps with the attended length S as S / (S + S½) and is lower at head dim 64 (FA2, Dao 2023;
  FA3, Shah et al. 2024). ST-DiT spatial attention attends over h·w tokens, temporal over t.
* **element-wise work** (norms, AdaLN modulation, activations, RoPE, copies): memory-bound, the
  saved activation bytes (:mod:`vfm_core.perf.memory`) × passes / achieved HBM bandwidth.
* **recompute**: ``full`` repeats the forward (1/3 of the GEMM and attention work, the forward's
  element-wise work and TP collectives); ``selective`` repeats only the forward element-wise work.
* **TP/SP** (Megatron-LM, Shoeybi et al. 2019; SP: Korthikanti et al. 2022 §4.2.2): per sub-layer an
  all-gather + reduce-scatter (or one all-reduce without SP) of the (tokens × D) activation forward
  and again backward, over NVLink (TP stays inside a node), on the critical path.
* **CP** (inside each pipeline stage): ring attention (Liu et al. 2023) passes K/V around the ring
  — cp−1 steps forward, K/V and their gradients backward — hidden behind the attention compute of
  each step when it is long enough, but each ring step runs the kernel on (S/cp)-long blocks;
  all-to-all (Ulysses, Jacobs et al. 2023) re-shards q, k, v and the output from sequence to
  heads and back, 4 all-to-alls forward and 4 backward, exposed. With the sequence cut along t in
  raster order, ST-DiT spatial attention (within a frame) is local when t % cp == 0.
* **PP**: 1F1B over m micro-batches is m + p − 1 micro-batch slots, the bubble (p−1) of them;
  interleaved 1F1B with v virtual stages per GPU shrinks the bubble to (p−1)/v slots, a fraction
  (p−1)/(v·m + p − 1) of the step (Narayanan et al. 2021, §2.2, eq. for t_pb^int), and sends v
  times as often. Each micro-batch crosses every stage boundary forward with the activation chunk
  (B, N/(cp·tp_sp), D) and backward with its gradient — point-to-point between the ranks of the
  same (dp, cp, tp) coordinate of adjacent stages (``vfm_core.parallel.pipeline``; the
  conditioning is looked up per stage, not sent), exposed. The stages run in lock step, so the
  sends go at the pace of the slowest stage boundary the schedule uses
  (:func:`pp_boundaries_across_nodes`): InfiniBand when any of them leaves a node, NVLink only
  when the whole pipeline sits in one.
* **FSDP** (ZeRO-3, FSDP2): parameters all-gathered for forward and again for backward (reshard
  after forward) per micro-batch, gradients reduce-scattered in fp32 in every backward: without a
  pipeline the trainer's gradient accumulation (``train.grad_accum``) keeps FSDP2's gradient sync
  on, so each accumulated micro-batch reduces (and HSDP all-reduces) its gradients. Under a pipeline
  schedule ``torch.distributed.pipelining`` keeps the backward's gathered parameters and unsharded
  gradients until the last micro-batch (``PipelineStage.backward_maybe_with_nosync``:
  ``set_reshard_after_backward(False)``, ``set_requires_gradient_sync(False)``), so after the
  warm-up forwards a micro-batch costs one all-gather (its backward's): m + min(m, p) passes per
  step, and the gradient reduction waits for the step's last backward (``perform_reduce_grad``),
  exposed but for the virtual stages that finish earlier. **HSDP/DDP** outer replicas all-reduce
  the gradient shards over InfiniBand. The rest overlaps with compute up to a fraction of it; the
  first layer's all-gather is always exposed.

Collectives use ring-algorithm bus bandwidth: all-gather / reduce-scatter of S bytes over n ranks
move S·(n−1)/n, all-reduce twice that, all-to-all S·(n−1)/n (NCCL ``PERFORMANCE.md``). A group
whose ranks span more than one node runs at the InfiniBand bandwidth per GPU. Rank order follows
torchtitan's mesh ``[pp, dp_replicate, dp_shard, cp, tp]`` (tp innermost): a group of size n with
stride s lies in one node when n·s ≤ GPUs per node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from vfm_core.config import ModelConfig, ParallelDegrees, resolve_degrees
from vfm_core.families import family_of
from vfm_core.geometry import Grid, default_grid
from vfm_core.models.dit import block_layouts
from vfm_core.perf.flops import train_flops
from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, Efficiency, GpuSpec
from vfm_core.perf.memory import Recompute, Split, block_params, param_count, stage_saved_bytes

CpMode = Literal["ring", "a2a"]


@dataclass(kw_only=True, slots=True)
class Layout(ParallelDegrees):
    """One 4D-parallel training layout: the degrees of :class:`~vfm_core.config.ParallelDegrees`
    (declared there once) and how the step runs on them. A layout's world is the product of its
    degrees, so dp_shard=-1 (unset) is 1 here: no FSDP split."""

    sp: bool = False
    """Sequence parallelism for the norms/residuals inside the TP group (needs tp > 1)."""
    recompute: Recompute = "none"
    """Activation recomputation: none, selective (element-wise ops) or full (whole blocks)."""
    recompute_blocks: int = 0
    """With ``recompute="full"``: only the first this many blocks of each (virtual) stage are
    recomputed whole, the rest selectively (``parallel.activation_checkpointing_blocks``);
    0 = every block."""
    micro_batch: int = 1
    """Samples per micro-batch per model replica."""
    microbatches: int = 1
    """Micro-batches per optimiser step: with pp > 1 the pipeline schedule's micro-batches (the
    trainer's ``parallel.pp_microbatches``, >= pp), with pp == 1 gradient accumulation
    (``train.grad_accum``)."""
    cp_mode: CpMode = "ring"
    """Context-parallel attention: ring P2P or all-to-all (Ulysses)."""
    vpp: int = 1
    """Virtual pipeline stages per GPU (interleaved 1F1B, ``parallel.pp_virtual_stages``): the
    depth is cut into pp·vpp stages, GPU r holding stages r, r + pp, ..."""

    def __post_init__(self) -> None:
        rest = math.prod(v for k, v in self.degrees().items() if k != "dp_shard")
        shard = self.dp_shard if isinstance(self.dp_shard, int) and self.dp_shard > 0 else 1
        world = rest * shard  # dp_shard=-1: what is left of the others' product, i.e. 1
        self.dp_shard = resolve_degrees(self.degrees(), world)["dp_shard"]

    @property
    def world(self) -> int:
        return math.prod(self.degrees().values())

    @property
    def recompute_label(self) -> str:
        """``none`` | ``selective`` | ``full`` | ``full:k`` (block-wise, k blocks per stage)."""
        return f"full:{self.recompute_blocks}" if self.recompute_blocks else self.recompute

    def stage_blocks(self, depth: int) -> int:
        """Blocks of each (virtual) pipeline stage of a ``depth``-block model."""
        return depth // (self.pp * self.vpp)

    def full_fraction(self, depth: int) -> float:
        """Share of the blocks recomputed whole (1 for plain ``full``, 0 without it)."""
        if self.recompute != "full":
            return 0.0
        part = self.stage_blocks(depth)
        return min(1.0, self.recompute_blocks / part) if self.recompute_blocks else 1.0


@dataclass(kw_only=True, slots=True, frozen=True)
class Workload:
    """What one sample costs, precomputed once per (model, sequence) so layouts evaluate in µs."""

    cfg: ModelConfig
    seq_len: int
    grid: Grid
    text_len: int
    flops: dict[str, float]
    """Training FLOPs of one sample by component (:func:`vfm_core.perf.flops.train_flops`)."""
    flops_per_token: float
    """:func:`vfm_core.perf.flops.train_flops_per_token` — the TFLOPS numerator."""
    conditioning_flops: float
    """Training FLOPs of one sample's conditioning (timestep MLP, AdaLN-LoRA global D -> 3D term),
    which every TP / CP rank and every pipeline stage computes for itself."""
    params: int
    layer_params: int
    """Parameters of the largest block."""
    kinds: tuple[tuple[str, ...], ...]
    """``block_layouts`` of every block: ("full",) or ("spatial", "temporal")."""
    pass_share: dict[str, float]
    """Share of the self-attention FLOPs in one pass of each layout (full, spatial, temporal)."""
    adapter_params: int = 0
    """LoRA adapters' parameters (``train.lora.rank`` > 0): held beside the model, the only
    ones that train."""
    cache: dict = field(default_factory=dict, compare=False, repr=False)
    """Per-query memo (stage shapes, saved bytes) so thousands of layouts evaluate quickly."""


def workload(
    cfg: ModelConfig,
    *,
    seq_len: int,
    grid: Grid | None = None,
    text_len: int | None = None,
    lora_rank: int = 0,
) -> Workload:
    """Precompute FLOPs and parameter counts of ``cfg`` at ``seq_len`` tokens per sample;
    ``lora_rank`` > 0: a LoRA fine-tuning run (adapters on the default targets train, the
    model is frozen)."""
    if seq_len <= 0:
        raise ValueError(f"sequence length must be positive, got {seq_len}")
    grid = tuple(grid) if grid is not None else default_grid(seq_len)  # type: ignore[assignment]
    L = cfg.text_len if text_len is None else text_len
    fl = train_flops(cfg, seq_lens=seq_len, grid=grid, text_len=L)
    kinds = tuple(block_layouts(cfg, i) for i in range(cfg.depth))
    t, h, w = grid
    weights = {"full": float(seq_len) ** 2, "spatial": t * float(h * w) ** 2}
    weights["temporal"] = h * w * float(t) ** 2  # 4·S²·D per group, as in flops.py
    total_w = sum(weights[lo] for x in kinds for lo in x)
    cond = family_of(cfg).conditioning_flops(cfg, fl["timestep_embed"])
    return Workload(
        cfg=cfg,
        seq_len=seq_len,
        grid=grid,  # type: ignore[arg-type]
        text_len=L,
        flops=fl,
        flops_per_token=_step_flops(fl, lora_rank) / seq_len,
        conditioning_flops=cond,
        params=param_count(cfg),
        layer_params=max(block_params(cfg, i) for i in range(cfg.depth)),
        kinds=kinds,
        pass_share={lo: weights[lo] / total_w for lo in weights},
        adapter_params=adapter_params(cfg, lora_rank),
    )


def _step_flops(fl: dict[str, float], lora_rank: int) -> float:
    """Training FLOPs of one sample: with LoRA the frozen weights' gradients are not computed
    (1/3 of every GEMM's work, the attention's unchanged)."""
    if lora_rank <= 0:
        return fl["total"]
    return fl["total"] - (fl["total"] - fl["attention"] - fl["cross_attention"]) / 3


def adapter_params(cfg: ModelConfig, rank: int) -> int:
    """Parameters of rank-``rank`` LoRA adapters on the default targets (counted on the meta
    model: r·(in + out) per adapted linear); 0 without LoRA."""
    if rank <= 0:
        return 0
    from vfm_core.config import LoraConfig
    from vfm_core.families import build_model
    from vfm_core.models.lora import add_adapters

    model = build_model(cfg, device="meta")
    names = add_adapters(model, LoraConfig(rank=rank))
    return sum(rank * (m.in_features + m.out_features) for m in map(model.get_submodule, names))


def weight_grads(work: Workload) -> float:
    """Share of the GEMM work a step does: 1 when every weight trains, 2/3 when the model is
    frozen (LoRA: the backward computes the inputs' gradients, not the frozen weights'; the
    adapters' own GEMMs, r-wide, are neglected)."""
    return 2 / 3 if work.adapter_params else 1.0


@dataclass(kw_only=True, slots=True)
class StepTime:
    """Seconds per optimiser step on the busiest GPU, and where they go."""

    compute_s: float
    """GEMMs + attention + element-wise work + recomputation, all micro-batches."""
    exposed_comm_s: float
    """Communication not hidden behind compute (TP/SP, CP, PP sends, FSDP/DP leftovers)."""
    bubble_s: float
    """Pipeline fill and drain."""
    optimizer_s: float
    """AdamW update of the local shard (memory-bound)."""
    step_s: float
    parts: dict[str, float] = field(default_factory=dict)
    """Finer breakdown (gemm, attention, pointwise, recompute, tp, cp, pp_p2p, fsdp, dp ...)."""
    pp_across_nodes: tuple[int, int] = (0, 0)
    """(stage boundaries whose sends leave a node, boundaries used): any such boundary prices
    the pipeline's sends on InfiniBand (:func:`pp_boundaries_across_nodes`)."""


def _link_bw(gpu: GpuSpec, eff: Efficiency, *, size: int, stride: int) -> float:
    """Bytes/s per GPU (one direction) of a collective over ``size`` ranks ``stride`` apart."""
    return _bw(gpu, eff, across_nodes=size * stride > gpu.gpus_per_node)


def _bw(gpu: GpuSpec, eff: Efficiency, *, across_nodes: bool) -> float:
    """Bytes/s per GPU (one direction) over InfiniBand (``across_nodes``) or NVLink."""
    if across_nodes:
        return gpu.ib_gbps / 8 * 1e9 * eff.ib
    return gpu.nvlink_gbps / 2 * 1e9 * eff.nvlink  # datasheet NVLink is bidirectional


def pp_boundaries_across_nodes(lay: Layout, gpus_per_node: int) -> tuple[int, int]:
    """(stage boundaries whose sends leave a node, stage boundaries the schedule uses).

    Ranks follow the mesh order ``[pp, dp_replicate, dp_shard, cp, tp]`` (pp outermost,
    ``vfm_core.parallel.dims.MESH_DIMS``), so pipeline stage s holds ranks s·S ... s·S + S − 1
    with S = world / pp, and its rank s·S + i sends to rank (s+1)·S + i; node n holds ranks
    n·g ... n·g + g − 1 (g = ``gpus_per_node``). The boundaries are s -> s+1 for s < pp − 1, and
    with virtual stages (interleaved 1F1B) also the last GPU's chunk to the first GPU's next one.
    A boundary leaves a node when any of its S sends does."""
    pp, g = lay.pp, gpus_per_node
    if pp == 1:
        return 0, 0
    size = lay.world // pp  # S: ranks per stage
    pairs = [(s, s + 1) for s in range(pp - 1)]
    if lay.vpp > 1:
        pairs.append((pp - 1, 0))

    def leaves(a: int, b: int) -> bool:
        if size >= g:  # ranks S >= g apart never share a node
            return True
        return any((a * size + i) // g != (b * size + i) // g for i in range(size))

    return sum(leaves(a, b) for a, b in pairs), len(pairs)


def _attn_eff(eff: Efficiency, span: float, head_dim: int) -> float:
    base = eff.attention * (eff.attention_hd64 if head_dim <= 64 else 1.0)
    return base * span / (span + eff.attention_half_seq)


def _stage_shape(work: Workload, pp: int) -> tuple[dict[str, int], int, int]:
    """(attention passes by layout, sub-layers, GEMM calls) of the first stage's blocks (all
    stages alike), memoised per pipeline degree."""
    key = ("stage", pp)
    if key not in work.cache:
        cfg = work.cfg
        kinds = work.kinds[: cfg.depth // pp]
        passes: dict[str, int] = {}
        for lo in (lo for x in kinds for lo in x):
            passes[lo] = passes.get(lo, 0) + 1
        n_sub = sum(len(x) + 2 for x in kinds)  # sub-layers of the stage
        mlp_mats = 3 if cfg.mlp == "swiglu" else 2
        calls = 3 * sum(4 * len(x) + 4 + mlp_mats for x in kinds)  # fwd, dX, dW per linear
        work.cache[key] = (passes, n_sub, calls)
    return work.cache[key]


def _gemm_seconds(
    work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency, gemm_calls: int
) -> tuple[float, float]:
    """(GEMM seconds, conditioning seconds) of one micro-batch: the blocks' GEMMs split over the
    stages, the ends on the first (patch embedding) and last stage (final layer, vocabulary
    head), the conditioning on every rank."""
    fl, peak = work.flops, gpu.bf16_tflops * 1e12
    tp, cp, pp, mb = lay.tp, lay.cp, lay.pp, lay.micro_batch
    first, last = fl["patch_embed"], fl["final"] + fl.get("head", 0.0)
    cond = work.conditioning_flops
    blocks = fl["total"] - fl["attention"] - fl["cross_attention"] - first - last - cond
    ends = max(first, last) if pp > 1 else first + last
    gemm_flops = (blocks / pp + ends) * mb / (tp * cp) * weight_grads(work)
    gemm = gemm_flops / (eff.gemm * peak) + gemm_calls * eff.gemm_launch_s
    conditioning = cond * mb / (eff.gemm * peak)
    return gemm, conditioning


def _attention_pass_seconds(
    work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency, passes: dict[str, int]
) -> dict[str, float]:
    """Seconds of one self-attention pass (fwd + bwd) of one micro-batch on one GPU, by layout.

    Attended length per kernel call: ring attention computes (S/cp)-long blocks per step of any
    pass it distributes (spatial is local when frames are whole on each rank); Ulysses keeps S."""
    fl, peak, hd = work.flops, gpu.bf16_tflops * 1e12, work.cfg.head_dim
    tp, cp, mb = lay.tp, lay.cp, lay.micro_batch
    t, hh, ww = work.grid
    ring = cp > 1 and lay.cp_mode == "ring"
    span = {
        "full": work.seq_len / (cp if ring else 1),
        "spatial": hh * ww,  # ST-DiT: all-to-all (whole frames / locations per head group)
        "temporal": t,
    }
    return {
        lo: fl["attention"]
        * work.pass_share[lo]
        * mb
        / (tp * cp)
        / (peak * _attn_eff(eff, span[lo], hd))
        for lo in passes
    }


def _saved_bytes(work: Workload, lay: Layout) -> float:
    """Activation bytes one micro-batch of the first stage saves for backward; memoised as
    a + b·mb (saved bytes are affine in the micro-batch size)."""
    cfg, tp, cp = work.cfg, lay.tp, lay.cp
    key = ("saved", lay.pp, tp, lay.sp, cp, lay.cp_mode)
    if key not in work.cache:
        stage_layers = range(cfg.depth // lay.pp)
        kw = dict(seq_len=work.seq_len, text_len=work.text_len, kinds=work.kinds)
        split = Split(tp=tp, sp=lay.sp, cp=cp, ring=lay.cp_mode == "ring")
        one, two = (
            stage_saved_bytes(cfg, stage_layers, micro_batch=k, split=split, **kw) for k in (1, 2)
        )
        work.cache[key] = (2 * one - two, two - one)
    const, per_mb = work.cache[key]
    return const + per_mb * lay.micro_batch


def _tp_seconds(
    work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency, n_sub: int, full: float
) -> float:
    """Exposed TP/SP collectives of one micro-batch: AG + RS (or AR) forward and backward per
    sub-layer, the forward's again under full recompute."""
    tp = lay.tp
    if tp == 1:
        return 0.0
    act_bytes = lay.micro_batch * work.seq_len / lay.cp * work.cfg.hidden * 2
    bw = _link_bw(gpu, eff, size=tp, stride=1)
    per = 4 * act_bytes * (tp - 1) / tp / bw + 4 * eff.collective_latency_s
    n_fwd = n_sub * (1 + 0.5 * full)  # full recompute: the forward's collectives again
    return per * n_fwd * (1 - eff.tp_overlap)


def _cp_seconds(
    work: Workload,
    lay: Layout,
    gpu: GpuSpec,
    eff: Efficiency,
    passes: dict[str, int],
    per_pass: dict[str, float],
) -> tuple[float, float]:
    """(exposed, hidden) context-parallel seconds of one micro-batch: ring K/V passes hidden
    behind each step's attention up to ``eff.ring_overlap``, all-to-all re-sharding exposed."""
    cfg, tp, cp = work.cfg, lay.tp, lay.cp
    cp_s = cp_hidden = 0.0
    if cp == 1:
        return cp_s, cp_hidden
    stdit = cfg.arch == "stdit"
    bw = _link_bw(gpu, eff, size=cp, stride=tp)
    tok = lay.micro_batch * work.seq_len / cp
    dq, dkv = cfg.heads * cfg.head_dim / tp, cfg.n_kv_heads * cfg.head_dim / tp
    for lo, n_pass in passes.items():
        if lo == "spatial" and work.grid[0] % cp == 0:
            continue  # frames are whole on each rank
        # ST-DiT trains its spatial / temporal passes with all-to-all in either mode (the
        # trainer's "hybrid" = ring for full attention only)
        ring_pass = lay.cp_mode == "ring" and not (stdit and lo != "full")
        if ring_pass:
            kv = tok * 2 * dkv * 2  # local K and V, bf16
            comm = 3 * (cp - 1) * (kv / bw + eff.collective_latency_s)  # fwd kv, bwd kv + dkv
            hidden = min(comm, eff.ring_overlap * per_pass[lo])
            cp_s += n_pass * (comm - hidden)
            cp_hidden += n_pass * hidden
        else:
            qkvo = tok * (2 * dq + 2 * dkv) * 2
            cp_s += n_pass * 2 * (qkvo * (cp - 1) / cp / bw + 4 * eff.collective_latency_s)
    return cp_s, cp_hidden


def _pp_seconds(work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency) -> float:
    """PP sends of one micro-batch, each of the vpp virtual stages of this GPU: the activation
    chunk (B, N/(cp·tp_sp), D) forward, its gradient backward (the conditioning is not sent:
    every stage looks up its micro-batch's own, vfm_core.parallel.pipeline). The slowest
    boundary paces the lock-stepped stages."""
    if lay.pp == 1:
        return 0.0
    across, _ = pp_boundaries_across_nodes(lay, gpu.gpus_per_node)
    bw = _bw(gpu, eff, across_nodes=across > 0)
    act_bytes = lay.micro_batch * work.seq_len / lay.cp * work.cfg.hidden * 2
    chunk = act_bytes / (lay.tp if lay.sp else 1)  # (B, N/(cp·tp_sp), D) bf16
    return lay.vpp * 2 * (chunk / bw + eff.collective_latency_s)


def _micro_batch(work: Workload, lay: Layout, gpu: GpuSpec, eff: Efficiency) -> dict[str, float]:
    """Seconds of one micro-batch on one GPU of the busiest stage: compute parts, TP, CP, PP sends
    (all ``vpp`` virtual stages of the GPU). Independent of the data-parallel split and of the
    number of micro-batches, so memoised per query on the other degrees."""
    mkey = ("mb", gpu.name, eff, lay.tp, lay.cp, lay.pp, lay.sp, lay.micro_batch, lay.recompute)
    mkey += (lay.cp_mode, lay.world // lay.pp, lay.vpp, lay.recompute_blocks)
    if mkey in work.cache:
        return work.cache[mkey]
    passes, n_sub, gemm_calls = _stage_shape(work, lay.pp)
    gemm, conditioning = _gemm_seconds(work, lay, gpu, eff, gemm_calls)
    per_pass = _attention_pass_seconds(work, lay, gpu, eff, passes)
    attn = sum(per_pass[lo] * n for lo, n in passes.items())
    share = lay.micro_batch / (lay.tp * lay.cp * lay.pp)  # of one sample's work per GPU
    peak_xattn = gpu.bf16_tflops * 1e12 * _attn_eff(eff, work.text_len, work.cfg.head_dim)
    attn += work.flops["cross_attention"] * share / peak_xattn
    pointwise = _saved_bytes(work, lay) * eff.pointwise_passes / (gpu.hbm_tbps * 1e12 * eff.hbm)
    # full: the forward again (1/3 of fwd + bwd); selective: its element-wise work; block-wise
    # full (recompute_blocks): full on that share of the blocks, selective on the rest
    full = lay.full_fraction(work.cfg.depth)
    recompute = 0.0
    if lay.recompute != "none":
        recompute = full * (gemm + attn) / 3 + pointwise / 3
    cp_s, cp_hidden = _cp_seconds(work, lay, gpu, eff, passes, per_pass)
    out = {
        "gemm": gemm,
        "attention": attn,
        "pointwise": pointwise,
        "recompute": recompute,
        "conditioning": conditioning,
        "tp": _tp_seconds(work, lay, gpu, eff, n_sub, full),
        "cp": cp_s,
        "pp_p2p": _pp_seconds(work, lay, gpu, eff),
        "cp_hidden": cp_hidden,
    }
    work.cache[mkey] = out
    return out


def step_time(
    work: Workload, layout: Layout, gpu: GpuSpec, eff: Efficiency = DEFAULT_EFFICIENCY
) -> StepTime:
    """Predicted step time of ``layout`` (see the module docstring for the model)."""
    lay = layout
    tp, cp, pp, m = lay.tp, lay.cp, lay.pp, lay.microbatches
    mbt = dict(_micro_batch(work, lay, gpu, eff))
    cp_hidden = mbt.pop("cp_hidden")
    compute_mb = sum(mbt[k] for k in ("gemm", "attention", "pointwise", "recompute"))
    compute_mb += mbt["conditioning"]
    comm_mb = mbt["tp"] + mbt["cp"] + mbt["pp_p2p"]
    t_mb = compute_mb + comm_mb
    # (p−1)/v micro-batch slots of fill and drain: a fraction bubble_fraction(p, m, v) of the
    # pipelined time (Narayanan et al. 2021 §2.2)
    bubble = (pp - 1) / lay.vpp * t_mb if pp > 1 else 0.0

    # --- FSDP / DP (per step), overlapped with compute
    local = (work.params + work.adapter_params) / (tp * pp)  # gathered: all; reduced: trained
    trained = work.adapter_params / (tp * pp) if work.adapter_params else local
    shard = lay.dp_shard * cp
    layers = work.cfg.depth // pp
    fsdp_s = first_ag = ag = rs = 0.0
    # all-gather passes per step: forward and backward of every micro-batch; under a pipeline
    # schedule the backward's gathered parameters stay for the next forward after the warm-up
    ag_passes = m + min(m, pp) if pp > 1 else 2 * m
    ag_fwd = min(m, pp) if pp > 1 else m
    syncs = 1 if pp > 1 else m  # gradient reductions per step
    if shard > 1:
        bw = _link_bw(gpu, eff, size=shard, stride=tp)
        frac = (shard - 1) / shard
        ag = local * 2 * frac / bw + layers * eff.collective_latency_s  # bf16 params, per pass
        # fp32 gradients: per backward without a pipeline (gradient accumulation syncs every
        # micro-batch), once per step under a pipeline schedule
        rs = (trained * 4 * frac / bw + layers * eff.collective_latency_s) * syncs
        fsdp_s = ag * ag_passes + rs
        first_ag = work.layer_params / tp * 2 * frac / bw
    dp_s = 0.0
    if lay.dp_replicate > 1:
        r = lay.dp_replicate
        bw = _link_bw(gpu, eff, size=r, stride=tp * cp * lay.dp_shard)
        dp_s = (2 * (trained / shard) * 4 * (r - 1) / r / bw + eff.collective_latency_s) * syncs
    compute = compute_mb * m
    # FSDP2 overlap by phase: forward all-gathers hide behind the forward (1/3 of the GEMM and
    # attention work), backward all-gathers, the gradient reduce-scatter and the HSDP replica
    # all-reduce behind the backward (2/3, plus recompute); the last layer's gradient
    # reduce-scatter + all-reduce cannot hide (nothing left to compute), nor the first layer's
    # all-gather.
    # Under a pipeline schedule the gradient reduce-scatter and replica all-reduce wait for the
    # step's last backward (torch.distributed.pipelining ``perform_reduce_grad``): exposed, but
    # for the virtual stages whose last backward comes earlier (all but 1/v of it hides).
    fwd = (compute - mbt["recompute"] * m) / 3
    bwd = compute - fwd
    tail = (rs + dp_s) / (lay.vpp if pp > 1 else max(layers, 1))
    exposed_fwd = max(0.0, ag * ag_fwd - eff.fsdp_overlap * fwd)
    exposed_bwd = max(0.0, ag * m + rs + dp_s - tail - eff.fsdp_overlap * bwd)
    overlapped = exposed_fwd + exposed_bwd + tail + first_ag
    # hidden communication still slows the compute it runs under (SM + HBM contention)
    hidden = (fsdp_s + dp_s - (overlapped - first_ag)) + cp_hidden * m
    contention = eff.comm_contention * max(0.0, hidden)
    optimizer = (trained / shard) * 28 / (gpu.hbm_tbps * 1e12 * eff.hbm)  # read 14 B, write 14 B
    exposed = comm_mb * m + overlapped + contention
    step = compute + exposed + bubble + optimizer
    parts = {k: v * m for k, v in mbt.items()}
    parts |= {
        "fsdp": fsdp_s,
        "dp": dp_s,
        "fsdp_dp_exposed": overlapped,
        "contention": contention,
        "optimizer": optimizer,
        "bubble": bubble,
    }
    return StepTime(
        compute_s=compute,
        exposed_comm_s=exposed,
        bubble_s=bubble,
        optimizer_s=optimizer,
        step_s=step,
        parts=parts,
        pp_across_nodes=pp_boundaries_across_nodes(lay, gpu.gpus_per_node),
    )


def tokens_per_step_per_gpu(work: Workload, layout: Layout) -> float:
    """Video tokens one GPU's model replica share trains per step: mb·m·seq / (tp·cp·pp)."""
    lay = layout
    return lay.micro_batch * lay.microbatches * work.seq_len / (lay.tp * lay.cp * lay.pp)


def bubble_fraction(pp: int, microbatches: int, vpp: int = 1) -> float:
    """1F1B pipeline bubble as a fraction of the step: (p−1) / (v·m + p − 1) (Narayanan et al.
    2021, §2.2; v = 1 is plain 1F1B)."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (vpp * microbatches + pp - 1)
