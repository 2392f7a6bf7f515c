"""ParallelDims: the one object that owns the parallel degrees and the named DeviceMesh.

Degrees (paper §4, torchtitan ``parallel_dims.py``): ``pp`` pipeline stages, ``dp_replicate``
replicated data parallel (HSDP outer), ``dp_shard`` FSDP, ``cp`` context parallel (sequence split
over ranks with ring / all-to-all attention), ``tp`` tensor parallel (+ sequence parallel). Their
product is the world size; ``dp_shard=-1`` takes whatever is left.

The mesh is laid out ``(pp, dp_replicate, dp_shard, cp, tp)``: tp innermost so a TP group sits on
neighbouring ranks (one NVLink island on a GPU node), pp outermost. Every dimension is present in
the mesh, size 1 included, so code can ask for ``dims.mesh["cp"]`` without branching. Nothing else
in the project computes ranks by hand: ask :meth:`ParallelDims.coord` or the sub-meshes.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch.distributed as dist
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: PLC2701
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from vfm_core.config import ConfigError, ParallelDegrees, resolve_degrees

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""Mesh dimension names, outermost first."""


@dataclass(init=False, slots=True)
class ParallelDims:
    """Validated parallel degrees for ``world_size`` ranks and the mesh built from them:
    ``ParallelDims(tp=2, world_size=8)`` takes the degrees of :class:`ParallelDegrees` (their
    defaults, dp_shard=-1 worked out) and holds them resolved in :attr:`sizes`; ``dims.tp`` and
    the others read them."""

    sizes: ParallelDegrees
    """The resolved degrees (no -1); their product is ``world_size``."""
    world_size: int
    """Number of ranks the degrees must multiply to."""
    _mesh: DeviceMesh | None = field(default=None, repr=False)
    """The built mesh (see :meth:`build_mesh`)."""
    _fsdp: DeviceMesh | None = field(default=None, repr=False)
    """The FSDP mesh (see :meth:`fsdp_mesh`)."""

    def __init__(self, *, world_size: int, **degrees: int) -> None:
        declared = ParallelDegrees(**degrees)  # unknown names: TypeError; defaults declared there
        self.sizes = ParallelDegrees(**resolve_degrees(declared.degrees(), world_size))
        self.world_size = world_size
        self._mesh = self._fsdp = None

    @classmethod
    def from_config(cls, cfg: ParallelDegrees, world_size: int) -> ParallelDims:
        return cls(**cfg.degrees(), world_size=world_size)

    # ------------------------------------------------------------------ degrees
    @property
    def degrees(self) -> dict[str, int]:
        """Degree of every mesh dimension, outermost first."""
        return {name: getattr(self.sizes, name) for name in MESH_DIMS}

    @property
    def dp(self) -> int:
        """Total data-parallel degree (distinct batches): dp_replicate * dp_shard."""
        return self.dp_replicate * self.dp_shard

    @property
    def fsdp_enabled(self) -> bool:
        return self.dp_shard > 1 or self.dp_replicate > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    # ------------------------------------------------------------------ mesh
    def build_mesh(self, device_type: str = "cpu") -> DeviceMesh:
        """Build (once) the named mesh over the default process group."""
        if self._mesh is None:
            if not dist.is_initialized():
                raise RuntimeError("ParallelDims.build_mesh: torch.distributed is not initialised")
            if dist.get_world_size() != self.world_size:
                raise ConfigError(
                    f"parallel: degrees are for {self.world_size} ranks but the process group has "
                    f"{dist.get_world_size()}"
                )
            shape = tuple(self.degrees.values())
            # rank bookkeeping with real integers, also while ``vfm plan --check`` traces a
            # step under fake tensors (a fake mesh tensor has no values to read)
            with unset_fake_temporarily():
                self._mesh = init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS)
        return self._mesh

    @property
    def mesh(self) -> DeviceMesh:
        if self._mesh is None:
            raise RuntimeError("ParallelDims.mesh: call build_mesh() first")
        return self._mesh

    def submesh(self, *names: str) -> DeviceMesh:
        """Sub-mesh over the named dimensions, e.g. ``submesh("dp_replicate", "dp_shard")``."""
        unknown = [n for n in names if n not in MESH_DIMS]
        if unknown:
            raise ValueError(f"mesh dimension {unknown[0]!r} unknown (known: {MESH_DIMS})")
        with unset_fake_temporarily():  # rank bookkeeping: real integers (see build_mesh)
            return self.mesh[names[0]] if len(names) == 1 else self.mesh[names]

    def dp_mesh(self) -> DeviceMesh:
        """Mesh FSDP2 shards over: 2D (replicate, shard) for HSDP, else the one >1 dimension."""
        if self.dp_replicate > 1 and self.dp_shard > 1:
            return self.submesh("dp_replicate", "dp_shard")
        return self.submesh("dp_replicate" if self.dp_replicate > 1 else "dp_shard")

    def fsdp_mesh(self) -> DeviceMesh:
        """Mesh FSDP2 shards over: data-parallel *and* context-parallel ranks (torchtitan's
        ``dp_shard_cp``), 2D (replicate, shard x cp) for HSDP. CP ranks hold different tokens of
        the same samples, so parameters and optimizer state shard over them too, and one
        reduce-scatter replaces a separate gradient all-reduce over cp."""
        if self._fsdp is None:
            with unset_fake_temporarily():  # rank bookkeeping: real integers (see build_mesh)
                flat = self.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
                if self.dp_replicate > 1:
                    with warnings.catch_warnings():  # slicing a flattened dim from the root mesh
                        warnings.simplefilter("ignore", UserWarning)
                        flat = self.mesh["dp_replicate", "dp_shard_cp"]
            self._fsdp = flat
        return self._fsdp

    def group(self, name: str) -> dist.ProcessGroup:
        """Process group of one mesh dimension."""
        return self.submesh(name).get_group()

    def coord(self, name: str) -> int:
        """This rank's index along dimension ``name``."""
        return self.submesh(name).get_local_rank()

    def model_parallel_group(self) -> dist.ProcessGroup | None:
        """The ranks that hold the same data-parallel slice (pp x cp x tp), as a gloo group (the
        shard loader all-gathers bytes in CPU tensors, also under nccl); None when that is one
        rank. ``dist.new_group`` must be entered by every rank for every group in the same order,
        so all of them are created here and this rank keeps its own."""
        if self.pp * self.cp * self.tp == 1:
            return None
        with unset_fake_temporarily():  # rank bookkeeping: real integers (see build_mesh)
            ranks = self.mesh.mesh.tolist()  # (pp, dp_replicate, dp_shard, cp, tp) global ranks
        mine = None
        for r in range(self.dp_replicate):
            for s in range(self.dp_shard):
                members = sorted(rank for stage in ranks for cp in stage[r][s] for rank in cp)
                group = dist.new_group(members, backend="gloo")
                if dist.get_rank() in members:
                    mine = group
        return mine

    def dp_rank(self) -> int:
        """Index of this rank's data-parallel batch slice (0 .. dp-1)."""
        return self.coord("dp_replicate") * self.dp_shard + self.coord("dp_shard")


def _degree(name: str) -> property:
    return property(lambda self: getattr(self.sizes, name), doc=f"The resolved ``{name}`` degree.")


for _name in MESH_DIMS:  # dims.tp, dims.dp_shard, ...: read from ``sizes``, declared there
    setattr(ParallelDims, _name, _degree(_name))
del _name
