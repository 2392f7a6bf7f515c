"""The planner: search validity, FLOPs consistency, the CLI contract, bad input, calibration."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vfm_core.cli import main
from vfm_core.config import ConfigError
from vfm_core.perf.calibrate import calibrate, load_runs
from vfm_core.perf.flops import train_flops_per_token
from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, PEAKS, Efficiency, gpu_spec
from vfm_core.perf.layout_rules import check_layout, global_batch, parse_fixed
from vfm_core.perf.plan_format import explain_plan, format_table
from vfm_core.perf.planner import (
    DEFAULT_GLOBAL_BATCH,
    Layout,
    evaluate,
    explain_rejections,
    memory_of,
    plan,
)
from vfm_core.perf.timing import (
    bubble_fraction,
    pp_boundaries_across_nodes,
    step_time,
    workload,
)
from vfm_core.recipes import get_recipe

CONTRACT = (
    "dp_replicate",
    "dp_shard",
    "tp",
    "cp",
    "pp",
    "sp",
    "recompute",
    "fits",
    "memory_gb",
    "tflops_per_gpu",
    "mfu",
    "tokens_per_s_per_gpu",
    "global_batch",
)


@pytest.mark.parametrize(
    ("recipe", "seq", "gpus"),
    [("dit-7b", 73728, 64), ("stdit-12b", 35840, 64), ("llama-dit-28b", 8192, 256)],
)
def test_ranked_layouts_are_valid_and_consistent(recipe, seq, gpus):
    cfg = get_recipe(recipe).model
    result = plan(cfg, seq_len=seq, gpus=gpus, hardware="h100")
    h100 = PEAKS["H100 SXM"]
    fpt = train_flops_per_token(cfg, seq_len=seq)
    assert result.plans and all(p.fits for p in result.plans)
    assert result.global_batch == DEFAULT_GLOBAL_BATCH
    tok = [p.tokens_per_s_per_gpu for p in result.plans]
    assert tok == sorted(tok, reverse=True)
    for p in result.plans:
        lay = p.layout
        assert lay.world == gpus
        assert global_batch(lay) == DEFAULT_GLOBAL_BATCH  # every layout trains the same batch
        assert cfg.heads % lay.tp == 0 and cfg.n_kv_heads % lay.tp == 0
        assert lay.tp <= h100.gpus_per_node
        assert cfg.depth % lay.pp == 0 and seq % lay.cp == 0
        # TFLOPS = tokens/s × FLOPs/token of the spine's model, exactly
        assert p.flops_per_token == fpt
        assert p.tflops_per_gpu == p.tokens_per_s_per_gpu * fpt / 1e12
        assert p.mfu == p.tflops_per_gpu / h100.bf16_tflops
        assert p.memory.total_gib <= p.memory.capacity_gib
        t = p.time
        assert t.step_s == pytest.approx(
            t.compute_s + t.exposed_comm_s + t.bubble_s + t.optimizer_s
        )
        assert 0 < p.mfu < 1


def test_bubble_and_pipeline_time():
    assert bubble_fraction(1, 4) == 0
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)
    assert bubble_fraction(4, 4, vpp=2) == pytest.approx(3 / 11)
    work = workload(get_recipe("dit-7b").model, seq_len=8192)
    h100 = gpu_spec("h100")
    lay = Layout(dp_shard=16, pp=4, microbatches=8, recompute="full")
    st = step_time(work, lay, h100)
    tail = st.parts["fsdp_dp_exposed"] + st.parts["contention"]  # per step, not per micro-batch
    per_mb = (st.step_s - st.bubble_s - st.optimizer_s - tail) / 8
    assert st.bubble_s == pytest.approx(3 * per_mb)  # (p−1) micro-batch slots of fill and drain
    assert st.bubble_s / (st.step_s - st.optimizer_s - tail) == (
        pytest.approx(bubble_fraction(4, 8))
    )


def test_check_layout_reasons():
    cfg = get_recipe("dit-7b").model
    h100 = gpu_spec("h100")
    assert check_layout(cfg, Layout(tp=8, sp=True), seq_len=8192, gpu=h100) is None
    assert "exceeds heads" in check_layout(cfg, Layout(tp=64), seq_len=8192, gpu=h100)
    assert "GPUs per node" in check_layout(cfg, Layout(tp=16), seq_len=8192, gpu=h100)
    assert "does not divide heads" in check_layout(cfg, Layout(tp=3), seq_len=8192, gpu=h100)
    assert "depth" in check_layout(cfg, Layout(pp=3), seq_len=8192, gpu=h100)
    assert "sequence" in check_layout(cfg, Layout(cp=3), seq_len=8192, gpu=h100)
    a2a = Layout(cp=64, cp_mode="a2a")
    assert "all-to-all" in check_layout(cfg, a2a, seq_len=8192, gpu=h100)
    gqa = get_recipe("llama-dit-tiny").model  # 4 heads, 2 kv heads
    assert "kv_heads=2" in check_layout(gqa, Layout(tp=4), seq_len=256, gpu=h100)
    # PP x CP x TP x SP and interleaving are layouts the trainer runs
    four_d = Layout(tp=4, sp=True, cp=2, pp=2, vpp=2, microbatches=4)
    assert check_layout(cfg, four_d, seq_len=8192, gpu=h100) is None
    uneven, short = Layout(pp=2, vpp=3, microbatches=2), Layout(pp=4, microbatches=3)
    assert "pp_virtual_stages" in check_layout(cfg, uneven, seq_len=8192, gpu=h100)
    assert "pp_microbatches" in check_layout(cfg, short, seq_len=8192, gpu=h100)
    ar = get_recipe("ar-4b").model  # the causal family pipelines with TP too
    assert check_layout(ar, Layout(tp=2, pp=2, microbatches=2), seq_len=12800, gpu=h100) is None


def test_parse_fixed():
    assert parse_fixed("tp=2, sp=false,recompute=full,cp_mode=a2a") == {
        "tp": 2,
        "sp": False,
        "recompute": "full",
        "cp_mode": "a2a",
    }
    assert parse_fixed("recompute_blocks=0") == {"recompute_blocks": 0}  # 0 = every block
    for bad in ("foo=1", "tp=x", "tp=0", "sp=maybe", "recompute=some", "tp", "recompute_blocks=-1"):
        with pytest.raises(ConfigError):
            parse_fixed(bad)
    cfg, h100 = get_recipe("dit-28b").model, gpu_spec("h100")
    for lay, why in (
        (
            Layout(pp=2, microbatches=2, recompute="selective", recompute_blocks=3),
            "needs recompute=full",
        ),
        (Layout(pp=2, microbatches=2, recompute="full", recompute_blocks=25), "has 24 blocks"),
    ):
        assert why in check_layout(cfg, lay, seq_len=8192, gpu=h100)


def test_fixed_plain_dp_lists_layouts_that_do_not_fit():
    cfg = get_recipe("dit-7b").model
    result = plan(cfg, seq_len=73728, gpus=64, fixed="tp=1,cp=1,pp=1,dp_shard=1")
    assert result.plans and not any(p.fits for p in result.plans)
    for p in result.plans:
        assert (p.layout.dp_replicate, p.layout.dp_shard) == (64, 1)
        # replicated fp32 states of a 7B model: weights, gradients, AdamW moments, EMA
        assert p.memory.params_gib + p.memory.grads_gib + p.memory.optimizer_gib > 100
    mem = [p.memory.total_gib for p in result.plans]
    assert mem == sorted(mem)  # closest to fitting first


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(seq_len=0, gpus=8), "--seq"),
        (dict(seq_len=8192, gpus=0), "--gpus"),
        (dict(seq_len=8192, gpus=8, hardware="tpu-v5"), "unknown hardware"),
        (dict(seq_len=8192, gpus=64, fixed="tp=3"), "does not divide"),
        (dict(seq_len=8192, gpus=64, fixed="tp=64"), "exceeds heads"),
        (dict(seq_len=8192, gpus=64, fixed="pp=16"), "depth"),
        (dict(seq_len=8191, gpus=64, fixed="cp=2"), "sequence"),
        (dict(seq_len=8191, gpus=64, fixed="tp=2,sp=true"), r"8191 tokens .* 2 equal chunks"),
        (dict(seq_len=8192, gpus=2**20 + 1), r"--gpus must be at most 2\*\*20"),  # hung
        (dict(seq_len=8192, gpus=3, fixed="dp_shard=1,dp_replicate=1"), "does not divide"),
        # pipeline schedule: 28 blocks are not 2 x 4 virtual stages; 1F1B needs m >= pp
        (dict(seq_len=8192, gpus=64, fixed="pp=2,vpp=4"), "vpp=4.*pp_virtual_stages.*depth"),
        (dict(seq_len=8192, gpus=64, fixed="pp=4,microbatches=2"), "microbatches=2.*pp=4"),
        (dict(seq_len=8192, gpus=64, fixed="pp=1,vpp=2"), "vpp=2.*needs pp > 1"),
        # a global batch that is no number of samples, or that the layouts cannot split
        (dict(seq_len=8192, gpus=64, global_batch=0), "--global-batch must be a positive.*0"),
        (dict(seq_len=8192, gpus=64, global_batch=-4), "--global-batch must be a positive.*-4"),
        (dict(seq_len=8192, gpus=64, global_batch=2.5), "--global-batch must be an integer.*2.5"),
        (dict(seq_len=8192, gpus=64, global_batch=True), "--global-batch must be an integer"),
        (dict(seq_len=8192, gpus=64, global_batch=2**31), r"--global-batch must be at most 2\*"),
        (
            dict(seq_len=8192, gpus=64, global_batch=48, fixed="tp=1,cp=2,pp=1"),
            r"--global-batch 48: no layout .* 48 samples per step do not split over dp=32",
        ),
        (  # 16 samples over dp=16: one per replica, and the pipeline needs two micro-batches
            dict(seq_len=8192, gpus=64, global_batch=16, fixed="tp=2,sp=true,cp=1,pp=2"),
            r"--global-batch 16: .*1 per replica: fewer than pp=2 micro-batches",
        ),
        (
            dict(seq_len=8192, gpus=64, global_batch=512, fixed="micro_batch=3"),
            r"--global-batch 512: the pinned micro_batch=3",
        ),
        (
            dict(seq_len=8192, gpus=64, global_batch=512, fixed="tp=1,cp=2,pp=1,microbatches=32"),
            r"--global-batch 512: .*16 per replica: not microbatches=32",
        ),
    ],
)
def test_bad_input_raises_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        plan(get_recipe("dit-7b").model, **kwargs)


def test_layouts_that_cut_the_sequence_unevenly_are_dropped_and_explained():
    """7 tokens split over no TP x SP group: `vfm plan` ranked tp=2 with SP, which the trainer
    refuses; now the layout is rejected with the reason --explain prints."""
    result = plan(get_recipe("dit-tiny").model, seq_len=7, gpus=2)
    assert result.plans and all(p.layout.tp == 1 for p in result.plans)
    why = "7 tokens cannot be split into 2 equal chunks (tp=2 with sequence parallelism)"
    assert any(why in line for line in explain_rejections(result))


def test_nothing_valid_is_an_error():
    cfg = get_recipe("dit-28b").model  # 28B on 1 GPU: nothing fits
    with pytest.raises(ConfigError, match="no valid layout"):
        plan(cfg, seq_len=73728, gpus=1)


def test_hardware_names():
    assert gpu_spec("H100") is PEAKS["H100 SXM"] and gpu_spec("h200") is PEAKS["H200"]
    assert gpu_spec("A100") is PEAKS["A100 SXM"] and gpu_spec("b200") is PEAKS["B200"]
    cfg = get_recipe("dit-7b").model
    h100 = plan(cfg, seq_len=73728, gpus=64, hardware="h100").plans[0]
    h200 = plan(cfg, seq_len=73728, gpus=64, hardware="H200").plans[0]
    assert h200.tokens_per_s_per_gpu >= h100.tokens_per_s_per_gpu  # same compute, more HBM


def test_explain_and_table():
    result = plan(get_recipe("dit-7b").model, seq_len=8192, gpus=64)
    lines = explain_rejections(result)
    text = "\n".join(lines)
    assert "out of memory" in text and "does not divide depth" in text
    table = format_table(result, top=3)
    assert "MFU" in table and "tok/s/GPU" in table and len(table.splitlines()) == 5


# ----------------------------------------------------------------------------------------- CLI
def test_cli_json_contract(capsys):
    argv = ["plan", "--recipe", "dit-7b", "--seq", "73728", "--gpus", "64"]
    assert main(argv + ["--hardware", "h100", "--top", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) == 3
    for row in rows:
        assert set(CONTRACT) <= set(row)
        assert isinstance(row["sp"], bool) and isinstance(row["fits"], bool)
        assert row["dp_replicate"] * row["dp_shard"] * row["tp"] * row["cp"] * row["pp"] == 64
    tok = [r["tokens_per_s_per_gpu"] for r in rows]
    assert tok == sorted(tok, reverse=True)
    assert {r["global_batch"] for r in rows} == {DEFAULT_GLOBAL_BATCH}
    assert main(argv + ["--global-batch", "96", "--top", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["global_batch"] for r in rows} == {96}
    for r in rows:  # each replica's share of the 96 samples is micro-batch x micro-batches
        assert r["micro_batch"] * r["microbatches"] * r["dp_replicate"] * r["dp_shard"] == 96


def test_cli_fixed_plain_dp(capsys):
    argv = ["plan", "--recipe", "dit-7b", "--seq", "73728", "--gpus", "64", "--hardware", "h100"]
    assert main(argv + ["--fixed", "tp=1,cp=1,pp=1,dp_shard=1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all(r["fits"] is False for r in rows)
    assert all((r["tp"], r["cp"], r["pp"], r["dp_shard"]) == (1, 1, 1, 1) for r in rows)


def test_cli_table_and_explain(capsys):
    argv = ["plan", "--recipe", "dit-7b", "--seq", "73728", "--gpus", "64", "--hardware", "h100"]
    assert main(argv + ["--top", "3", "--explain"]) == 0
    out = capsys.readouterr().out
    for word in ("compute", "comm", "bubble", "TFLOPS", "MFU", "tok/s/GPU", "rejected layouts"):
        assert word in out
    assert f"global batch {DEFAULT_GLOBAL_BATCH} samples" in out.splitlines()[0]


@pytest.mark.parametrize(
    "extra",
    [
        ["--seq", "0", "--gpus", "8"],
        ["--seq", "8192", "--gpus", "3", "--fixed", "tp=2"],
        ["--seq", "8192", "--gpus", "64", "--hardware", "tpu"],
        ["--seq", "8192", "--gpus", "64", "--fixed", "tp=64"],
        ["--seq", "8192", "--gpus", "64", "--fixed", "cp=3"],
        ["--seq", "8192", "--gpus", "64", "--fixed", "bogus=1"],
        ["--seq", "8192", "--gpus", "1000000000"],  # gave no answer in 30 s
        ["--seq", "8191", "--gpus", "2", "--fixed", "tp=2,sp=true"],  # the trainer refuses it
        ["--seq", "8192", "--gpus", "64", "--global-batch", "0"],
        ["--seq", "8192", "--gpus", "64", "--global-batch", "x"],
        ["--seq", "8192", "--gpus", "64", "--global-batch", "2.5"],
        ["--seq", "8192", "--gpus", "64", "--global-batch", "48", "--fixed", "tp=1,cp=2,pp=1"],
    ],
)
def test_cli_bad_input_exits_2_with_one_line(capsys, extra):
    try:
        code = main(["plan", "--recipe", "dit-7b", *extra])
    except SystemExit as e:  # refused by the parser (--seq 0)
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vfm plan: error:") and len(err.splitlines()) == 1


# ------------------------------------------------------------------------------- calibration
def _synthetic_runs(eff: Efficiency) -> list[dict]:
    """Measured runs as the planner would predict them with ``eff`` (the ground truth)."""
    h100 = gpu_spec("h100")
    runs = []
    cases = [
        ("dit-7b", 8192, Layout(dp_shard=64, recompute="selective", micro_batch=2)),
        ("dit-7b", 73728, Layout(dp_shard=16, cp=4, recompute="selective")),
        ("dit-7b", 32768, Layout(dp_shard=16, tp=4, sp=True, recompute="selective")),
        ("stdit-7b", 35840, Layout(dp_shard=32, cp=2, cp_mode="a2a", recompute="selective")),
    ]
    for recipe, seq, lay in cases:
        work = workload(get_recipe(recipe).model, seq_len=seq)
        tok = evaluate(work, lay, h100, eff).tokens_per_s_per_gpu
        layout = {k: getattr(lay, k) for k in ("dp_shard", "tp", "cp", "sp", "recompute")}
        runs.append(
            {
                "recipe": recipe,
                "seq": seq,
                "hardware": "h100",
                "layout": layout | {"micro_batch": lay.micro_batch, "cp_mode": lay.cp_mode},
                "tokens_per_s": tok * lay.world,
                "gpus": lay.world,
            }
        )
    return runs


def test_calibrate_recovers_a_known_efficiency():
    truth = dataclasses.replace(DEFAULT_EFFICIENCY, gemm=0.6)
    cal = calibrate(_synthetic_runs(truth), fit=("gemm",))
    assert cal.fitted["gemm"] == pytest.approx(0.6, rel=0.01)
    assert cal.rms_log_error_after < 1e-3 < cal.rms_log_error_before


def test_calibrate_two_constants_from_a_file(tmp_path):
    truth = dataclasses.replace(DEFAULT_EFFICIENCY, gemm=0.65, attention=0.45)
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _synthetic_runs(truth)) + "\n")
    assert len(load_runs(path)) == 4
    cal = calibrate(path, fit=("gemm", "attention"), rounds=6)
    assert cal.fitted["gemm"] == pytest.approx(0.65, rel=0.03)
    assert cal.fitted["attention"] == pytest.approx(0.45, rel=0.03)


def test_cli_calibrate(tmp_path, capsys):
    truth = dataclasses.replace(DEFAULT_EFFICIENCY, gemm=0.6)
    path = tmp_path / "runs.json"
    path.write_text(json.dumps({"runs": _synthetic_runs(truth)}))
    argv = ["plan", "--recipe", "dit-7b", "--seq", "8192", "--gpus", "64", "--json", "--top", "1"]
    assert main(argv + ["--calibrate", str(path)]) == 0
    captured = capsys.readouterr()
    assert "calibrated on 4 run(s)" in captured.err
    calibrated = json.loads(captured.out)[0]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)[0]
    assert calibrated["mfu"] < default["mfu"]  # slower GEMMs than the default 0.75
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"seq": 8192}]))
    assert main(argv + ["--calibrate", str(bad)]) == 2
    assert main(argv + ["--calibrate", str(tmp_path / "missing.json")]) == 2


# ------------------------------------------------------------------- pipelines and the paper
def test_interleaving_lowers_the_bubble_and_sends_more():
    """Interleaved 1F1B over v virtual stages: bubble (p−1)/v micro-batch slots instead of p−1
    (Narayanan et al. 2021 §2.2), v times the stage-to-stage sends, more activations in flight."""
    work = workload(get_recipe("dit-28b").model, seq_len=73728)
    h100 = gpu_spec("h100")
    base = Layout(dp_shard=2, tp=8, sp=True, cp=4, pp=4, microbatches=16, recompute="selective")
    plain, inter = (evaluate(work, dataclasses.replace(base, vpp=v), h100) for v in (1, 2))
    assert inter.time.bubble_s == pytest.approx(plain.time.bubble_s / 2, rel=0.01)
    assert inter.time.bubble_s < plain.time.bubble_s
    assert inter.time.parts["pp_p2p"] == pytest.approx(2 * plain.time.parts["pp_p2p"])
    assert inter.memory.activations_gib > plain.memory.activations_gib
    assert inter.tokens_per_s_per_gpu > plain.tokens_per_s_per_gpu
    for p, v in ((plain, 1), (inter, 2)):  # the bubble is its share of the pipelined time
        t = p.time
        pipelined = t.compute_s + sum(t.parts[k] for k in ("tp", "cp", "pp_p2p")) + t.bubble_s
        assert t.bubble_s / pipelined == pytest.approx(bubble_fraction(4, 16, v))


def test_pp_x_cp_layouts_are_priced():
    """PP x CP: the CP ring inside every stage, the bubble and the stage sends of the chunk
    (B, N/(cp·tp), D) are all in the step time, and the search ranks such layouts."""
    cfg = get_recipe("dit-28b").model
    result = plan(cfg, seq_len=73728, gpus=256, fixed="tp=8,sp=true,cp=4,pp=4,vpp=1")
    p = next(q for q in result.plans if q.fits)
    t = p.time
    assert t.bubble_s > 0 and t.parts["pp_p2p"] > 0 and t.parts["tp"] > 0
    assert t.parts["attention"] > 0 and t.parts["contention"] > 0  # ring hidden, not free
    lay = p.layout
    chunk = lay.micro_batch * 73728 / (lay.cp * lay.tp) * cfg.hidden * 2  # bf16 bytes
    per_send = t.parts["pp_p2p"] / lay.microbatches / 2 - DEFAULT_EFFICIENCY.collective_latency_s
    ib = PEAKS["H100 SXM"].ib_gbps / 8 * 1e9 * DEFAULT_EFFICIENCY.ib  # stages are nodes apart
    assert per_send == pytest.approx(chunk / ib)
    free = plan(cfg, seq_len=73728, gpus=256).plans
    assert any(q.layout.pp > 1 and q.layout.cp > 1 for q in free)


def test_stage_boundaries_across_nodes_follow_the_rank_order():
    """Mesh order [pp, dp_replicate, dp_shard, cp, tp]: stage s holds ranks s·S ... s·S + S - 1
    (S = world / pp), and its ranks send to the same offset of stage s + 1; 8 GPUs per node."""
    assert pp_boundaries_across_nodes(Layout(dp_shard=2, pp=4), 8) == (0, 3)  # one node
    assert pp_boundaries_across_nodes(Layout(dp_shard=8, pp=4), 8) == (3, 3)  # a node per stage
    # 4 ranks per stage: 0-3 -> 4-7 stays in node 0, 4-7 -> 8-11 leaves it, ... 7 of 15
    assert pp_boundaries_across_nodes(Layout(dp_shard=4, pp=16), 8) == (7, 15)
    # 3 ranks per stage: 0-2 -> 3-5 stays, 3-5 -> 6-8 and 6-8 -> 9-11 straddle ranks 7 | 8
    assert pp_boundaries_across_nodes(Layout(dp_shard=3, pp=4), 8) == (2, 3)
    # interleaved 1F1B: the last GPU's chunk goes back to the first GPU, one more boundary
    assert pp_boundaries_across_nodes(Layout(dp_shard=2, pp=4, vpp=2), 8) == (0, 4)
    assert pp_boundaries_across_nodes(Layout(dp_shard=4, pp=4, vpp=2), 8) == (2, 4)
    assert pp_boundaries_across_nodes(Layout(tp=8), 8) == (0, 0)  # no pipeline


def test_pipeline_sends_are_priced_on_the_link_their_stages_land_on():
    """pp16 on 64 GPUs puts two stages on each node: every other boundary leaves a node, and the
    lock-stepped stages send at the pace of the slowest, InfiniBand (it was priced as NVLink,
    two ranks 4 apart); a pipeline inside one node sends over NVLink."""
    cfg, h100, eff = get_recipe("dit-28b").model, gpu_spec("h100"), DEFAULT_EFFICIENCY
    work = workload(cfg, seq_len=8192)
    ib = h100.ib_gbps / 8 * 1e9 * eff.ib
    nvlink = h100.nvlink_gbps / 2 * 1e9 * eff.nvlink
    chunk = 8192 * cfg.hidden * 2  # (1, N, D) bf16, one sample per micro-batch
    for lay, bw in (
        (Layout(dp_replicate=4, pp=16, microbatches=128, recompute="full"), ib),
        (Layout(pp=8, microbatches=64, recompute="full"), nvlink),  # 8 GPUs: one node
    ):
        st = step_time(work, lay, h100)
        per_send = st.parts["pp_p2p"] / lay.microbatches / 2 - eff.collective_latency_s
        assert per_send == pytest.approx(chunk / bw)
    text = explain_plan(evaluate(work, Layout(dp_replicate=4, pp=16, microbatches=128), h100))
    assert "PP stage sends (2 per micro-batch, IB 7/15 off-node)" in text


def test_every_compared_layout_trains_one_global_batch():
    """Issue #45: unpinned, dit-28b at 8k on 64 GPUs ranked pp16 with 256 micro-batches (global
    batch 512) first, above layouts that were priced at their own, smaller batches. Now every
    layout of a query trains the requested batch, without a pipeline by gradient accumulation,
    with one by the schedule's micro-batches."""
    cfg = get_recipe("dit-28b").model
    for batch in (128, 512):
        result = plan(cfg, seq_len=8192, gpus=64, global_batch=batch)
        assert result.global_batch == batch
        assert {global_batch(p.layout) for p in result.plans} == {batch}
        assert any(p.layout.pp == 1 and p.layout.microbatches > 1 for p in result.plans)
        for p in result.plans:
            lay = p.layout
            assert lay.pp == 1 or lay.microbatches >= lay.pp
            sends = p.time.pp_across_nodes
            if lay.pp > 1 and lay.world // lay.pp < 8:  # stages share nodes: IB still paces
                assert sends[0] > 0
    # fewer samples per step: fewer micro-batches per replica, a larger bubble, slower
    small, large = (plan(cfg, seq_len=8192, gpus=64, global_batch=b).plans[0] for b in (128, 512))
    assert small.tokens_per_s_per_gpu < large.tokens_per_s_per_gpu


