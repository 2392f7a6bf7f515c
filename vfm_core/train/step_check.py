"""``vfm plan --check``: one real training step per rank, traced before the cluster is rented.

The run is built exactly as the trainer builds it (:class:`~vfm_core.train.trainer.Trainer`:
meta device -> pipeline stages -> TP / CP / FSDP2 -> materialised shards) inside a fake process
group of the layout's world size (``torch.testing._internal.distributed.fake_pg``: collectives
do nothing) and under ``FakeTensorMode`` (tensors carry shape, dtype and device, no memory), on
the rank with a given pipeline coordinate (all others 0). Then the trainer's own step runs on a
batch of the real sample shape — the objective's microbatches, forward and backward of each
under the layout's recompute and pipeline schedule, gradients made final and clipped, AdamW,
EMA — while PyTorch's memory tracker (``torch.distributed._tools``: ``FSDPMemTracker`` for an
FSDP model, ``MemTracker`` otherwise; torchtitan's memory estimation works the same way) records
every tensor's bytes by kind. The optimizer's moments exist before the traced step (a first
update on zero gradients creates them), so the peak is a steady-state step's.

The run traces as it trains on a GPU: ``train.dtype=bfloat16`` (FSDP gathers bf16 parameters and
reduces fp32 gradients; bf16 autocast), and the fused kernels save what the GPU's do (flash
attention: q, k, v, output, log-sum-exp; fused RMSNorm: input and rstd). What the GPU adds on
top — CUDA context, NCCL buffers, allocator slack — is not traced; the planner's fixed
``overhead`` covers it.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.distributed.tensor import DTensor

from vfm_core.config import Config, ConfigError
from vfm_core.data.samples import TrainBatch
from vfm_core.perf.memory_check import fake_world

COMPONENTS = ("params", "grads", "optimizer", "ema", "gathered", "activations", "temp")
"""What the peak holds: sharded parameters, gradients (sharded and while unsharded), AdamW
moments, the EMA, FSDP's gathered parameters and collective buffers, the tensors autograd keeps
for backward (and the step's inputs), and transient tensors of the backward / optimizer."""

_KINDS = {  # the memory trackers' categories -> COMPONENTS
    "Parameter": "params",
    "Sharded Param": "params",
    "Buffer": "params",
    "Gradient": "grads",
    "Sharded Grad": "grads",
    "Unsharded Grad": "grads",
    "Reduce Scatter": "grads",
    "Optstate": "optimizer",
    "OptState": "optimizer",
    "Other": "ema",
    "Unsharded Param": "gathered",
    "All Gather": "gathered",
    "Activation": "activations",
    "Inputs": "activations",
    "Temp": "temp",
}


@dataclasses.dataclass(kw_only=True, slots=True)
class StepPeak:
    """Bytes one rank holds at the peak of a traced step, by component, and the peak itself."""

    pp_rank: int
    components: dict[str, float]
    """:data:`COMPONENTS` -> bytes at the moment of the peak."""
    peak: float
    """Total bytes at the peak (the sum of the components)."""


def check_config(run: Config, seq_len: int | None, *, as_gpu: bool = True) -> Config:
    """The run as the check traces it: synthetic samples (their values do not change memory) of
    ``seq_len`` tokens on the planner's grid (:func:`~vfm_core.geometry.default_grid`; None:
    the run's own latent grid); ``as_gpu``: the GPU's precision (bf16) and FSDP unit, else the
    run's own settings on this CPU; and, without a pipeline, two microbatches of the layout's
    size instead of all of them — every microbatch after the first holds the same (the first has
    no gradients yet), so the peak is the same and the trace is shorter; a pipeline keeps its
    schedule over 2·pp microbatches of its size (a multiple of pp, as the schedules need): the
    first stage holds its most activations once the warm-up is done (1F1B: pp in flight;
    interleaved: (v-1)·pp + 2·(pp-1) + 1 chunks for every m that is a multiple of pp), and its
    receive buffers live only while their microbatch is in flight
    (:class:`~vfm_core.parallel.lean_stage.LeanStage`; torch's own stage keeps one per
    microbatch all step, which a shortened schedule would hide)."""
    from vfm_core.geometry import default_grid

    data = dataclasses.replace(run.data, source="synthetic", tokenizer=None)
    if seq_len is not None:
        t, h, w = default_grid(seq_len)
        pt, ph, pw = run.model.patch
        data = dataclasses.replace(
            data, latent_frames=t * pt, latent_height=h * ph, latent_width=w * pw
        )
    train = dataclasses.replace(run.train, device="cpu", compile="off")
    parallel = run.parallel
    if as_gpu:
        train = dataclasses.replace(train, dtype="bfloat16")
        if parallel.fsdp_unit == "auto":  # what ``auto`` picks on a GPU
            parallel = dataclasses.replace(parallel, fsdp_unit="block")
    if run.parallel.pp == 1 and run.train.grad_accum > 2:
        micro = run.data.batch_size // run.train.grad_accum  # samples per microbatch, all dp
        data = dataclasses.replace(data, batch_size=2 * micro)
        train = dataclasses.replace(train, grad_accum=2)
    m, pp = parallel.pp_microbatches, parallel.pp
    if pp > 1 and m > 2 * pp and m % pp == 0:  # the schedule's warm-up fills the peak by then
        micro = run.data.batch_size // (m * run.train.grad_accum)  # samples per microbatch
        data = dataclasses.replace(data, batch_size=2 * pp * micro * run.train.grad_accum)
        parallel = dataclasses.replace(parallel, pp_microbatches=2 * pp)
    return dataclasses.replace(run, data=data, train=train, parallel=parallel)


@dataclasses.dataclass(kw_only=True, slots=True)
class DeviceStep:
    """One rank's training step run for real on this machine's device (:func:`device_step`)."""

    device: str
    peak_allocated: float | None
    """Bytes the caching allocator handed out at the step's peak (CUDA; None on a CPU)."""
    peak_reserved: float | None
    """Bytes the allocator held from the device at that time (CUDA; None on a CPU)."""
    seconds: float
    """Wall seconds of the last step (the earlier ones warm up kernels and autotuning)."""


def measure_step(
    run: Config, world: int, *, seq_len: int | None, pp_rank: int = 0, as_gpu: bool = True
) -> StepPeak:
    """Trace one training step of ``run`` (a config of the layout to check, ``data.batch_size``
    its global batch) at ``seq_len`` tokens per sample (:func:`check_config`) on the rank with
    pipeline coordinate ``pp_rank`` of ``world`` ranks."""
    from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC2701

    run = check_config(run, seq_len, as_gpu=as_gpu)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with _rank_trainer(run, world, pp_rank, tensors=fake) as (trainer, batch):
        tracker = _tracker(trainer)
        with tracker:
            _one_step(trainer, batch)
        snapshot = tracker.get_tracker_snapshot("peak")
    return _peak(snapshot, pp_rank)


def device_step(
    run: Config, world: int, *, seq_len: int | None, device: str = "cuda", steps: int = 3
) -> DeviceStep:
    """The step :func:`measure_step` traces, run for real on ``device``: pipeline rank 0's
    shards, activations and buffers allocated on this one device, its kernels run (flash
    attention, cuBLAS, their workspaces), inside the same fake process group of ``world``
    ranks — the collectives move nothing, their buffers are still allocated, so the memory is
    the rank's and the values are not. ``steps`` steps after the optimizer's moments exist; the
    peak is the allocator's over all of them, the time the last one's (no communication)."""
    import time

    run = check_config(run, seq_len, as_gpu=True)
    run = dataclasses.replace(run, train=dataclasses.replace(run.train, device=device))
    cuda = torch.device(device).type == "cuda"
    with _rank_trainer(run, world, 0) as (trainer, batch):
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        seconds = 0.0
        for _ in range(steps):
            t0 = time.perf_counter()
            _one_step(trainer, batch)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
        allocated = float(torch.cuda.max_memory_allocated()) if cuda else None
        reserved = float(torch.cuda.max_memory_reserved()) if cuda else None
    return DeviceStep(
        device=device, peak_allocated=allocated, peak_reserved=reserved, seconds=seconds
    )


@contextlib.contextmanager
def _rank_trainer(run: Config, world: int, pp_rank: int, *, tensors=None):
    """(the trainer of the rank with pipeline coordinate ``pp_rank`` built inside a fake process
    group of ``world`` ranks, a batch of the run's shape) with AdamW's moments created;
    ``tensors``: the mode the tensors are made in (fake tensors for the trace, else real: None)."""
    from vfm_core.families.sources import make_source
    from vfm_core.train.trainer import Trainer

    pt, ph, pw = run.model.patch  # one real sample of one patch: the batch's fields and dtypes
    tiny = dataclasses.replace(
        run.data, batch_size=1, latent_frames=pt, latent_height=ph, latent_width=pw
    )
    source = make_source(tiny, run.model)
    sample = source.next_batch()
    grid = (run.data.latent_frames, run.data.latent_height, run.data.latent_width)
    mode = tensors or contextlib.nullcontext()
    with fake_world(pp_rank * (world // run.parallel.pp), world), mode:
        trainer = Trainer(run, source=source)
        batch = _batch_like(sample, trainer.local_batch_size, grid)
        if trainer.layout.pipe is not None:
            _static_pipeline(trainer, batch)
        _create_optimizer_state(trainer)
        yield trainer, batch


def _one_step(trainer, batch: TrainBatch) -> None:
    """The trainer's step without its bookkeeping: forward + backward of every microbatch,
    gradients made final and clipped, AdamW, EMA."""
    total = trainer.forward_backward(batch, weight=trainer.dims.dp / trainer.cfg.data.batch_size)
    trainer.final_grads(total)
    trainer.update(1.0)


def _batch_like(sample: TrainBatch, n: int, grid: tuple[int, int, int]) -> TrainBatch:
    """``n`` samples shaped like ``sample`` but of the latent ``grid`` (its last three dims), as
    fake tensors (no memory); the caption lengths real (whole captions), so code that reads them
    sees values."""
    if sample.packed:
        raise ConfigError("vfm plan --check traces unpacked batches (data.packing=false)")

    def like(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.zeros((n, *shape), dtype=t.dtype)

    values = sample.values
    return TrainBatch(
        values=like(values, (*values.shape[1:-3], *grid)),
        text=like(sample.text, tuple(sample.text.shape[1:])),
        text_lengths=torch.full((n,), sample.text.shape[1], dtype=torch.int64),
        keys=sample.keys * n,
        positions=list(range(n)),
    )


def _static_pipeline(trainer, batch: TrainBatch) -> None:
    """Give this rank's pipeline stages their input / output shapes and make the schedule run
    with them (static shapes, as in training every microbatch has the same). Left to itself,
    the schedule's first step votes over P2P on static vs dynamic shapes and exchanges the
    inferred shapes between the ranks, reading both on the host: a fake process group delivers
    nothing and a fake tensor has no value. The shapes come from one untracked forward of this
    rank's first stage; this rank's other stages (interleaved) take and give the same hidden
    stream (the last stage, the only one with another output, is never on pipeline rank 0)."""
    from torch.distributed.pipelining._utils import InferenceMode, _StageMeta, extract_tensor_metas  # noqa: PLC2701

    pipe = trainer.layout.pipe
    if pipe.last:
        raise ConfigError("vfm plan --check traces pipeline rank 0, which holds no last stage")
    mbs = trainer.objective.microbatches(batch, step=0, weight=1.0, splits=trainer.splits(batch))
    pipe.current = mbs[: pipe.microbatches]
    first = mbs[0].inputs
    index = torch.zeros(1, dtype=torch.int64)
    cast, _ = trainer.autocast()
    with torch.no_grad(), cast:
        out = pipe.parts[0](first, index)  # (hidden stream, microbatch index)
    pipe.current = []
    hidden, index_out = out
    stream = extract_tensor_metas((hidden.detach().requires_grad_(), index_out))  # trains
    for stage in pipe.stages:
        inputs = extract_tensor_metas((first, index)) if stage.is_first else stream
        stage._user_meta = _StageMeta(inputs=inputs, outputs=stream)

    def vote(stages, _has_backward, _p2p_done) -> None:
        for stage in stages:
            stage._inference_mode = InferenceMode.STATIC

    pipe.schedule._warmup_p2p = vote


def _create_optimizer_state(trainer) -> None:
    """AdamW creates its moments at the first update: one update on zero gradients, untracked,
    so the traced step is a steady-state one."""
    for _, p in trainer.layout.named_parameters():
        p.grad = torch.zeros_like(p)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)


def _tracker(trainer):
    """PyTorch's MemTracker over the parts, the optimizer and the EMA ('Other')."""
    from torch.distributed._tools.mem_tracker import MemTracker  # noqa: PLC2701

    parts = trainer.layout.parts

    class StepTracker(MemTracker):
        """MemTracker takes a model's second forward for a new iteration and stops; in one step
        the model runs once per microbatch (gradient accumulation, pipeline schedules). A part's
        forward outside backward starts fresh statistics for that part alone (the backward of
        an earlier microbatch, or of another stage, still finds its modules'); the peak is
        kept."""

        def _pre_fw_hook(self, module, inputs) -> None:
            if any(module is part for part in parts) and not self._mod_tracker.is_bw:
                self.memory_tracking.pop(module, None)
            super()._pre_fw_hook(module, inputs)

        def _update_peak_stats(self, peak_state) -> None:
            """The device's peak only: MemTracker also walks every module's statistics after
            every op (quadratic in depth: a 32-block model's step took minutes). FSDP's
            unsharded gradients (kept across a pipeline's microbatches), which MemTracker files
            under 'Temp', are counted apart at the peak."""
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)
                    unsharded = min(_unsharded_grad_bytes(fsdp_params), snap.get("Temp", 0))
                    if unsharded:
                        self._peak_mem_snap[dev]["Temp"] -= unsharded
                        self._peak_mem_snap[dev]["Unsharded Grad"] = unsharded

    fsdp_params = _fsdp_params(parts)
    tracker = StepTracker()
    tracker.track_external(*parts, trainer.optimizer)
    if trainer.ema is not None:
        shadow = [t for part in trainer.ema.shadow for t in part.values()]
        tracker.track_external(*(t.to_local() if isinstance(t, DTensor) else t for t in shadow))
    return tracker


def _fsdp_params(parts) -> list:
    """FSDP2's per-parameter records in ``parts`` (each holds the unsharded gradient)."""
    from torch.distributed.fsdp import FSDPModule

    out = []
    for part in parts:
        for module in part.modules():
            if isinstance(module, FSDPModule):
                group = module._get_fsdp_state()._fsdp_param_group
                out.extend(group.fsdp_params if group is not None else ())
    return out


def _unsharded_grad_bytes(fsdp_params: list) -> int:
    """Bytes of the gradients FSDP2 holds unsharded (accumulated across microbatches without
    a reduce-scatter, or just produced by the backward)."""
    seen: dict[int, tuple[torch.Tensor, int]] = {}  # the tensors kept: their ids stay theirs
    for fsdp_param in fsdp_params:
        param = getattr(fsdp_param, "_unsharded_param", None)
        for grad in (fsdp_param.unsharded_accumulated_grad, getattr(param, "grad", None)):
            if isinstance(grad, DTensor):  # FSDP over TP: its tensor-parallel shard
                grad = grad.to_local()
            if grad is not None:
                seen[id(grad)] = (grad, grad.untyped_storage().nbytes())
    return sum(nbytes for _, nbytes in seen.values())


def _peak(snapshot: dict, pp_rank: int) -> StepPeak:
    components = dict.fromkeys(COMPONENTS, 0.0)
    peak = 0.0
    for kinds in snapshot.values():  # one device
        for kind, nbytes in kinds.items():
            if kind == "Total":
                peak += float(nbytes)
            else:
                components[_KINDS.get(kind, "temp")] += float(nbytes)
    return StepPeak(pp_rank=pp_rank, components=components, peak=peak)


def peak_rows(traced: StepPeak, states, planned) -> dict[str, dict[str, float]]:
    """Measured vs planned bytes of the traced rank's step, by what the planner models:
    ``states`` (the rank's shards of parameters, gradients, AdamW moments, EMA: ``states``),
    ``fsdp_buffers`` (gathered parameters and gradients while unsharded: the traced parameter
    and gradient bytes above the rank's shards), ``activations``, ``transient``
    (backward / optimizer temporaries: not modelled, planned 0) and ``peak`` (planned: the
    planner's total without its fixed ``overhead``). ``planned``: the planner's
    :class:`~vfm_core.perf.memory.MemoryEstimate`."""
    from vfm_core.perf.memory import GiB
    from vfm_core.perf.memory_check import report_row

    c = traced.components
    unsharded = max(0.0, c["params"] - states.params) + max(0.0, c["grads"] - states.grads)
    planned_states = planned.params_gib + planned.grads_gib + planned.optimizer_gib
    planned_states += planned.ema_gib
    return {
        "states": report_row(states.total, planned_states * GiB),
        "fsdp_buffers": report_row(unsharded + c["gathered"], planned.fsdp_buffers_gib * GiB),
        "activations": report_row(c["activations"], planned.activations_gib * GiB),
        "transient": report_row(c["temp"], 0.0),
        "peak": report_row(traced.peak, (planned.total_gib - planned.overhead_gib) * GiB),
    }


def fit_verdict(rows: dict[str, dict[str, float]], planned, hardware: str) -> tuple[bool, str]:
    """(fits, one line): the measured peak plus the planner's fixed overhead against the GPU's
    usable memory; when it does not fit, the component that takes the most of the peak is named
    with its plan."""
    from vfm_core.perf.memory import GiB

    need = rows["peak"]["measured_bytes"] / GiB + planned.overhead_gib
    cap = planned.capacity_gib
    if need <= cap:
        return True, (
            f"fits: peak + {planned.overhead_gib:.1f} GiB overhead = {need:.1f} of {cap:.1f} "
            f"GiB usable on {hardware}"
        )
    parts = {k: v for k, v in rows.items() if k != "peak"}
    name = max(parts, key=lambda k: parts[k]["measured_bytes"])
    row = parts[name]
    return False, (
        f"does not fit: peak + {planned.overhead_gib:.1f} GiB overhead = {need:.1f} GiB > "
        f"{cap:.1f} GiB usable on {hardware}; {name.replace('_', ' ')} take the most "
        f"({row['measured_bytes'] / GiB:.1f} GiB measured, {row['planned_bytes'] / GiB:.1f} "
        "planned)"
    )
