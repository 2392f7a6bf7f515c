"""ParallelDims: degree validation with errors naming the degree, dp_shard inference, the named
mesh and its sub-meshes on 4 gloo ranks."""

from __future__ import annotations

import pytest
from parallel_harness import run_ranks

from vfm_core.config import ConfigError, ParallelConfig
from vfm_core.parallel.dims import MESH_DIMS, ParallelDims


def test_dp_shard_is_inferred_from_the_world_size():
    dims = ParallelDims(tp=2, cp=2, world_size=8)
    assert dims.dp_shard == 2 and dims.dp == 2
    assert dims.degrees == {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2}
    assert dims.fsdp_enabled and dims.tp_enabled and dims.cp_enabled and not dims.pp_enabled
    one = ParallelDims.from_config(ParallelConfig(), world_size=1)
    assert one.degrees == dict.fromkeys(MESH_DIMS, 1) and not one.fsdp_enabled


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(tp=3, world_size=4), r"dp_replicate\*cp\*tp\*pp = 1\*1\*3\*1 = 3 does not divide"),
        (dict(tp=2, dp_shard=4, world_size=4), r"dp_shard=4.*tp=2 = 8 ranks, but the world size"),
        (dict(cp=0, world_size=4), r"parallel.cp: must be an integer >= 1, got 0"),
        (dict(tp=2.0, world_size=4), r"parallel.tp: must be an integer >= 1, got 2.0"),
        (dict(dp_shard=-2, world_size=4), r"parallel.dp_shard: must be an integer >= 1 or -1"),
        (dict(world_size=0), r"world size must be positive"),
    ],
)
def test_bad_degrees_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ParallelDims(**kwargs)


def test_mesh_needs_building_first():
    with pytest.raises(RuntimeError, match="build_mesh"):
        _ = ParallelDims(world_size=1).mesh


def _worker_mesh(rank, world):
    dims = ParallelDims(tp=2, dp_shard=-1, world_size=world)
    mesh = dims.build_mesh("cpu")
    assert mesh.mesh_dim_names == MESH_DIMS
    return {
        "tp": dims.coord("tp"),
        "dp": dims.dp_rank(),
        "cp": dims.coord("cp"),
        "tp_ranks": dims.submesh("tp").mesh.flatten().tolist(),
        "dp_ranks": dims.dp_mesh().mesh.flatten().tolist(),
    }


@pytest.mark.slow
def test_named_mesh_puts_tp_innermost():
    out = run_ranks(_worker_mesh, 4)
    assert [o["tp"] for o in out] == [0, 1, 0, 1]
    assert [o["dp"] for o in out] == [0, 0, 1, 1]
    assert all(o["cp"] == 0 for o in out)
    assert [o["tp_ranks"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["dp_ranks"] for o in out] == [[0, 2], [1, 3], [0, 2], [1, 3]]
