"""ParallelDims: degree validation with errors naming the degree, dp_shard inference (the named
mesh on 4 gloo ranks is checked in test_equivalence.py, from the same spawn)."""

from __future__ import annotations

import pytest

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
