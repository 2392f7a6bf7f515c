"""Reading samples for :class:`~vfm_core.data.loader.ShardLoader` (:class:`SampleReader`, which
the loader holds): a sample's byte range (a model-parallel group reads 1/k each and all-gathers the
raw bytes), its checksum, parse + check, and the decode of its clip, checked against the index's
size and the frames its token grid or bucket needs."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from vfm_core.data.index_tables import DatasetIndex
from vfm_core.data.loader_geometry import SampleGeometry
from vfm_core.data.shard_batch import Sample
from vfm_core.data.shard_reader import (
    SampleError,
    ShardError,
    check_sample,
    parse_indexed,
    read_raw,
)


class SampleReader:
    """Reads, checks and decodes samples of ``index``; their token grids and buckets come from
    ``geometry``. ``decode``: ``"frames"`` decodes clips to uint8 (T, H, W, 3) unless the shard
    has latents, ``"none"`` hands out the encoded mp4. ``checksums``: check every sample against
    its checksum in the index (where it has one). ``mp_group``: model-parallel group that reads
    1/k each and all-gathers. ``pool``: threads for the reads (None: in the caller's thread)."""

    def __init__(
        self,
        index: DatasetIndex,
        geometry: SampleGeometry,
        *,
        decode: Literal["frames", "none"] = "frames",
        checksums: bool = True,
        mp_group: Any = None,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.index, self.geometry = index, geometry
        self.decode, self.checksums = decode, checksums
        self.mp_group, self.pool = mp_group, pool
        self.bytes_read = 0
        """Bytes this rank read (its share of a model-parallel group's reads)."""

    # ------------------------------------------------------------------ reading
    def _mp(self) -> tuple[int, int]:
        if self.mp_group is None:
            return 0, 1
        import torch.distributed as dist

        return dist.get_rank(self.mp_group), dist.get_world_size(self.mp_group)

    def read_all(self, idx: list[int]) -> list[bytes | Exception]:
        """Raw tar records of samples ``idx``; with a model-parallel group each rank reads every
        k-th one and the group all-gathers (everyone ends with all of them)."""
        mp_rank, k = self._mp()
        mine = [j for j in range(len(idx)) if j % k == mp_rank]

        def read(j: int) -> bytes | Exception:
            try:
                return read_raw(self.index, idx[j])
            except ShardError as e:
                return e

        got = list(self.pool.map(read, mine)) if self.pool else [read(j) for j in mine]
        self.bytes_read += sum(len(g) for g in got if isinstance(g, bytes))
        if k == 1:
            return got
        from vfm_core.data.gather import all_gather_bytes

        return all_gather_bytes(got, n_total=len(idx), group=self.mp_group)

    def load(self, i: int, raw: bytes | Exception, *, position: int) -> Sample:
        """Sample ``i`` (at global ``position`` of the order) from its raw tar records ``raw``
        (:meth:`read_all`; an exception: its read failed); a bad sample raises
        :class:`~vfm_core.data.shard_reader.SampleError`."""
        row = self.index.row(i)
        key = str(row["key"])
        if isinstance(raw, Exception):
            raise raw
        where = self.index.shard_url(int(row["shard"]))
        if self.checksums:
            check_sample(raw, row.get("checksum"), where=where, key=key)
        s = parse_indexed(self.index, i, raw, where=where)  # foreign: + its sidecar range
        frames = mp4 = None
        if self.decode == "frames" and s.latent is None:
            from vfm_core.video.io import VideoError, decode_frames

            try:
                # slice threads only: frame threading's start-up costs more than a short training
                # clip's decode (measured ~1.8x samples/s, benchmarks/peers.py loader row)
                frames = decode_frames(io.BytesIO(s.mp4), threads="SLICE")  # (T, H, W, 3) uint8
            except VideoError as e:
                raise SampleError(
                    f"{where} sample {key}", f"clip does not decode ({e.reason})"
                ) from None
            self._check_decoded(frames, row, i, f"{where} sample {key}")
        elif self.decode == "none":
            mp4 = s.mp4
        return Sample(
            key=key,
            position=position,
            index=i,
            meta=s.meta,
            txt_emb=s.txt_emb,
            grid=self.geometry.grid(i),
            frames=frames,
            mp4=mp4,
            latent=s.latent,
            bucket=self.geometry.bucket_shape(i),
        )

    def _check_decoded(self, frames: np.ndarray, row: dict[str, Any], i: int, where: str) -> None:
        """A decoded clip has the index's height and width and at least the frames that its
        bucket or token grid takes (a damaged clip decodes to fewer: skipped here, named, rather
        than failing the tokenizer with a shape error)."""
        t, h, w = frames.shape[:3]
        if (h, w) != (int(row["height"]), int(row["width"])):
            raise SampleError(
                where, f"clip decodes to {h}x{w} px, the index says {row['height']}x{row['width']}"
            )
        bucket = self.geometry.bucket_shape(i)
        if bucket is not None:
            need = bucket[2]
        else:  # the latent frames of its token grid, in pixel frames (causal: 1 + ct * (n - 1))
            geo = self.geometry
            need = 1 + geo.compression[0] * (geo.grid(i)[0] * geo.patch[0] - 1)
            need = min(need, int(row["frames"]))
        if t < need:
            raise SampleError(
                where,
                f"clip decodes to {t} of its {row['frames']} frames (damaged), {need} are needed",
            )