def test_gradient_accumulation_reduces_every_micro_batch():
    """The trainer keeps FSDP2's gradient sync on while it accumulates, so without a pipeline
    each micro-batch reduce-scatters (and HSDP all-reduces) its gradients: accumulation buys
    no throughput. A pipeline schedule reduces once, after the step's last backward."""
    work, h100 = workload(get_recipe("dit-7b").model, seq_len=8192), gpu_spec("h100")
    base = Layout(dp_replicate=8, dp_shard=4, cp=2, micro_batch=2)
    one, eight = (step_time(work, dataclasses.replace(base, microbatches=m), h100) for m in (1, 8))
    assert eight.parts["fsdp"] == pytest.approx(8 * one.parts["fsdp"])
    assert eight.parts["dp"] == pytest.approx(8 * one.parts["dp"])
    # only the optimizer step and the first layer's all-gather come once per step
    assert 0.98 * 8 * one.step_s < eight.step_s < 8 * one.step_s
    pipe = Layout(dp_shard=16, pp=2, microbatches=4)
    a, b = (step_time(work, dataclasses.replace(pipe, microbatches=m), h100) for m in (4, 8))
    ag = (b.parts["fsdp"] - a.parts["fsdp"]) / 4  # one all-gather per extra micro-batch
    assert a.parts["fsdp"] - ag * (4 + 2) == pytest.approx(b.parts["fsdp"] - ag * (8 + 2))


