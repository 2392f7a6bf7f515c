"""``vfm plan --check``'s traced training step (``vfm_core.train.step_check``): one real step of
the real model under fake tensors and a fake process group, measured by PyTorch's memory
tracker.

* at the real width, depth and sequence length (dit-7b, 8k tokens under CP2; 74k tokens under
  TP4 + SP x CP4 with selective recompute) the traced peak and its activations equal the
  planner's memory model within 10%;
* ``vfm plan --check --json`` carries activations, FSDP buffers and the peak, measured and
  planned; a layout whose traced peak does not fit is reported naming the component furthest
  above its plan (exit 1);
* under FSDP on this CPU a rank holds its share plus a sub-layer gathered (dit-7b at depth 2
  on 4 ranks: well under half one process's peak; whole-block units hold ~0.52x);
* a pipeline stage holds its receive buffers for the microbatches in flight only;
* the same step runs for real on a device under the same fake group (``--on-gpu``): on this CPU
  it trains (every parameter moves); on a GPU its allocator's peak is within 15% of the trace at
  dit-7b's width (``gpu`` marker);
* bad requests are one line, exit 2, nothing on stdout.

Every case runs in the test's own process, which holds no process group (the trace makes a fake
one for its duration and needs none before: ``_no_process_group``); the CLI is called as
``vfm_core.cli.main`` (its subprocess form, a user's command line: tests/perf/test_memory_check.py).
A subprocess per case paid the package's imports again each time (~10 s of a loaded CI core).
"""

from __future__ import annotations

import json

import pytest

from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides
from vfm_core.perf.memory import rank_params
from vfm_core.recipes import get_recipe
from vfm_core.train.step_check import device_step, measure_step

GiB = 2**30


