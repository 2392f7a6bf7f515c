"""parallelize_dit: apply parallelism to a single-device DiT from outside, in a fixed order.

Order (torchtitan ``parallelize.py``; paper §4): **TP/SP -> CP -> activation checkpointing ->
FSDP2**, applied to the whole model or to each pipeline stage (:mod:`vfm_core.parallel.pipeline`
cuts the stages first). The model code in ``vfm_core/models`` never sees a mesh; this module only
uses ``parallelize_module`` plans, forward hooks and the attention modules' swappable ``core``.

How the sequence is split. Tokens stay in (t, h, w) raster order. With CP (degree C) and/or SP
(sequence parallel over the TP group, degree T) the ``x_embedder`` output is cut into C*T contiguous
chunks, rank (cp=c, tp=t) keeping chunk ``c*T + t``; every block works on its chunk (attention
all-gathers the TP chunks of a CP chunk, ring / all-to-all attention joins the CP chunks), and the
``final`` layer's output is all-gathered back to the full sequence, so ``unpatchify`` and the loss
run unchanged (identically on the ranks of one CP x TP group).

Packed sequences (``DiT.forward_packed``, one pack of length divisible by C*T per data-parallel
rank) use the same cut, so chunk boundaries may split samples. A forward pre-hook cuts the pack's
per-token side information like the tokens: the token -> sample index of the modulation by
(C, T), the rows of the attention spec's cross-attention mask by C (SP all-gathers the attention
input); the attention group ids stay whole, since ring / all-to-all attention need the whole
pack's ids. In the hybrid mode ST-DiT's spatial / temporal passes of a pack (attention under
group ids) go all-to-all and full attention to the ring, as for unpacked batches.

Gradients. On a sequence chunk every parameter only sees its own tokens, so its gradient is a
partial sum that must be summed:

* over **cp**: every parameter (each CP rank saw different tokens). FSDP2 shards over the
  flattened (dp_shard, cp) ranks (torchtitan's ``dp_shard_cp``) with its gradient divide factor set
  to the data-parallel degree, so its reduce-scatter sums over CP and averages over DP at once;
* over **tp** (:func:`sync_grads`, after ``backward``): parameters TP does not shard (plain
  tensors): with SP all of them (sequence chunks), without SP only the per-head QK-RMSNorm weights
  (each TP rank normalises different heads) — Megatron's rule for sequence-parallel norm weights.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    parallelize_module,
)

from vfm_core.config import ConfigError
from vfm_core.models.lora import LoRALinear
from vfm_core.parallel.context import (
    ContextParallelAttention,
    CPMode,
    causal_positions,
    gather_seq,
    seq_chunk,
    split_seq,
)
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.recompute import checkpoint_blocks, uses_selective

_MLP_IN = ("fc1", "w1", "w3")  # GELU fc1, SwiGLU gate w1 and up w3: column-parallel
_MLP_OUT = ("fc2", "w2")  # row-parallel


@dataclass(kw_only=True, slots=True)
class GradSync:
    """Which parameter gradients are partial sums over which group (see module docstring)."""

    groups: list[tuple[dist.ProcessGroup, list[str]]]
    """(process group, parameter names whose gradients are summed over it)."""


def check_parallel_fit(model: nn.Module, dims: ParallelDims, cp_mode: CPMode) -> None:
    """The model's heads split over the TP and CP degrees as ``cp_mode`` needs; else a
    :class:`ConfigError` naming the setting."""
    cfg = model.cfg
    if dims.tp_enabled:
        if cfg.heads % dims.tp or cfg.n_kv_heads % dims.tp:
            raise ConfigError(
                f"parallel.tp: {dims.tp} must divide model.heads={cfg.heads} and the key/value "
                f"heads {cfg.n_kv_heads}"
            )
    if dims.cp_enabled and cp_mode != "ring" and cfg.arch == "stdit":
        if (cfg.heads // dims.tp) % dims.cp:
            raise ConfigError(
                f"parallel.cp: all-to-all attention needs heads per TP rank "
                f"({cfg.heads}/{dims.tp}) divisible by cp={dims.cp}"
            )
    if dims.cp_enabled and cp_mode == "ring" and cfg.arch == "stdit":
        raise ConfigError(
            "parallel.cp_mode: 'ring' cannot run ST-DiT spatial/temporal attention; use 'hybrid'"
        )


def _tp_plan(block: nn.Module, sp: bool) -> dict:
    """parallelize_module plan of one DiT / ST-DiT / Llama-DiT block."""
    seq_in = PrepareModuleInput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=False
    )
    out_layout = Shard(1) if sp else Replicate()
    plan: dict = {}
    attns = [f"self_attn.{i}" for i in range(len(block.self_attn))]
    attns += ["cross_attn"] if block.cross_attn is not None else []
    for name in attns:
        if sp:  # all-gather the sequence chunks of the (modulated) input; text stays replicated
            plan[name] = seq_in
        for proj in ("q", "k", "v", "qkv"):  # fused qkv: rows by key/value group, whole on a rank
            if hasattr(block.get_submodule(name), proj):
                plan[f"{name}.{proj}"] = ColwiseParallel()
        plan[f"{name}.o"] = RowwiseParallel(output_layouts=out_layout)
    if sp:
        plan["mlp"] = seq_in
    for proj in _MLP_IN:
        if hasattr(block.mlp, proj):
            plan[f"mlp.{proj}"] = ColwiseParallel()
    for proj in _MLP_OUT:
        if hasattr(block.mlp, proj):
            plan[f"mlp.{proj}"] = RowwiseParallel(output_layouts=out_layout)
    return plan


def _vocab_plan(model: nn.Module, sp: bool) -> dict:
    """Vocabulary-parallel embedding (each TP rank holds a slice of the rows; the lookups are
    summed over the group, so the full sequence is on every TP rank before the split hook cuts
    it) and output head (column-parallel: each rank's logits cover its slice of the vocabulary,
    a DTensor sharded on the last dim that :func:`vocab_parallel_loss` reduces without
    gathering; under SP the head first all-gathers the sequence chunks)."""
    plan = {
        "embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "head": ColwiseParallel(
            input_layouts=Shard(1) if sp else Replicate(),
            output_layouts=Shard(-1),
            use_local_output=False,
        ),
    }
    return {k: v for k, v in plan.items() if getattr(model, k) is not None}  # a stage's own


def _sequence_ends(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None, int, bool]:
    """(module whose output is the token sequence, module whose output is gathered back, index
    of the RoPE angles among a block's positional arguments, causal), as the model declares them
    (``SEQUENCE``, ``CAUSAL``: a causal model's CP chunks are balanced zigzag sets of positions).
    A pipeline stage has the first only on the first stage, the second only on the last (None
    elsewhere)."""
    seq_in, seq_out, rope_arg = model.SEQUENCE
    return getattr(model, seq_in), getattr(model, seq_out), rope_arg, model.CAUSAL


def _split_sequence(model: nn.Module, dims: ParallelDims, sp: bool) -> None:
    """Hooks: cut the embedded tokens into this rank's chunk, give every block the RoPE angles of
    its CP chunk, gather the last layer's output back to the full sequence. A causal model's CP
    chunk is the balanced set of positions of :func:`causal_positions` (then cut by SP)."""
    cp, tp = dims.cp, (dims.tp if sp else 1)
    cp_rank, tp_rank = dims.coord("cp"), (dims.coord("tp") if sp else 0)
    cp_group, tp_group = dims.group("cp"), dims.group("tp")
    seq_in, seq_out, rope_arg, causal = _sequence_ends(model)

    def cp_part(x: torch.Tensor, dim: int) -> torch.Tensor:
        if not causal or cp == 1:
            return seq_chunk(x, cp_rank, cp, dim=dim)
        idx = causal_positions(x.shape[dim] // cp, cp)[cp_rank].to(x.device)
        return x.index_select(dim, idx)

    def split(_mod, _inp, out):  # (B, N, D) -> (B, N/(C*T), D)
        if causal and tp > 1:  # the embedding is sharded over tp: it needs every token's grad
            return split_seq(cp_part(out, 1), tp_group)
        # a copy, not a view: the first block saves its input, and a view would keep the whole
        # sequence's embedding alive per microbatch in flight (dit-28b at 74k tokens: 864 MiB)
        return seq_chunk(cp_part(out, 1), tp_rank, tp).clone()

    def split_partial(_mod, _inp, out):  # (1, N, D) -> (1, N/(C*T), D): partial gradients
        # of a replicated parameter, summed over CP (FSDP) and TP (GradSync) like the blocks'
        return seq_chunk(cp_part(out, 1), tp_rank, tp)

    def rope_chunk(_mod, args):  # the block's RoPE angles (N, d/2) -> (N/C, d/2)
        args = list(args)
        args[rope_arg] = cp_part(args[rope_arg], 0)
        return tuple(args)

    def cp_gather(out: torch.Tensor) -> torch.Tensor:  # (B, N/C, F) -> (B, N, F)
        if cp == 1:
            return out
        out = gather_seq(out, cp_group)  # (B, N, F) in rank order
        if causal:  # back to raster order
            order = causal_positions(out.shape[1] // cp, cp).flatten().argsort()
            out = out.index_select(1, order.to(out.device))
        return out

    def gather(_mod, _inp, out):  # (B, N/(C*T), F) -> (B, N, F)
        if isinstance(out, DTensor):  # vocabulary-parallel logits, already whole over tp
            local = cp_gather(out.to_local())  # (B, N, V/tp)
            return DTensor.from_local(local, out.device_mesh, out.placements, run_check=False)
        if tp > 1:
            out = gather_seq(out, tp_group)
        return cp_gather(out)

    def pack_chunk(_mod, args, kwargs):  # packed forward: block(..., spec, pack) / final(pack)
        pack, spec = kwargs.get("pack"), kwargs.get("spec")
        if pack is None and (spec is None or spec.groups is None):
            return None
        # modulation rows follow the block's tokens (CP chunk, then SP chunk); cross-attention
        # rows follow what the attention sees (the CP chunk: SP all-gathers its input); the
        # group ids stay whole (ring / all-to-all take the whole pack's ids)
        if pack is not None:  # (n,) pack tokens, or (B, n) per-frame rows of a batch
            dim = pack.token_sample.ndim - 1
            local = seq_chunk(cp_part(pack.token_sample, dim), tp_rank, tp, dim)  # (.., n)
            kwargs = {**kwargs, "pack": replace(pack, token_sample=local)}
        if spec is not None and spec.groups is not None:
            cross = cp_part(spec.mask, 2)  # (1, 1, N/C, S*L)
            kwargs = {**kwargs, "spec": replace(spec, mask=cross)}
        return args, kwargs

    if seq_in is not None:  # the first pipeline stage (or the whole model)
        seq_in.register_forward_hook(split)
        # the causal model's absolute positions (1, N, D) and pooled caption (B | 1, N, D),
        # added to the embedding: cut alike
        for name in ("pos_embed", "text_embedder") if causal else ():
            term = getattr(model, name, None)
            if term is not None:
                term.register_forward_hook(split_partial)
    if cp > 1:
        for block in model.blocks.values():
            block.register_forward_pre_hook(rope_chunk)
    ends = (seq_out,) if seq_out is not None else ()
    for module in (*model.blocks.values(), *ends):
        module.register_forward_pre_hook(pack_chunk, with_kwargs=True)
    if seq_out is not None:  # the last pipeline stage (or the whole model)
        seq_out.register_forward_hook(gather)


def fsdp_units(model: nn.Module, unit: str) -> list[nn.Module]:
    """The modules FSDP2 wraps below the root (``parallel.fsdp_unit``), in forward order:
    every block, or every block's sub-layers (its attention, cross-attention, MLP and
    modulation modules; the block itself keeps the rest, its norms) then the block."""
    if unit not in ("block", "sublayer"):
        raise ConfigError(f"parallel.fsdp_unit: {unit!r} unknown (block | sublayer)")
    units: list[nn.Module] = []
    for block in model.blocks.values():
        if unit == "sublayer":
            for name in ("self_attn", "cross_attn", "mlp", "modulation"):
                sub = getattr(block, name, None)
                if isinstance(sub, nn.ModuleList):
                    units.extend(sub)
                elif sub is not None and any(True for _ in sub.parameters()):
                    units.append(sub)
        units.append(block)
    return units


def _fsdp_unit(unit: str, device_type: str, selective: bool) -> str:
    """``parallel.fsdp_unit`` resolved: ``auto`` is block on CUDA and under selective recompute
    (whose op cache replays a block's ops one by one in the backward, and a sub-layer unit's
    FSDP hooks inside the block run a different number of them in the recompute), sub-layer
    otherwise."""
    if unit == "sublayer" and selective:
        raise ConfigError(
            "parallel.fsdp_unit=sublayer does not combine with selective activation checkpointing "
            "(the recompute replays the FSDP hooks inside the block): use fsdp_unit=block or auto"
        )
    if unit == "auto":
        return "block" if device_type == "cuda" or selective else "sublayer"
    return unit


def compile_each_block(model: nn.Module) -> None:
    """Regional compilation (``train.compile``, torchtitan's ``apply_compile``): each of the
    model's blocks compiled in place, parameter names unchanged."""
    for block in model.blocks.values():
        block.compile()


def parallelize_dit(
    model: nn.Module,
    *,
    parallel_dims: ParallelDims,
    sequence_parallel: bool = True,
    cp_mode: CPMode = "hybrid",
    activation_checkpointing: bool | str = False,
    full_recompute_blocks: int = 0,
    compile_blocks: bool = False,
    fsdp_unit: str = "auto",
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Parallelize ``model`` (a DiT or the causal video transformer, whole or one pipeline stage
    of it) in place and return it.

    The model may live on the ``meta`` device (then ``to_empty`` and
    :func:`vfm_core.models.init.init_parameters` materialise each rank's shards of the seed's
    one initialisation), or be materialised already on every rank from the same seed (TP and
    FSDP keep their slice of the same full weights). After ``loss.backward()`` call
    :func:`sync_grads` (then clip and step as usual).
    """
    dims = parallel_dims
    device = next(model.parameters()).device
    if device.type == "meta":  # the mesh is normally built already (by the trainer)
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims.build_mesh(device.type)
    check_parallel_fit(model, dims, cp_mode)
    sp = sequence_parallel and dims.tp_enabled
    plain_before_tp = {n for n, p in model.named_parameters() if not isinstance(p, DTensor)}

    # 1. tensor (+ sequence) parallel
    if dims.tp_enabled:
        _tensor_parallel(model, dims, sp)
    # 2. context parallel: self-attention cores become ring / all-to-all over the cp group
    if dims.cp_enabled:
        _context_parallel_attention(model, dims, cp_mode)
    if sp or dims.cp_enabled:
        _split_sequence(model, dims, sp)
    groups = [_tp_partial_grads(model, dims, sp, plain_before_tp)] if dims.tp_enabled else []
    model.vfm_grad_sync = GradSync(groups=groups)  # cp partial sums: FSDP's reduce-scatter
    # 3. activation checkpointing: recompute each block in backward (parameter names unchanged)
    # False | True/"full" | "selective"; full on the first ``full_recompute_blocks`` only
    checkpoint_blocks(model.blocks, activation_checkpointing, full_blocks=full_recompute_blocks)
    if compile_blocks:  # regional compilation: each (checkpointed) block, before FSDP wraps it
        compile_each_block(model)
    # 4. FSDP2 over the data-parallel x context-parallel ranks (HSDP when dp_replicate > 1).
    # Gradients are divided by dp only: averaged over the batch slices, summed over the CP ranks'
    # token chunks of the same samples.
    if dims.fsdp_enabled or dims.cp_enabled:
        selective = uses_selective(activation_checkpointing, full_recompute_blocks)
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        _fully_shard(model, dims, fsdp_unit=fsdp_unit, selective=selective, mp=mp)
    return model


def _tensor_parallel(model: nn.Module, dims: ParallelDims, sp: bool) -> None:
    """Megatron-style TP (+ SP) plans on every block, and for the causal model the
    vocabulary-parallel embedding and head."""
    tp_mesh = dims.submesh("tp")
    for block in model.blocks.values():
        whole = {
            n: (m.lora_a, m.lora_b) for n, m in block.named_modules() if isinstance(m, LoRALinear)
        }
        parallelize_module(block, tp_mesh, _tp_plan(block, sp), src_data_rank=None)
        _split_adapters(block, tp_mesh, whole)
    if _sequence_ends(model)[3]:  # causal model: vocabulary-parallel embedding and head
        parallelize_module(model, tp_mesh, _vocab_plan(model, sp), src_data_rank=None)


def _split_adapters(
    block: nn.Module, tp_mesh, whole: dict[str, tuple[nn.Parameter, nn.Parameter]]
) -> None:
    """LoRA adapters split with their linear (:class:`~vfm_core.models.lora.LoRALinear`):
    column-parallel (W and B by rows, as ``ColwiseParallel`` left them) keeps A whole on every
    rank, row-parallel (W by columns) splits A by columns and keeps B whole (``whole``: A and B
    before the plan). The whole pieces are plain tensors whose gradients are partial sums over
    the TP group (:func:`_tp_partial_grads`)."""
    for name, (a, b) in whole.items():
        module = block.get_submodule(name)
        if module.weight.placements[0] == Shard(0):  # column-parallel
            module.register_parameter("lora_a", a)
        else:  # row-parallel
            split = distribute_tensor(a, tp_mesh, [Shard(1)], src_data_rank=None)
            module.register_parameter("lora_a", nn.Parameter(split, a.requires_grad))
            module.register_parameter("lora_b", b)


def _context_parallel_attention(model: nn.Module, dims: ParallelDims, cp_mode: CPMode) -> None:
    """Self-attention cores become ring / all-to-all over the cp group (the layout swaps the
    core; the replaced one stays its local kernel): full (and causal) attention by ``cp_mode``,
    spatial / temporal groups all-to-all under ``hybrid``."""
    for block in model.blocks.values():
        for attn in block.self_attn:
            attn.core = ContextParallelAttention(dims.group("cp"), cp_mode, local=attn.core)


def _tp_partial_grads(
    model: nn.Module, dims: ParallelDims, sp: bool, plain_before_tp: set[str]
) -> tuple[dist.ProcessGroup, list[str]]:
    """(tp group, names) of the parameters TP left whole whose gradients are partial sums over
    the group: every one under SP (each rank saw its sequence chunk), else the QK norms."""
    unsharded = [n for n, p in model.named_parameters() if not isinstance(p, DTensor)]
    unsharded = [n for n in unsharded if n in plain_before_tp]
    if not sp:  # adapters' whole pieces: each rank's part of the linear's input or output
        keep = (".q_norm.", ".k_norm.", ".lora_a", ".lora_b")
        unsharded = [n for n in unsharded if any(k in n for k in keep)]
    return dims.group("tp"), unsharded


def _fully_shard(
    model: nn.Module,
    dims: ParallelDims,
    *,
    fsdp_unit: str,
    selective: bool,
    mp: MixedPrecisionPolicy,
) -> None:
    """FSDP2 over the data-parallel x context-parallel ranks (HSDP when dp_replicate > 1), the
    ``fsdp_unit`` modules first, then the root; with CP, gradients divided by dp only."""
    fsdp_mesh = dims.fsdp_mesh()
    fsdp_unit = _fsdp_unit(fsdp_unit, fsdp_mesh.device_type, selective)
    for unit in fsdp_units(model, fsdp_unit):
        fully_shard(unit, mesh=fsdp_mesh, mp_policy=mp)
    # the root's own parameters (embedding, output layer, conditioning) stay gathered through
    # the step by default; with sub-layer units they are resharded after the forward too
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=fsdp_unit != "block")
    for module in model.modules():
        if isinstance(module, FSDPModule) and dims.cp_enabled:
            module.set_gradient_divide_factor(float(dims.dp))
            if fsdp_mesh.device_type == "cpu":  # gloo has no PREMUL_SUM: sum, then divide
                module.set_force_sum_reduction_for_comms(True)


@torch.no_grad()
def sync_grads(model: nn.Module) -> None:
    """Sum the partial gradients of a parallelized model over its CP / TP groups (one coalesced
    all-reduce per group). A no-op for models without sequence chunks."""
    sync: GradSync | None = getattr(model, "vfm_grad_sync", None)
    if sync is None:
        return
    params = dict(model.named_parameters())
    for group, names in sync.groups:
        grads = [params[n].grad for n in names if params[n].grad is not None]
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        if not local:
            continue
        flat = torch.cat([t.reshape(-1) for t in local])
        dist.all_reduce(flat, group=group)
        offset = 0
        for t in local:
            t.copy_(flat[offset : offset + t.numel()].view_as(t))
            offset += t.numel()
