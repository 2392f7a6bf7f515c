"""Public rules of thumb for parallel layouts, as the planner must reproduce them.

Written from published guidance, not from any table of results:

* **FSDP alone wins when model and context are small** — ZeRO-3/FSDP shards states with no change
  to the math and hides its all-gathers behind compute; model parallelism only adds communication
  (PyTorch FSDP paper, Zhao et al. 2023, §7; torchtitan's docs: start with FSDP, add TP/CP/PP when
  memory or scale demands).
* **Long context prefers context parallelism** — activations grow with sequence length and CP
  divides them while its ring/all-to-all traffic is hidden behind quadratic attention (Ring
  Attention, Liu et al. 2023; Ulysses, Jacobs et al. 2023; NeMo/Megatron CP docs).
* **Large models add TP inside a node before PP** — TP over NVLink first, PP across nodes
  (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", takeaway
  #1: tensor parallelism up to the GPUs of a node, then pipeline parallelism). Their comparison
  holds the batch fixed — as the planner does — so at a small batch a pipeline runs few
  micro-batches and pays its bubble; with many micro-batches and interleaving (§2.2) the bubble
  shrinks and PP competes. So: at one micro-batch per stage TP beats PP; and whatever the batch, a
  pipeline the planner picks spans nodes, with the node already filled by the per-layer model
  parallelism (TP, and CP — the sequence analogue with per-layer collectives; torchtitan's mesh
  order puts pp outermost).
* **TP hurts below ~10B** — its per-layer collectives cost more than they save when GEMMs are
  already small and states fit with FSDP (Megatron/NeMo performance-tuning guidance).
* **All-to-all for ST-DiT's factorised attention** — spatial/temporal attention spans are short, so
  ring steps cannot hide their K/V transfers; Ulysses moves each token once per pass (the video-DiT
  papers use all-to-all for factorised attention). The trainer therefore runs ST-DiT's
  spatial/temporal passes all-to-all in both CP modes (``ring`` = the trainer's ``hybrid``: ring
  only for the full-attention blocks), and the planner models exactly that.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from vfm_core.config import ModelConfig
from vfm_core.perf.planner import Layout, Plan, plan
from vfm_core.recipes import get_recipe


def best(
    cfg: ModelConfig, seq: int, gpus: int, where: Callable[[Layout], bool] = lambda _: True
) -> Plan:
    plans = [p for p in plan(cfg, seq_len=seq, gpus=gpus).plans if p.fits and where(p.layout)]
    assert plans, "no fitting layout under the condition"
    return plans[0]


def small_dit() -> ModelConfig:
    """A ~1.6B DiT (hidden 2048, depth 24)."""
    return dataclasses.replace(get_recipe("dit-7b").model, hidden=2048, depth=24, heads=16)


@pytest.mark.parametrize("seq", [4096, 8192])
@pytest.mark.parametrize("gpus", [16, 64])
def test_fsdp_alone_wins_when_model_and_context_are_small(seq, gpus):
    top = best(small_dit(), seq, gpus)
    fsdp = best(small_dit(), seq, gpus, lambda x: (x.tp, x.cp, x.pp) == (1, 1, 1))
    assert (top.layout.tp, top.layout.cp) == (1, 1)  # no tensor or context parallelism
    assert fsdp.layout.dp_shard > 1  # sharded states, not plain DDP
    # FSDP alone, or a tie: a pipeline over the same global batch gathers each stage once per
    # step, which is all it gains
    assert fsdp.tokens_per_s_per_gpu >= 0.99 * top.tokens_per_s_per_gpu


@pytest.mark.parametrize("recipe", ["dit-7b", "llama-dit-7b"])
def test_long_context_prefers_cp(recipe):
    cfg = get_recipe(recipe).model
    long = best(cfg, 73728, 64)
    assert long.layout.cp > 1
    no_cp = best(cfg, 73728, 64, lambda x: x.cp == 1)
    assert long.tokens_per_s_per_gpu > no_cp.tokens_per_s_per_gpu
    assert long.layout.cp >= best(cfg, 8192, 64).layout.cp  # more CP as context grows


@pytest.mark.parametrize("recipe", ["dit-28b", "llama-dit-28b"])
@pytest.mark.parametrize("seq", [32768, 73728])
def test_large_models_add_tp_inside_a_node_before_pp(recipe, seq):
    cfg = get_recipe(recipe).model
    gpus, per_node = 256, 8
    # a small global batch (one sample per GPU): a pipeline of p stages without TP or CP has
    # gpus / p replicas of p samples, one micro-batch per stage (plain 1F1B): TP inside a node
    # beats it
    small = [p for p in plan(cfg, seq_len=seq, gpus=gpus, global_batch=gpus).plans if p.fits]
    tp_only = next(p for p in small if 1 < p.layout.tp <= per_node and p.layout.pp == 1)
    short = [p for p in small if p.layout.microbatches == p.layout.pp and p.layout.vpp == 1]
    pp_only = [p for p in short if p.layout.tp == 1 and p.layout.pp > 1]
    if pp_only:
        assert tp_only.tokens_per_s_per_gpu > pp_only[0].tokens_per_s_per_gpu
    # the top pick at the default batch: a pipeline only where model parallelism fills a node,
    # stages nodes apart
    plans = [p for p in plan(cfg, seq_len=seq, gpus=gpus).plans if p.fits]
    top = plans[0].layout
    if top.pp > 1:
        assert top.tp * top.cp >= per_node
        assert top.world // top.pp >= per_node  # stage-to-stage sends cross nodes
        assert top.microbatches >= 2 * top.pp or top.vpp > 1  # the bubble is amortised


@pytest.mark.parametrize("recipe", ["dit-7b", "llama-dit-7b", "stdit-7b"])
@pytest.mark.parametrize("seq", [8192, 73728])
def test_tp_hurts_below_10b(recipe, seq):
    cfg = get_recipe(recipe).model
    no_tp = best(cfg, seq, 64, lambda x: x.tp == 1)
    with_tp = best(cfg, seq, 64, lambda x: x.tp > 1)
    assert no_tp.tokens_per_s_per_gpu > with_tp.tokens_per_s_per_gpu


@pytest.mark.parametrize("recipe", ["stdit-7b", "stdit-12b"])
@pytest.mark.parametrize("gpus", [64, 256])
def test_all_to_all_for_stdit_factorised_attention(recipe, gpus):
    """Both modes run spatial/temporal all-to-all; they differ only on full-attention blocks, so
    degree for degree they are within a few percent (never the ring-for-everything gap)."""
    cfg = get_recipe(recipe).model
    for cp in (4, 8):
        fixed = f"cp={cp},tp=1,pp=1,recompute=selective,micro_batch=1"
        res = plan(cfg, seq_len=73728, gpus=gpus, fixed=fixed + ",cp_mode=a2a").plans[0]
        rin = plan(cfg, seq_len=73728, gpus=gpus, fixed=fixed + ",cp_mode=ring").plans[0]
        assert res.layout.dp_shard == rin.layout.dp_shard
        ratio = res.tokens_per_s_per_gpu / rin.tokens_per_s_per_gpu
        assert 0.95 < ratio < 1.05