# The paper's Table 1 (arXiv 2503.12964, H100 SXM, bf16): recipe, tokens, GPUs, its stated
# degrees (pipelines pinned to plain 1F1B: the table names no virtual stages, Megatron-core's
# default), measured TFLOP/s per GPU. Row 3 is an ESTIMATE (the planner before PP x CP /
# interleaving predicted 331.3, stated to be ~24% below the paper: 331.3 / 0.76 = 436); row 4's
# figure is not known here (checked elsewhere). The table states no global batch: every row is
# planned at the planner's default, 512 samples (DEFAULT_GLOBAL_BATCH says why).
PAPER_BATCH = DEFAULT_GLOBAL_BATCH
PAPER = [
    ("dit-7b", 8192, 64, "tp=1,cp=2,pp=1", 457.0),
    ("dit-7b", 73728, 64, "tp=4,sp=true,cp=4,pp=1", 414.0),
    ("dit-28b", 8192, 64, "tp=2,sp=true,cp=1,pp=2,vpp=1", 436.0),
    ("dit-28b", 73728, 256, "tp=8,sp=true,cp=4,pp=4,vpp=1", None),
]


def _paper_plan(recipe: str, seq: int, gpus: int, fixed: str):
    """The paper's layout as the planner runs it: the stated degrees pinned, the rest (data-
    parallel split, micro-batch size and count, recompute, CP mode) the planner's best fit."""
    result = plan(
        get_recipe(recipe).model, seq_len=seq, gpus=gpus, fixed=fixed, global_batch=PAPER_BATCH
    )
    return next(p for p in result.plans if p.fits)


