"""The columnar index (``samples.parquet``): same batches and states as the JSON index of the same
dataset, lazy row-group reads, corrupt files named, ``vfm index --migrate``, S3."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from datagen import hash_embed
from loader_worker import batch_digest

from vfm_core.cli import main
from vfm_core.data.columnar import ParquetIndex
from vfm_core.data.columnar_writer import arrow_schema
from vfm_core.data.index import migrate_index, read_index
from vfm_core.data.index_tables import DatasetIndexError
from vfm_core.data.loader import build_loader

RG = 5  # rows per row group: the 24-sample fixture spans 5 row groups
MODES = {
    "unpacked": {"batch_size": 3},
    "packed": {"batch_size": 2, "max_tokens": 96, "buffer_size": 16},
    "buckets": {"batch_size": 2},
}


@pytest.fixture
def pair(shard_dir, tmp_path):
    """(JSON dataset, the same shards with a columnar index)."""
    col = tmp_path / "columnar"
    shutil.copytree(shard_dir, col)
    migrate_index(str(col), row_group_size=RG)
    return shard_dir, col


def _loader(root, mode, **kw):
    extra = {}
    if mode == "buckets":
        from vfm_core.data.buckets import BucketSpec

        extra["buckets"] = BucketSpec(resolutions=((16, 16),), durations=(1, 5))
    return build_loader(shards=str(root), seed=7, decode="none", **MODES[mode], **extra, **kw)


@pytest.mark.parametrize("mode", list(MODES))
def test_parquet_and_json_give_identical_batches_states_and_restores(pair, mode):
    js, col = pair
    a, b = _loader(js, mode), _loader(col, mode, num_workers=2)
    assert isinstance(b.index, ParquetIndex) and not isinstance(a.index, ParquetIndex)
    for _ in range(3):
        assert batch_digest(a.next_batch()) == batch_digest(b.next_batch())
    state = a.state_dict()
    assert b.state_dict() == state and len(json.dumps(state)) < 2000
    expected = [batch_digest(a.next_batch()) for _ in range(4)]
    for root in (col, js):  # a JSON state restores on the columnar index and back
        again = _loader(root, mode)
        again.load_state_dict(state)
        assert [batch_digest(again.next_batch()) for _ in range(4)] == expected
    if mode == "packed":
        assert a.geometry.token_extremes() == b.geometry.token_extremes()  # stats == the scan
    assert a.index.latent_channels() == b.index.latent_channels()


def test_reading_a_sample_touches_only_its_row_group(pair):
    js, col = pair
    index = read_index(str(col))
    assert isinstance(index, ParquetIndex) and index.table.reads == []  # footer only
    assert index.table.n_row_groups == 5 and len(index) == 24
    assert index.row(7) == read_index(str(js)).row(7)
    assert index.table.reads == [("rows", 1)]
    index.geometry(12)
    index.geometry(13)
    index.row(8)
    assert index.table.reads == [("rows", 1), ("geometry", 2)]
    # an unpacked step reads only the row groups of this rank's samples
    ld = build_loader(
        shards=str(col), seed=1, batch_size=2, dp_rank=1, dp_size=4, decode="none", verify="none"
    )
    b = ld.next_batch()
    groups = {("rows", s.index // RG) for s in b.samples}
    assert set(ld.index.table.reads) == groups


def test_truncated_or_corrupt_samples_parquet_is_named(pair):
    _, col = pair
    path = col / "samples.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetIndexError, match=r"samples\.parquet: not a readable parquet"):
        read_index(str(col))
    path.write_bytes(data)
    # garbage over row group 2's first column chunk
    chunk = pq.ParquetFile(path).metadata.row_group(2).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    bad = bytearray(data)
    bad[start : start + 48] = b"\xff" * 48
    path.write_bytes(bytes(bad))
    index = read_index(str(col))
    index.row(0)  # other row groups still read
    with pytest.raises(DatasetIndexError, match=r"samples\.parquet: row group 2"):
        index.row(11)
    # the packer's batched geometry read names the bad row group too
    frames = pq.ParquetFile(path).metadata.row_group(3).column(4)
    assert frames.path_in_schema == "frames"
    start = frames.dictionary_page_offset or frames.data_page_offset
    bad[start : start + 48] = b"\xff" * 48
    path.write_bytes(bytes(bad))
    index = read_index(str(col))
    assert index.geometries(np.array([0, 1, 5])).shape == (3, 7)
    with pytest.raises(DatasetIndexError, match=r"samples\.parquet: row group 3"):
        index.geometries(np.array([0, 16, 23]))


def test_bad_values_in_a_row_group_fail_the_schema_with_its_number(pair):
    _, col = pair
    path = col / "samples.parquet"
    t = pq.read_table(path)
    length = t["length"].to_numpy().copy()
    length[17] = -3  # row group 3
    t = t.set_column(t.schema.get_field_index("length"), "length", [length])
    pq.write_table(t.cast(arrow_schema(False)), path, row_group_size=RG)
    index = read_index(str(col))
    index.row(0)
    with pytest.raises(DatasetIndexError, match=r"row group 3 fails the index schema"):
        index.row(16)


def test_migration_round_trip(pair, capsys):
    js, col = pair
    before = read_index(str(js))
    after = read_index(str(col))
    pd.testing.assert_frame_equal(after.samples, before.samples)  # tools may still ask for all
    assert after.fingerprint() == before.fingerprint()
    assert json.loads((col / "index.v1.json").read_text())["schema_version"] == 1
    doc = json.loads((col / "index.json").read_text())
    assert doc["schema_version"] == 2 and doc["format"] == "parquet" and "samples" not in doc
    assert sum(g[7] for g in doc["stats"]["geometries"]) == 24
    # the one-line command, on a fresh copy; a second run is a no-op
    again = col.parent / "again"
    shutil.copytree(js, again)
    assert main(["index", "--migrate", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["migrated"] is True
    assert main(["index", "--migrate", str(again), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["migrated"] is False
    assert isinstance(read_index(str(again)), ParquetIndex)


def test_columnar_index_on_s3(s3_server, clips_dir):
    from vfm_core.data.shards import ShardWriterConfig, write_shards

    df = pd.read_parquet(clips_dir / "clips.parquet").head(8)
    url = "s3://vfm/datasets/columnar"
    write_shards(
        df,
        url,
        embed=hash_embed,
        base_url=str(clips_dir),
        index_format="parquet",
        config=ShardWriterConfig(target_shard_bytes=15_000),
    )
    index = read_index(url)
    assert isinstance(index, ParquetIndex) and len(index) == 8
    ld = build_loader(shards=index, seed=0, batch_size=4, decode="none")
    batch = ld.next_batch()
    assert len(batch.keys) == 4 and set(batch.keys) <= set(df["clip_id"])
    assert batch.bytes_read == sum(int(index.row(s.index)["length"]) for s in batch.samples)
    assert np.all([s.mp4 for s in batch.samples])


def test_foreign_webdataset_in_columnar_form(tmp_path):
    """``vfm index --index-format parquet``: the second byte range (sidecars) and the foreign
    columns (``member_key`` with a directory, ``media``) read back the same as in JSON."""
    from test_foreign_webdataset import foreign_samples, write_foreign

    from vfm_core.data.foreign_index import index_foreign_shards

    js = write_foreign(tmp_path / "js", foreign_samples(tmp_path))
    col = tmp_path / "col"
    shutil.copytree(js, col)
    index_foreign_shards(str(js), embed=hash_embed)
    index_foreign_shards(str(col), embed=hash_embed, index_format="parquet")
    a, b = read_index(str(js)), read_index(str(col))
    assert isinstance(b, ParquetIndex) and b.foreign and b.sidecars is not None
    assert [b.row(i) for i in range(len(b))] == [a.row(i) for i in range(len(a))]
    la = build_loader(shards=str(js), seed=2, batch_size=4, decode="none")
    lb = build_loader(shards=str(col), seed=2, batch_size=4, decode="none", verify="sha256")
    for _ in range(3):
        assert batch_digest(la.next_batch()) == batch_digest(lb.next_batch())
    assert la.state_dict() == lb.state_dict()


def test_stored_latents_in_columnar_form(clips_dir, tmp_path):
    from vfm_core.data.shards import write_shards

    df = pd.read_parquet(clips_dir / "clips.parquet").head(6)
    lat = {cid: np.full((4, 2, 4, 4), k, np.float32) for k, cid in enumerate(df["clip_id"])}
    kw = {"embed": hash_embed, "base_url": str(clips_dir), "latents": lat}
    write_shards(df, str(tmp_path / "js"), **kw)
    write_shards(df, str(tmp_path / "col"), index_format="parquet", **kw)
    a, b = read_index(str(tmp_path / "js")), read_index(str(tmp_path / "col"))
    assert b.row(2)["latent_shape"] == [4, 2, 4, 4] and list(b.geometry(2)[3:]) == [4, 2, 4, 4]
    assert b.latent_channels() == a.latent_channels() == {4}
    la, lb = (build_loader(shards=x, seed=4, batch_size=2, max_tokens=32) for x in (a, b))
    assert la.geometry.token_extremes() == lb.geometry.token_extremes()
    for _ in range(2):
        assert batch_digest(la.next_batch()) == batch_digest(lb.next_batch())


def test_start_up_checks_read_the_stats_and_say_the_same(pair):
    """The trainer's check that every sample fits a pack names the same sample either way."""
    from types import SimpleNamespace

    from vfm_core.config import ConfigError
    from vfm_core.data.shard_source import ShardLatentSource

    msgs = []
    for root in pair:
        ld = _loader(root, "packed")
        _, most, _ = ld.geometry.token_extremes()
        fake = SimpleNamespace(data=SimpleNamespace(max_tokens=most - 1))
        with pytest.raises(ConfigError, match="smaller than the largest sample") as e:
            ShardLatentSource._check_fits(fake, ld, "DIR")
        msgs.append(str(e.value))
    assert msgs[0] == msgs[1]
