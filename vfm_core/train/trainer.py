"""The one trainer: every parallel layout, both model families and one process alike, one loop.

A run is a config; the layout (``parallel.*``) is data. One process is the world-size-1 case of
the same code: :func:`~vfm_core.parallel.world.init_world` gives it a one-rank process group, the
layout is applied from outside (:func:`~vfm_core.parallel.apply.apply_layout`: the model built on
the meta device, cut into pipeline stages, parallelised, then materialised sharded), and every
collective below is an identity over one rank. ``data.batch_size`` is the global batch, so
``vfm train`` and ``vfm train --nproc N --tp/--cp/--pp/--dp-shard ...`` train on the same samples
with the same draws and give the same loss at every step.

The family is an object (:func:`vfm_core.families.family_of`) that gives the objective. One
step, in order (:meth:`Trainer.train_step`):

1. this rank's data-parallel slice of the global batch (``batch_size / dp`` samples, or packs;
   the shard loader hands it out directly, read 1/k per model-parallel rank and all-gathered);
2. the objective's counter-based draws (keyed by step and global sample position, paper
   Table 3) and model inputs, cut into microbatches (``train.grad_accum`` passes, each split into
   the pipeline's microbatches; one per pack), each weighted as its share of the global mean
   (one all-reduce of the step's sample count);
3. forward + backward of every microbatch: the whole model (TP/SP, CP, FSDP2 inside), or the
   pipeline schedule over this rank's stages;
4. gradients made final (TP/SP partial sums, pipeline conditioning replicas);
5. the logged loss is the global-batch mean; a non-finite one stops before any update;
6. global gradient-norm clip over all meshes -> AdamW -> LR schedule -> EMA (sharded like the
   parameters).

Everything that changes during training (weights, EMA, optimizer, schedule, step, data position)
is in :meth:`Trainer.state_dict`, keyed by the one-process model's parameter names; the draws
need no state (they are functions of the step).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import resource
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from vfm_core.config import Config, ConfigError, to_dict
from vfm_core.data.samples import LatentSource, TrainBatch
from vfm_core.families import build_model, family_of
from vfm_core.families.sources import make_source
from vfm_core.launch.preempt import Preempted, StopRequest
from vfm_core.models.dit import count_params
from vfm_core.models.fp8 import fp8_autocast, resolve_fp8
from vfm_core.models.local_attention import set_attention_backend
from vfm_core.models.te_adapter import resolve_attention_backend
from vfm_core.parallel.apply import apply_layout
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.layout import pipeline_microbatches, validate_layout
from vfm_core.parallel.world import init_world, local_tensor
from vfm_core.perf.cpu_memory import hold_freed_memory
from vfm_core.perf.flops import train_flops, train_flops_per_token
from vfm_core.perf.hardware import peak_at_least, peak_flops, recheck_cpu_peak
from vfm_core.rng import StepRNG
from vfm_core.train.ema import EMA
from vfm_core.train.errors import TrainingDiverged
from vfm_core.train.optim import (
    build_optimizer,
    load_optimizer_state,
    optimizer_state,
    restore_schedule,
)

__all__ = ["Trainer", "TrainingDiverged", "resolve_device"]

log = logging.getLogger(__name__)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB


def training_source(cfg: Config, dims: ParallelDims) -> tuple[LatentSource, bool]:
    """(source, local): ``data.source: shards`` yields this rank's data-parallel slice directly
    (``batch_size / dp`` samples; the model-parallel ranks of a slice each read 1/k and
    all-gather). The synthetic source yields the global batch; each rank slices its part."""
    sigma_data = cfg.diffusion.sigma_data
    if cfg.data.source != "shards":
        return make_source(cfg.data, cfg.model, sigma_data=sigma_data), False
    local = dataclasses.replace(cfg.data, batch_size=cfg.data.batch_size // dims.dp)
    src = make_source(
        local,
        cfg.model,
        sigma_data=sigma_data,
        dp_rank=dims.dp_rank(),
        dp_size=dims.dp,
        mp_group=dims.model_parallel_group(),
    )
    return src, True


class Trainer:
    """Trains ``cfg`` on this rank's part of its layout (module docstring). ``source``: a latent
    source yielding the global batch (tests); default from ``data.source``."""

    def __init__(self, cfg: Config, *, source: LatentSource | None = None):
        self.device = resolve_device(cfg.train.device)
        init_world(self.device)
        if self.device.type == "cpu":  # each step's memory stays mapped (perf.cpu_memory)
            hold_freed_memory()
        self.world = dist.get_world_size()
        self.dims = dims = validate_layout(cfg, self.world)
        dims.build_mesh(self.device.type)
        self.cfg = cfg
        backend, self.attn_backend_reason = resolve_attention_backend(cfg.model.attn_backend)
        self.fp8, self.fp8_reason = resolve_fp8(
            cfg.train.fp8, tp=dims.tp, lora=cfg.train.lora.rank > 0
        )
        self.params = count_params(build_model(cfg.model, device="meta"))
        d, m = cfg.data, cfg.model
        self.grid = (
            d.latent_frames // m.patch[0],
            d.latent_height // m.patch[1],
            d.latent_width // m.patch[2],
        )
        self.tokens_per_sample = math.prod(self.grid)
        self.flops_per_token = train_flops_per_token(
            m, seq_len=self.tokens_per_sample, grid=self.grid, text_len=m.text_len
        )
        self.peak_rechecked = False
        self.peak_flops, self.peak_source = peak_flops(
            self.device.type, dtype=cfg.train.dtype, width=m.hidden
        )
        self.local_batch_size = d.batch_size // dims.dp
        if source is not None:
            self.source, self.local_batches = source, False
        else:
            self.source, self.local_batches = training_source(cfg, dims)
        null = getattr(self.source, "null_text", None)  # (L, Dt) empty caption, None: zeros
        null = torch.zeros(m.text_len, m.text_dim) if null is None else null
        self.draws = StepRNG.from_dims(cfg.train.seed + 1, dims)
        self.family = family_of(cfg)
        self.objective = self.family.objective(
            cfg,
            draws=self.draws,
            device=self.device,
            local_batch=self.local_batch_size,
            null_text=null,
            null_length=int(getattr(self.source, "null_length", 1)),
            tensor_parallel=dims.tp_enabled,
        )
        self.layout = apply_layout(
            cfg,
            dims,
            device=self.device,
            loss_fn=self.objective.loss,
            fp8=self.fp8,
        )
        for part in self.layout.parts:  # every attention core's kernel
            set_attention_backend(part, backend)
        self.model = self.layout.parts[0]
        """The whole parallelised model (pp = 1), or this rank's first pipeline stage."""
        self.micro = pipeline_microbatches(cfg, dims)
        trained = [(n, p) for n, p in self.layout.named_parameters() if p.requires_grad]
        self.param_names = [name for name, _ in trained]
        """What trains (``train.trainable``, LoRA adapters; default every parameter): the
        optimizer's parameters and what a checkpoint holds."""
        params = [p for _, p in trained]
        self.optimizer, self.scheduler = build_optimizer(params, cfg.optim, cfg.train.steps)
        self.ema = EMA(self.layout.parts, cfg.train.ema_decay) if cfg.train.ema_decay else None
        self.base: str | None = None
        """The checkpoint folder the weights started from (``train.init``, set when loaded);
        a run with frozen parameters records it as its base (None: the seed's)."""
        self.step = 0
        self.step_work: tuple[float, float] = (0.0, 0.0)
        """(real tokens, training FLOPs) of the global step, for its metrics."""
        self.captions_cut = 0.0
        """Captions of all data-parallel ranks cut to ``model.text_len`` since this process
        started (sources that cut captions count them: ``source.captions_cut``)."""

    # ------------------------------------------------------------------ Stateful
    def state_dict(self) -> dict[str, Any]:
        state = {
            "model": {n: p.detach() for n, p in self.layout.named_parameters() if p.requires_grad},
            "optim": optimizer_state(self.optimizer, self.param_names),
            "ema": self.ema.state_dict() if self.ema is not None else {},
            "sched": self.scheduler.state_dict(),
            "step": self.step,
            "data": self.source.state_dict(),
        }
        self._check_same_data_state(state["data"])
        return state

    def _check_same_data_state(self, data: dict[str, Any]) -> None:
        """The loader plans globally, so every rank holds the same data state and one copy
        restores them all; check that before a checkpoint records it."""
        if self.world == 1:
            return
        raw = json.dumps(data, sort_keys=True).encode()
        digest = int.from_bytes(hashlib.blake2b(raw, digest_size=7).digest(), "little")
        both = torch.tensor([digest, -digest], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            both = both.cuda()
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if int(both[0]) != digest or int(both[1]) != -digest:
            raise RuntimeError(
                f"data state differs across ranks at step {self.step} (rank {dist.get_rank()}); "
                "one copy could not restore them all"
            )

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        weights = state["model"]
        for name, p in self.layout.named_parameters():
            if p.requires_grad and weights[name] is not p:
                local_tensor(p).copy_(local_tensor(weights[name]))
        changed = load_optimizer_state(self.optimizer, self.param_names, state["optim"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"] or weights)
        restore_schedule(self.scheduler, state["sched"])
        self.step = int(state["step"])
        for what in changed if not dist.is_initialized() or dist.get_rank() == 0 else ():
            print(f"warning: resume: {what} (applies from step {self.step + 1})", file=sys.stderr)
        self.source.load_state_dict(state["data"])

    @property
    def frozen(self) -> bool:
        """Whether some parameters do not train (LoRA, ``train.trainable``)."""
        return any(not p.requires_grad for _, p in self.layout.named_parameters())

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records besides state: the model config (to refuse mismatched
        resumes), the recipe, the layout it was saved under and the run's seed (a resume with
        another one is named)."""
        return {
            "model": to_dict(self.cfg.model),
            "trains": to_dict(self.cfg.train.lora) | {"trainable": self.cfg.train.trainable},
            "base": (self.base or "seed") if self.frozen else None,
            "recipe": self.cfg.recipe,
            "parallel": dataclasses.asdict(self.cfg.parallel),
            "seed": self.cfg.train.seed,
        }

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One optimizer step on the global batch (this rank's part of it; module docstring)."""
        batch = self.local_part(batch)
        total = self.forward_backward(batch, weight=self.step_weight(batch))
        return self.finish_step(total)

    def forward_backward(self, batch: TrainBatch, *, weight: float) -> torch.Tensor:
        """Steps 2-3 on this rank's batch: the objective's microbatches, forward + backward of
        each (the whole model, or the pipeline schedule). Returns this rank's weighted loss sum
        (zero on pipeline stages without the loss)."""
        mbs = self.objective.microbatches(
            batch, step=self.step, weight=weight, splits=self.splits(batch)
        )
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        cast, fp8 = self.autocast()
        with self.objective.context(), cast, fp8:
            if self.layout.pipe is not None:
                for i in range(0, len(mbs), self.micro):
                    loss = self.layout.pipe.run(mbs[i : i + self.micro])
                    if loss is not None:  # the rank holding the last stage
                        total += loss.double()
            else:
                for mb in mbs:
                    loss = self.objective.loss(self.model(mb.inputs, **mb.kwargs), mb)
                    loss.backward()
                    if isinstance(loss, DTensor):
                        loss = loss.full_tensor()
                    total += loss.detach().double()
        return total

    def splits(self, batch: TrainBatch) -> int:
        """Microbatches of an unpacked batch: ``grad_accum`` passes x the pipeline's
        microbatches (a short batch, the loader having skipped bad samples, runs as one pass)."""
        if batch.packed:
            return 1
        n, full = batch.n_samples, self.local_batch_size
        parts = self.cfg.train.grad_accum * max(1, self.micro)
        if n == full:
            return parts
        if self.layout.pipe is not None:
            raise ValueError(
                f"step {self.step + 1}: the loader gave {n} of {full} samples on data-parallel "
                f"rank {self.dims.dp_rank()}; the pipeline schedule needs full batches "
                "(remove the bad samples from the shards)"
            )
        log.warning(
            "step %d: %d of %d samples on dp rank %d", self.step + 1, n, full, self.dims.dp_rank()
        )
        return 1

    def local_part(self, batch: TrainBatch) -> TrainBatch:
        """This rank's data-parallel slice of a global batch, or the batch itself when the
        source already gives per-rank batches (shards)."""
        if self.local_batches or batch.packed:
            return batch
        b, r = self.local_batch_size, self.dims.dp_rank()
        return batch.rows(r * b, (r + 1) * b)

    def step_weight(self, batch: TrainBatch) -> float:
        """dp / (samples of the global step): each sample's loss weight, so that the
        data-parallel gradient average is the mean over all samples. Sets :attr:`step_work` to
        the global step's (real tokens, FLOPs)."""
        n, tokens, flops = self.batch_work(batch)
        cut = getattr(self.source, "captions_cut", 0)  # this rank's, since the process started
        counts = [float(n), float(tokens), float(flops), float(cut)]
        if self.world > 1:  # one process: no device round trip (a GPU would wait for the queue)
            sums = torch.tensor(counts, dtype=torch.float64, device=self.device)
            dist.all_reduce(sums)  # each dp slice counted once per rank of its model-parallel group
            counts = (sums / (self.world // self.dims.dp)).tolist()
        self.step_work = (counts[1], counts[2])
        self.captions_cut = counts[3]
        return self.dims.dp / counts[0]

    def batch_work(self, batch: TrainBatch) -> tuple[int, float, float]:
        """(samples, unpadded tokens, training FLOPs) of this rank's batch: packed samples each
        at its own length."""
        m = self.cfg.model
        if not batch.packed:
            n = batch.n_samples
            tokens = n * self.tokens_per_sample
            return n, tokens, tokens * self.flops_per_token
        tokens = flops = 0.0
        for layout in batch.layouts or []:
            lens = [g[0] * g[1] * g[2] for g in layout.grids]
            tokens += sum(lens)
            flops += train_flops(m, seq_lens=lens, grid=layout.grids, text_len=m.text_len)["total"]
        return batch.n_samples, tokens, flops

    def autocast(self):
        """The configured forward precision (bf16 autocast, FP8 GEMMs)."""
        dtype = torch.bfloat16 if self.cfg.train.dtype == "bfloat16" else torch.float32
        return (
            torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
            fp8_autocast(self.fp8),
        )

    def finish_step(self, total: torch.Tensor) -> dict[str, float]:
        """Gradients final -> global loss summed, gradients synchronised and clipped -> the loss
        and the norm read in one host synchronisation (on a GPU every read of a device value
        waits for the queued step) -> non-finite loss: stop before the update -> update.
        ``total``: this rank's weighted loss sum (zero on pipeline stages without the loss)."""
        grad_norm = self.final_grads(total)
        loss_sum, norm = torch.stack([total, grad_norm.detach().to(total)]).tolist()
        mean = loss_sum / (self.world // self.dims.pp)
        if not math.isfinite(mean):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"loss is {mean} at step {self.step + 1}; stopped before the update, nothing was "
                "saved from this step (lower optim.lr or check the data)"
            )
        lr = self.update(norm)
        return {"loss": mean, "grad_norm": norm, "lr": lr}

    def final_grads(self, total: torch.Tensor) -> torch.Tensor:
        """Steps 4-5 without reading a value: the loss summed over the ranks (in place), the
        gradients made final and clipped; returns the global gradient norm (a tensor)."""
        dist.all_reduce(total)  # equal within a model-parallel group: divide by its copies
        self.layout.sync_grads()
        return self.layout.clip_grad_norm(self.cfg.optim.grad_clip or float("inf"))

    def update(self, grad_norm: float) -> float:
        """Optimizer, LR schedule and EMA once the gradients are final (clipped to
        ``grad_norm``); a non-finite norm stops training before the update. Returns the LR."""
        if not math.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"gradient norm is {grad_norm} at step {self.step + 1}; stopped before the "
                "update, nothing was saved from this step"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        return lr

    # ------------------------------------------------------------------ metrics and loop
    def metrics(
        self, step_out: dict[str, float], *, step_time: float, data_time: float
    ) -> dict[str, float]:
        """Throughput of the global step (real tokens, every sample's own FLOPs); TFLOPS and MFU
        per process; with a blend of datasets, the samples drawn from each so far
        (``data/samples/<name>``); from a source that cuts captions to ``model.text_len``, the
        captions cut so far in this process (``captions_cut``)."""
        drawn = getattr(self.source, "dataset_samples", {})  # blend: over all dp ranks
        tokens_per_s = self.step_work[0] / step_time
        achieved = self.step_work[1] / step_time  # FLOP/s
        per_process = achieved / self.world
        if per_process > self.peak_flops and self.device.type == "cpu" and not self.peak_rechecked:
            self.peak_rechecked = True  # once: the start-up measurement met a busy machine
            self.peak_flops, self.peak_source = recheck_cpu_peak(
                self.peak_flops,
                self.peak_source,
                achieved=per_process,
                width=self.cfg.model.hidden,
                dtype=self.cfg.train.dtype,
            )
        self.peak_flops, self.peak_source = peak_at_least(
            self.peak_flops, self.peak_source, achieved=per_process
        )
        return {
            **step_out,
            "tokens_per_s": tokens_per_s,
            "tflops": per_process / 1e12,
            "mfu": per_process / self.peak_flops,
            "data_wait": data_time / step_time,
            "step_time": step_time,
            "peak_mem_gb": peak_memory_gb(self.device),
            **{f"data/samples/{name}": float(n) for name, n in drawn.items()},
            **({"captions_cut": self.captions_cut} if hasattr(self.source, "captions_cut") else {}),
        }

    def fit(self, *, loggers: list, checkpoint=None, stop: StopRequest | None = None) -> dict:
        """Train until ``train.steps``; log every ``log_every``; checkpoint every ``ckpt_every``
        and at the end. Returns the last logged metrics. ``stop``: a signal asked the run to
        stop (:mod:`vfm_core.launch.preempt`): the step in progress finishes on every rank, is
        checkpointed, and :class:`Preempted` is raised."""
        t = self.cfg.train
        last: dict[str, float] = {}
        while self.step < t.steps:
            t0 = time.perf_counter()
            batch = self.source.next_batch()
            t_data = time.perf_counter() - t0
            out = self.train_step(batch)
            dt = time.perf_counter() - t0
            if self.step % t.log_every == 0 or self.step == t.steps:
                last = self.metrics(out, step_time=dt, data_time=t_data)
                for lg in loggers:
                    lg.log(self.step, last)
            due = self.step % t.ckpt_every == 0 or self.step == t.steps
            signum = stop.agreed() if stop is not None else 0
            if checkpoint is not None and (due or signum):
                checkpoint(self)
            if signum:
                raise Preempted(signum, self.step)
        return last