@pytest.mark.parametrize(("recipe", "seq", "gpus", "fixed", "measured"), PAPER)
def test_paper_rows(recipe, seq, gpus, fixed, measured):
    p = _paper_plan(recipe, seq, gpus, fixed)
    assert p.memory.total_gib <= p.memory.capacity_gib < 80
    assert global_batch(p.layout) == PAPER_BATCH
    if measured is None:  # representable (TP8 x SP x CP4 x PP4), fits, reported
        lay = p.layout
        assert (lay.tp, lay.sp, lay.cp, lay.pp) == (8, True, 4, 4) and lay.world == gpus
        assert p.time.bubble_s > 0 and p.time.parts["pp_p2p"] > 0
        assert 0.2 < p.mfu < 0.6
        print(f"{recipe} {seq} {fixed}: {p.tflops_per_gpu:.1f} TFLOP/s/GPU")
        return
    if recipe == "dit-28b":
        # row 3 (its figure an estimate): FSDP2 under a pipeline schedule keeps each stage
        # gathered (bf16) with unsharded fp32 gradients until the last microbatch, 6 B per
        # parameter of the stage (as Megatron's bf16 weights + fp32 main gradients), which with
        # the sharded states and the EMA leaves room for selective recompute on only some of the
        # blocks: block-wise full recompute on the fewest that fit, the rest selective
        lay = p.layout
        assert lay.recompute == "full" and 0 < lay.recompute_blocks < 24
        fewer = dataclasses.replace(lay, recompute_blocks=lay.recompute_blocks - 1)
        assert not _memory(recipe, seq, fewer).fits
    assert p.tflops_per_gpu == pytest.approx(measured, rel=0.10)


