"""The layout a trainer runs: the model built on the ``meta`` device, cut into this rank's pipeline
stages, parallelised, then materialised sharded (torchtitan's order).

1. the family's network (:func:`~vfm_core.families.build_model`) on ``meta`` (no
   memory at any size); with FP8 its block linears become FP8 linears there
   (:func:`~vfm_core.models.fp8.to_fp8_linears`: module classes only, no data); with LoRA
   adapters are added and what does not train is frozen (:mod:`vfm_core.models.lora`);
2. pp > 1: this rank's stages (:func:`~vfm_core.parallel.pipeline.split_stage`, ``v`` of them
   with interleaving); else the whole model is the one part;
3. every part through :func:`~vfm_core.parallel.parallelize.parallelize_dit` (TP/SP -> CP ->
   activation checkpointing -> FSDP2);
4. ``to_empty`` on the device, then :func:`~vfm_core.models.init.init_parameters`: each rank
   draws exactly its shards of the seed's one initialisation, equal to the one-process model's.

No rank ever holds more than its shards (plus one parameter's rows while initialising). The
trainer gets the parts its optimizer updates, the pipeline schedule (pp > 1) and one call each
for the gradients' final sums and the global norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: PLC2701

from vfm_core.config import Config, ConfigError
from vfm_core.families import build_model
from vfm_core.models.init import init_parameters
from vfm_core.models.lora import add_adapters, freeze
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.grads import clip_grad_norm
from vfm_core.parallel.layout import pipeline_microbatches
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads
from vfm_core.parallel.pipeline import Pipeline, rank_stages, replicated, split_stage


@dataclass(kw_only=True, slots=True)
class AppliedLayout:
    """What the trainer works with after the layout was applied."""

    parts: list[nn.Module]
    """The modules the optimizer updates: ``[the parallelised model]``, or this rank's pipeline
    stages (one, or ``pp_virtual_stages`` with interleaving)."""
    pipe: Pipeline | None
    """The pipeline schedule over ``parts`` (pp > 1), else None."""
    dims: ParallelDims
    """The degrees it was applied with."""

    def named_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        """Every part's parameters under the one-process model's names (conditioning replicas of
        several local stages repeat a name)."""
        for part in self.parts:
            yield from part.named_parameters()

    def sync_grads(self) -> None:
        """Make the gradients final after the backward: TP/SP partial sums (CP and DP are summed
        inside FSDP's reduce-scatter) and, under PP, the conditioning replicas over the stages."""
        for part in self.parts:
            sync_grads(part)
        if self.pipe is not None:
            self.pipe.sync_replicas()

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm over every rank's pieces (each element counted once), clipped.
        A stage's own parameters are one of ``pp`` disjoint parts; the conditioning replicas are
        whole on every stage, ``len(parts)`` times on this rank."""
        pp, local = self.dims.pp, len(self.parts)
        shared = replicated(self.parts[0])
        return clip_grad_norm(
            self.parts,
            max_norm,
            holders=lambda name: 1 / local if name.startswith(shared) else pp,
        )


def build_parts(
    cfg: Config,
    dims: ParallelDims,
    *,
    device: torch.device | str = "meta",
    seed: int = 0,
    prepare: Callable[[nn.Module], Any] | None = None,
) -> list[nn.Module]:
    """Steps 1-3 of the module docstring: this rank's parts of ``cfg.model`` (the whole model,
    or its pipeline stages), parallelised under ``cfg.parallel``, on ``device`` (``meta``: no
    memory; the local shard shapes are already final, which ``vfm plan --check`` reads).
    ``prepare``: a conversion of the whole model before it is cut and parallelised (FP8: on
    ``meta`` it changes module classes only)."""
    p = cfg.parallel
    ac = p.activation_checkpointing and p.activation_checkpointing_mode  # False | full | selective
    bf16 = cfg.train.dtype == "bfloat16"  # FSDP gathers bf16, reduces fp32 (any device)
    model = build_model(cfg.model, device=device, seed=seed)
    if prepare is not None:  # a conversion of the whole model, before it is cut (FP8)
        prepare(model)
    if dims.pp_enabled:
        virtual = p.pp_virtual_stages
        parts = [
            split_stage(model, stage=s, stages=dims.pp * virtual)
            for s in rank_stages(dims, virtual)
        ]
    else:
        parts = [model]
    for part in parts:
        parallelize_dit(
            part,
            parallel_dims=dims,
            sequence_parallel=p.sequence_parallel,
            cp_mode=p.cp_mode,
            activation_checkpointing=ac,
            full_recompute_blocks=p.activation_checkpointing_blocks,
            compile_blocks=compile_enabled(cfg.train.compile, dims.mesh.device_type),
            fsdp_unit=p.fsdp_unit,
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
        )
    return parts


def compile_enabled(mode: str, device_type: str) -> bool:
    """``train.compile``: 'on' -> True, 'off' -> False, 'auto' -> compile on CUDA only (the
    faster choice per device: on CPU the compiled blocks measured no faster than eager, see
    :attr:`vfm_core.config.TrainConfig.compile`)."""
    return mode == "on" or (mode == "auto" and device_type == "cuda")


def _prepare(cfg: Config, fp8: bool) -> Callable[[nn.Module], Any] | None:
    """The conversion of the whole meta model before it is cut: FP8 linears, or LoRA adapters
    and the frozen parameters (``train.lora``, ``train.trainable``: module classes and
    ``requires_grad`` only, which TP, FSDP2 and the pipeline keep)."""
    lora, trainable = cfg.train.lora, cfg.train.trainable
    if fp8 and lora.rank:
        raise ConfigError("train.fp8: FP8 linears do not take LoRA adapters (train.lora.rank)")
    if fp8:
        from vfm_core.models.fp8 import to_fp8_linears

        return to_fp8_linears
    if not (lora.rank or trainable):
        return None

    def adapt(model: nn.Module) -> None:
        add_adapters(model, lora)
        freeze(model, trainable, lora=lora.rank > 0)

    return adapt


def check_conversions(cfg: Config) -> None:
    """LoRA targets, rank and ``train.trainable`` checked on the meta model (no memory), so a
    pattern that matches nothing is one line before any process starts or anything is written."""
    prepare = _prepare(cfg, fp8=False)
    if prepare is not None:
        with unset_fake_temporarily():
            prepare(build_model(cfg.model, device="meta"))


def apply_layout(
    cfg: Config,
    dims: ParallelDims,
    *,
    device: torch.device,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    fp8: bool = False,
) -> AppliedLayout:
    """Build ``cfg.model`` for this rank under ``cfg.parallel`` (degrees in ``dims``, mesh built)
    in the order of the module docstring.
    ``loss_fn(output, microbatch)``: the objective's loss, needed by the pipeline's last stage
    (pp > 1). ``fp8``: FP8 linears of this machine's backend
    (transformer-engine, else torch-native ``torch._scaled_mm``) replace the block GEMMs, on the
    meta model before it is cut: sharded and initialised like the bf16 model, the same values."""
    prepare = _prepare(cfg, fp8)
    with unset_fake_temporarily():  # meta tensors and rank bookkeeping: no values, no memory,
        # also under ``vfm plan --check``'s fake tensors (whose mesh slicing would need values)
        parts = build_parts(cfg, dims, device="meta", prepare=prepare)
    for part in parts:
        part.to_empty(device=device)
        init_parameters(part, part.init_rule, seed=cfg.train.seed)
    pipe = None
    if dims.pp_enabled:
        if loss_fn is None:
            raise ValueError("apply_layout: a pipeline (pp > 1) needs the objective's loss_fn")
        pipe = Pipeline(
            parts,
            dims=dims,
            schedule=cfg.parallel.pp_schedule,
            loss_fn=loss_fn,
            microbatches=pipeline_microbatches(cfg, dims),
            device=device,
        )
    return AppliedLayout(parts=parts, pipe=pipe, dims=dims)