@pytest.fixture(autouse=True)
def _no_process_group():
    """The trace makes its own fake process group and refuses to start inside another: a group
    an earlier test of this process left (tests/train/test_gpu_step.py's one-rank group, on a
    GPU machine) is ended first."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _fsdp_peaks() -> dict[str, float]:
    small = [
        "model.depth=2",
        "data.latent_frames=1",
        "data.latent_height=8",
        "data.latent_width=8",
        "data.batch_size=4",
    ]
    out = {}
    for name, world, extra in (
        ("one", 1, []),
        ("sublayer", 4, ["parallel.fsdp_unit=sublayer"]),
        ("block", 4, ["parallel.fsdp_unit=block"]),
    ):
        cfg = apply_overrides(get_recipe("dit-7b"), [*small, *extra, f"parallel.dp_shard={world}"])
        out[name] = measure_step(cfg, world, seq_len=None, as_gpu=False).peak
    return out


def _pipeline_components() -> dict:
    out: dict = {}
    for m in (4, 8):
        cfg = apply_overrides(
            get_recipe("dit-tiny"),
            [
                "model.depth=4",
                "data.latent_frames=4",
                "data.latent_height=32",
                "data.latent_width=32",
                f"data.batch_size={2 * m}",
                "parallel.pp=4",
                "parallel.dp_shard=2",
                f"parallel.pp_microbatches={m}",
            ],
        )
        out[str(m)] = measure_step(cfg, 8, seq_len=None, as_gpu=False).components
    out["params"] = rank_params(cfg.model, pp=4, rank=0)
    return out


def _vfm(capsys, *args: str) -> tuple[int, str, str]:
    """``vfm *args`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    code = vfm_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("seq", "fixed"),
    [
        (8192, "tp=1,cp=2,pp=1,micro_batch=1"),
        (73728, "tp=4,sp=true,cp=4,pp=1,micro_batch=1,recompute=selective"),
    ],
    ids=["cp2", "tp4-sp-cp4-selective"],
)
def test_the_traced_step_matches_the_planner_at_real_shapes(seq, fixed, capsys):
    """dit-7b at its real width, depth and sequence (Table 1's rows 1 and 2, one sample per
    microbatch): the peak and the activations at the peak within 10% of the planner's."""
    code, out, err = _vfm(
        capsys,
        *f"plan --check --json --recipe dit-7b --seq {seq} --gpus 64 --fixed {fixed}".split(),
    )
    assert code == 0, err[-2000:]
    rep = json.loads(out)
    for key in ("peak", "activations"):
        assert abs(rep[key]["rel_diff"]) <= 0.10, (key, rep[key])
    assert rep["fits"] and rep["peak"]["measured_bytes"] > 20 * GiB


@pytest.mark.slow
def test_check_reports_activations_and_peak_and_names_an_overflow(capsys):
    args = "plan --check --json --recipe dit-tiny --seq 256 --gpus 4 --fixed cp=2".split()
    code, out, err = _vfm(capsys, *args)
    assert code == 0, err[-2000:]
    rep = json.loads(out)
    for key in ("states", "activations", "fsdp_buffers", "transient", "peak"):
        assert set(rep[key]) == {"measured_bytes", "planned_bytes", "rel_diff"}
    assert rep["activations"]["measured_bytes"] > 0 and rep["fits"] is True
    assert rep["peak"]["measured_bytes"] >= rep["activations"]["measured_bytes"]
    assert rep["traced"]["pp_rank"] == 0 and rep["traced"]["check_rss_bytes"] > 0
    # 131k tokens on one GPU without recompute: the activations alone pass 80 GB
    code, out, err = _vfm(
        capsys,
        *"plan --check --recipe dit-7b --seq 131072 --gpus 1 --set model.depth=2".split(),
        "--fixed",
        "tp=1,cp=1,pp=1,recompute=none,micro_batch=1",
    )
    assert code == 1, err[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("does not fit: peak + 4.0 GiB overhead = ")
    assert "; activations take the most (" in last


@pytest.mark.slow
def test_a_fsdp_rank_holds_its_share_plus_a_sublayer():
    """dit-7b at its real width, depth 2, 4 ranks on this CPU (fp32, traced)."""
    peak = _fsdp_peaks()
    assert peak["sublayer"] < 0.40 * peak["one"], peak  # 0.37 measured; a quarter is the share
    assert peak["block"] > peak["sublayer"], peak  # whole blocks: 0.52x


@pytest.mark.slow
def test_a_pipeline_stage_holds_receive_buffers_only_for_microbatches_in_flight():
    """1F1B over 4 stages x FSDP over 2, 4 then 8 microbatches: pipeline rank 0's activations at
    the peak grow by the extra microbatches' inputs (latents, caption: 0.8 streams for four),
    not by a received gradient per microbatch (torch's PipelineStage keeps one per microbatch
    all step: 4.8 streams more); the stage's gradients, kept unsharded in fp32 across the
    microbatches, are counted as such at the peak (not as transient tensors)."""
    out = _pipeline_components()
    stream = 4 * 16 * 16 * 256 * 4  # a microbatch's hidden stream: tokens x hidden, fp32
    assert out["8"]["activations"] - out["4"]["activations"] < stream, out
    assert out["8"]["grads"] >= 4 * out["params"], out  # fp32, unsharded over dp_shard


def test_an_unknown_recipe_is_one_line(capsys):
    code, out, err = _vfm(
        capsys, "plan", "--check", "--recipe", "dit-huge", "--seq", "1024", "--gpus", "8"
    )
    assert code == 2, err[-2000:]
    assert out == "" and "dit-huge" in err
    assert len(err.strip().splitlines()) == 1, err


def test_the_step_runs_for_real_under_the_fake_group_on_this_cpu():
    """rank 0 of a CP2 x FSDP2 layout: real tensors, real kernels, collectives that move nothing."""
    cfg = apply_overrides(get_recipe("dit-tiny"), ["parallel.cp=2", "data.batch_size=4"])
    step = device_step(cfg, 4, seq_len=256, device="cpu", steps=1)
    assert step.device == "cpu" and step.seconds > 0
    assert step.peak_allocated is None and step.peak_reserved is None  # no allocator to read


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ("--on-gpu", "add --check"),
        ("--check --on-gpu", "no CUDA GPU"),
    ],
)
def test_on_gpu_without_check_or_gpu_is_one_line(capsys, args, needle):
    import torch

    if torch.cuda.is_available() and "--check" in args:
        pytest.skip("this machine has a GPU")
    code, out, err = _vfm(
        capsys, *f"plan --recipe dit-tiny --seq 256 --gpus 4 --fixed cp=2 {args}".split()
    )
    assert code == 2 and out == "" and needle in err, err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.gpu
def test_the_step_on_a_gpu_peaks_where_the_trace_says(capsys):
    """dit-7b at its real width, 2 blocks, 8k tokens under CP2 x FSDP: pipeline rank 0's step on
    this GPU (bf16, flash attention, cuBLAS) against the same step traced under fake tensors."""
    args = "plan --check --on-gpu --json --recipe dit-7b --seq 8192 --gpus 64 --set model.depth=2"
    code, out, err = _vfm(capsys, *args.split(), "--fixed", "tp=1,cp=2,pp=1,micro_batch=1")
    assert code == 0, err[-2000:]
    rep = json.loads(out)
    traced, real = rep["peak"]["measured_bytes"], rep["on_gpu"]["peak_allocated_bytes"]
    assert abs(real - traced) / traced < 0.15, (real, traced)
    assert rep["on_gpu"]["peak_reserved_bytes"] >= real and rep["on_gpu"]["seconds"] > 0
