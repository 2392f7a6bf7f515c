"""benchmarks/peers.py: a tiny DiT row against a local facebookresearch/DiT checkout (where one
exists), the AR rows in bf16 autocast, and the one-line skip of every comparison whose checkout
is not given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "peers.py"
DIT_REPO = Path("/tmp/peers/facebookresearch+DiT")
NANOGPT_REPO = Path("/tmp/peers/karpathy+nanoGPT")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=REPO
    )


def run_json(*args: str) -> dict:
    """The benchmark's ``--json`` report of one tiny round (width 64) of ``args``."""
    r = run(*"--rounds 1 --warmup 0 --width 64 --json".split(), *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout[r.stdout.index("{") :])


def test_skips_each_comparison_without_its_checkout_in_one_line():
    r = run("--only", "ar")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["skipped: AR vs karpathy/nanoGPT (no --nanogpt-repo)"]


def test_tiny_dit_row_against_the_reference_checkout():
    if not (DIT_REPO / "models.py").is_file():
        pytest.skip(f"no facebookresearch/DiT checkout at {DIT_REPO}")
    out = run_json("--steps", "1", "--only", "dit", "--dit-repo", str(DIT_REPO))
    rows = {row["row"]: row for row in out["rows"]}
    assert set(rows) == {
        "DiT plain loop, recipe",
        "DiT plain loop, recipe pooled",
        "DiT plain loop, matched",
        "DiT plain loop, matched + 3D RoPE",
        "DiT trainer vs peer loop, recipe",
        "DiT trainer vs peer loop, recipe pooled",
        "DiT trainer vs peer loop, matched",
        "vfm DiT trainer / plain, recipe",
        "vfm DiT trainer / plain, recipe pooled",
        "vfm DiT trainer / plain, matched",
    }
    c = out["contestants"]
    peer = c["facebookresearch/DiT"]
    # forward + backward of 4 blocks of 18 D^2 weights at D = 64: 6 * 295k = 1.8 MFLOP per token
    assert 1.5e6 < peer["flops_per_unit"] < 3e6 and peer["rate"] > 0
    # matched: the peer's work per token (no cross-attention), the recipe's cross-attention more
    matched, recipe = c["vfm DiT plain matched"], c["vfm DiT plain"]
    assert abs(matched["flops_per_unit"] / peer["flops_per_unit"] - 1) < 0.05
    assert recipe["flops_per_unit"] > 1.1 * matched["flops_per_unit"]
    for row in rows.values():
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
    # torch.profiler's ops (on a loaded machine a record_function may rank among them too)
    assert len(peer["top_ops"]) == 5 and peer["top_ops"][0]["op"].startswith("aten::")


def test_tiny_ar_rows_against_the_reference_checkout():
    if not (NANOGPT_REPO / "model.py").is_file():
        pytest.skip(f"no karpathy/nanoGPT checkout at {NANOGPT_REPO}")
    # in bf16 autocast (the GPU table's precision; CPU autocast here): the same FLOPs are counted
    out = run_json(
        "--steps", "1", "--only", "ar", "--dtype", "bfloat16", "--nanogpt-repo", str(NANOGPT_REPO)
    )
    assert {row["row"] for row in out["rows"]} == {
        "AR plain loop, recipe",
        "AR plain loop, recipe pooled",
        "AR plain loop, matched",
        "AR plain loop, matched + 3D RoPE",
        "AR trainer vs peer loop, recipe",
        "AR trainer vs peer loop, recipe pooled",
        "AR trainer vs peer loop, matched",
        "vfm AR trainer / plain, recipe",
        "vfm AR trainer / plain, recipe pooled",
        "vfm AR trainer / plain, matched",
    }
    c = out["contestants"]
    peer, matched = c["karpathy/nanoGPT"], c["vfm AR plain matched"]
    # matched: nanoGPT's matmuls per token (GELU MLP, no cross-attention) within 2%
    assert abs(matched["flops_per_unit"] / peer["flops_per_unit"] - 1) < 0.02
    assert c["vfm AR trainer matched"]["flops_per_unit"] == pytest.approx(
        matched["flops_per_unit"], rel=1e-6
    )


def test_generation_rows_time_the_sampler_against_its_own_model_calls():
    out = run_json("--only", "gen")
    assert out["skipped"] == ["AR generation vs karpathy/nanoGPT generate (no --nanogpt-repo)"]
    rows = {row["row"]: row for row in out["rows"]}
    assert set(rows) == {"DiT sampler / bare model calls", "AR generation, KV cache / none"}
    c = out["contestants"]
    for name in ("vfm DiT sampler", "bare loop of its model calls"):
        assert c[name]["rate"] > 0 and c[name]["unit"] == "video tok"
    assert rows["AR generation, KV cache / none"]["ratio"] > 1  # the cache saves recomputation