def _memory(recipe: str, seq: int, lay):
    work = workload(get_recipe(recipe).model, seq_len=seq)
    return memory_of(work, lay, gpu_spec("h100"))


@pytest.mark.parametrize(("recipe", "seq", "gpus", "fixed", "measured"), PAPER)
def test_top_pick_is_not_slower_than_the_paper_layout(recipe, seq, gpus, fixed, measured):
    """The top pick is compared with the paper's layout at the paper row's batch: it wins by
    its layout, not by training a larger batch (more pipeline micro-batches)."""
    top = plan(get_recipe(recipe).model, seq_len=seq, gpus=gpus, global_batch=PAPER_BATCH).plans[0]
    paper = _paper_plan(recipe, seq, gpus, fixed)
    assert top.fits
    assert global_batch(top.layout) == global_batch(paper.layout) == PAPER_BATCH
    assert top.tokens_per_s_per_gpu >= paper.tokens_per_s_per_gpu * (1 - 1e-9)


def test_explain_shows_the_pipeline_terms():
    cfg = get_recipe("dit-28b").model
    p = plan(cfg, seq_len=73728, gpus=256, fixed="tp=8,sp=true,cp=4,pp=4,vpp=2").plans[0]
    text = explain_plan(p)
    for word in ("interleaved 1F1B, v=2", "pipeline bubble", "PP stage sends (4 per", "CP ring"):
        assert word in text
    assert "conditioning" in text and "FSDP/DP not hidden" in text


def test_lora_runs_are_planned_without_the_frozen_weights_gradients_and_states(capsys):
    """A LoRA fine-tuning run at the full run's layout: the adapters' parameters counted on the
    model, no gradient / AdamW moments / EMA of the frozen weights, no weight-gradient GEMMs
    (2/3 of the GEMM work), smaller step; ``vfm plan --set train.lora.rank`` plans it."""
    from vfm_core.config import LoraConfig
    from vfm_core.families import build_model
    from vfm_core.models.lora import add_adapters, is_adapter
    from vfm_core.perf.layout_rules import LAYOUT_KEYS
    from vfm_core.perf.timing import adapter_params

    tiny = get_recipe("dit-tiny").model
    model = build_model(tiny, device="meta")
    add_adapters(model, LoraConfig(rank=4))
    counted = sum(p.numel() for n, p in model.named_parameters() if is_adapter(n))
    assert adapter_params(tiny, 4) == counted > 0 and adapter_params(tiny, 0) == 0
    cfg = get_recipe("dit-7b").model
    full = plan(cfg, seq_len=8192, gpus=32).plans[0]
    pins = {k: getattr(full.layout, k) for k in LAYOUT_KEYS}
    lora = plan(cfg, seq_len=8192, gpus=32, fixed=pins, lora_rank=16).plans[0]
    assert lora.layout == full.layout
    m, f = lora.memory, full.memory
    assert m.params_gib > f.params_gib  # the adapters beside the model
    assert m.grads_gib < 0.02 * f.grads_gib and m.optimizer_gib < 0.02 * f.optimizer_gib
    assert m.total_gib < f.total_gib - 0.8 * (f.grads_gib + f.optimizer_gib + f.ema_gib)
    assert lora.time.parts["gemm"] == pytest.approx(full.time.parts["gemm"] * 2 / 3, rel=0.05)
    assert 0.6 < lora.time.step_s / full.time.step_s < 0.95
    assert lora.flops_per_token < full.flops_per_token
    argv = ["plan", "--recipe", "dit-tiny", "--seq", "256", "--gpus", "2", "--top", "1"]
    assert main([*argv, "--set", "train.lora.rank=4"]) == 0
    assert "dit-tiny at 256 tokens" in capsys.readouterr().out
    assert main([*argv, "--set", "train.steps=3"]) == 2
    assert "reads only model.* fields and train.lora.rank" in capsys.readouterr().err
