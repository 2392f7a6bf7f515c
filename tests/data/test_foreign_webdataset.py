"""Bring your own WebDataset: ``vfm index`` indexes tars written by ``webdataset.TarWriter`` /
``ShardWriter`` in place (caption embeddings in sidecar tars) and our loader reads them; and
``webdataset.WebDataset`` reads the shards we write."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from datagen import hash_embed

from vfm_core.data.foreign_index import (
    ForeignIndexConfig,
    ForeignIndexError,
    index_foreign_shards,
)
from vfm_core.data.index import read_index
from vfm_core.data.loader import build_loader
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

wds = pytest.importorskip("webdataset")
Image = pytest.importorskip("PIL.Image")

# (frames, height, width) of the foreign samples; frames == 1: an image (png / jpg member)
SHAPES = [(5, 32, 32), (1, 40, 48), (9, 32, 48), (1, 32, 32), (5, 48, 32), (1, 48, 40)]


def _mp4(tmp: Path, i: int, frames: int, h: int, w: int) -> bytes:
    path = tmp / f"v{i}.mp4"
    spec = VideoSpec(
        width=w,
        height=h,
        fps=8.0,
        seed=100 + i,
        segments=(Segment(kind="moving", n_frames=frames),),
    )
    make_video(path, spec)
    return path.read_bytes()


def _image(i: int, h: int, w: int, fmt: str) -> bytes:
    y, x = np.mgrid[0:h, 0:w]
    a = np.stack([x * 5 + i, y * 7, (x + y) * 3], -1).astype(np.uint8)  # (H, W, 3)
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format=fmt)
    return buf.getvalue()


def foreign_samples(tmp: Path, *, caption: str = "txt") -> list[dict]:
    """12 webdataset samples: videos (mp4) and images (png / jpg), a caption (``txt`` member or
    a field of the ``json`` member), an extra ``cls`` member; sample 7 has no caption and
    sample 10's key holds a directory (``part/...``)."""
    out = []
    for i in range(12):
        frames, h, w = SHAPES[i % len(SHAPES)]
        key = f"part/s{i:04d}" if i == 10 else f"s{i:04d}"
        s = {"__key__": key, "cls": str(i % 3).encode()}
        if frames > 1:
            s["mp4"] = _mp4(tmp, i, frames, h, w)
        else:
            ext = "png" if i % 4 == 1 else "jpg"
            s[ext] = _image(i, h, w, "PNG" if ext == "png" else "JPEG")
        text = f"foreign sample number {i}"
        if caption == "txt" and i != 7:
            s["txt"] = text.encode()
        if caption == "json":
            s["json"] = json.dumps({"id": i, **({"caption": text} if i != 7 else {})}).encode()
        out.append(s)
    return out


def write_foreign(root: Path, samples: list[dict], maxcount: int = 5) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(root / "data-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for s in samples:
            sink.write(s)
    return root


@pytest.fixture(scope="module")
def foreign_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("foreign")
    return write_foreign(tmp / "wds", foreign_samples(tmp))


def _sha(root: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.glob("*.tar")}


def _epoch(root) -> dict[str, object]:
    loader = build_loader(shards=str(root), seed=0, batch_size=4)
    n = len(loader.index)
    got = {}
    while len(got) < n:
        for s in loader.next_batch().samples:
            got.setdefault(s.key, s)
    return got


def test_index_foreign_tars_in_place_and_our_loader_reads_them(foreign_dir):
    before = _sha(foreign_dir)
    summary = index_foreign_shards(str(foreign_dir), embed=hash_embed)
    assert _sha(foreign_dir) == before  # the foreign data is not rewritten
    assert summary["n_samples"] == 12 and summary["n_shards"] == 3
    assert (summary["n_videos"], summary["n_images"]) == (6, 6)
    assert summary["n_uncaptioned"] == 1 and summary["n_skipped"] == 0
    assert summary["media"] == {"mp4": 6, "png": 3, "jpg": 3}
    assert (foreign_dir / "_vfm" / "emb-000000.tar").exists()

    index = read_index(str(foreign_dir))
    assert index.foreign and index.embedding_dim == 16 and index.sidecars is not None
    row = index.samples.set_index("key").loc["part_s0010"]
    assert row["member_key"] == "part/s0010"  # the index key is sanitised, the tar key kept

    got = _epoch(foreign_dir)
    assert len(got) == 12
    for key, s in got.items():
        i = int(key[-4:])
        frames, h, w = SHAPES[i % len(SHAPES)]
        assert s.frames.shape == (frames, h, w, 3) and s.frames.dtype == np.uint8
        caption = "" if i == 7 else f"foreign sample number {i}"
        assert s.meta["caption"] == caption and s.meta["captioned"] == (i != 7)
        assert s.meta["kind"] == ("image" if frames == 1 else "video")
        assert s.txt_emb.shape == (1, 16) and s.txt_emb.dtype == np.float32
        want = hash_embed([caption])[0].astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(s.txt_emb[0], want)


def test_our_loader_state_and_verify_cover_the_sidecars(foreign_dir, tmp_path):
    index_foreign_shards(str(foreign_dir), embed=hash_embed)
    loader = build_loader(shards=str(foreign_dir), seed=3, batch_size=2, verify="sha256")
    loader.next_batch()
    state = loader.state_dict()
    a = [loader.next_batch().keys for _ in range(3)]
    again = build_loader(shards=str(foreign_dir), seed=3, batch_size=2)
    again.load_state_dict(state)
    assert [again.next_batch().keys for _ in range(3)] == a
    # the dataset fingerprint covers the caption embeddings: another encoder, another dataset
    fp = loader.index.fingerprint()
    index_foreign_shards(str(foreign_dir), embed=lambda c: hash_embed(c, dim=8))
    assert read_index(str(foreign_dir)).fingerprint() != fp
    index_foreign_shards(str(foreign_dir), embed=hash_embed)  # back, for the other tests


def test_webdataset_iterates_our_shards(shard_dir):
    """``vfm shard`` output is a plain WebDataset: webdataset groups and decodes its members."""
    index = read_index(str(shard_dir))
    urls = [str(shard_dir / n) for n in index.shards["name"]]
    seen = {}
    for sample in wds.WebDataset(urls, shardshuffle=False):
        seen[sample["__key__"]] = sample
    assert sorted(seen) == sorted(index.samples["key"])
    from vfm_core.video.io import decode_frames

    for row in index.samples.head(4).itertuples():
        s = seen[row.key]
        assert set(s) >= {"json", "mp4", "txt_emb.npy"}
        meta = json.loads(s["json"])
        emb = np.load(io.BytesIO(s["txt_emb.npy"]), allow_pickle=False)
        assert emb.shape == (1, 16) and meta["frames"] == row.frames
        assert decode_frames(io.BytesIO(s["mp4"])).shape == (row.frames, row.height, row.width, 3)
    # the decoding pipeline works too (npy / json handlers, mp4 left as bytes)
    first = next(iter(wds.WebDataset(urls[:1], shardshuffle=False).decode()))
    assert first["txt_emb.npy"].shape == (1, 16) and isinstance(first["json"], dict)


def test_webdataset_reads_our_sidecars(foreign_dir):
    index_foreign_shards(str(foreign_dir), embed=hash_embed)
    side = sorted(str(p) for p in (foreign_dir / "_vfm").glob("emb-*.tar"))
    got = list(wds.WebDataset(side, shardshuffle=False).decode())
    assert len(got) == 12 and all(g["txt_emb.npy"].shape == (1, 16) for g in got)
    assert {g["vfm.json"]["source"]["key"] for g in got} >= {"part/s0010", "s0000"}


def test_caption_from_json_field_and_skip_uncaptioned(tmp_path):
    root = write_foreign(tmp_path / "wds", foreign_samples(tmp_path, caption="json"))
    cfg = ForeignIndexConfig(caption_key="json:caption", video_key="mp4;png;jpg")
    summary = index_foreign_shards(str(root), embed=hash_embed, config=cfg)
    assert summary["n_samples"] == 12 and summary["n_uncaptioned"] == 1
    got = _epoch(root)
    assert got["s0003"].meta["caption"] == "foreign sample number 3"
    assert got["s0003"].meta["id"] == 3  # the foreign json member is the sample's meta

    cfg = ForeignIndexConfig(caption_key="json:caption", skip_uncaptioned=True)
    summary = index_foreign_shards(str(root), embed=hash_embed, config=cfg)
    assert summary["n_samples"] == 11 and summary["n_skipped"] == 1
    assert summary["n_uncaptioned"] == 1 and "s0007" not in set(read_index(str(root)).samples.key)

    # only the videos: images are skipped and counted
    cfg = ForeignIndexConfig(caption_key="json:caption", video_key="mp4")
    summary = index_foreign_shards(str(root), embed=hash_embed, config=cfg)
    assert summary["n_samples"] == 6 and summary["skipped"] == {"no media member": 6}


def test_bad_foreign_inputs(tmp_path, shard_dir):
    tmp = tmp_path / "src"
    tmp.mkdir()
    mp4 = _mp4(tmp, 0, 5, 32, 32)
    good = [{"__key__": f"k{i}", "mp4": mp4, "txt": b"a caption"} for i in range(3)]
    root = write_foreign(tmp_path / "a", good)

    with pytest.raises(ForeignIndexError, match=r"no sample has a media member webm.*mp4 \(3\)"):
        index_foreign_shards(
            str(root), embed=hash_embed, config=ForeignIndexConfig(video_key="webm")
        )
    with pytest.raises(ForeignIndexError, match="unknown media extension.*decodable are mp4"):
        index_foreign_shards(
            str(root), embed=hash_embed, config=ForeignIndexConfig(video_key="gif")
        )
    with pytest.raises(ForeignIndexError, match="expected a member extension"):
        index_foreign_shards(
            str(root), embed=hash_embed, config=ForeignIndexConfig(caption_key="json:")
        )

    # duplicate keys across shards: both shards named
    dup = tmp_path / "dup"
    for n in range(2):
        write_foreign(dup, [])  # the directory
        with wds.TarWriter(str(dup / f"part-{n}.tar")) as w:
            w.write({"__key__": "same", "mp4": mp4, "txt": b"x"})
    with pytest.raises(ForeignIndexError, match=r"duplicate sample key 'same'.*part-1.tar.*part-0"):
        index_foreign_shards(str(dup), embed=hash_embed)

    # a sample whose members are not contiguous cannot be one byte range
    split = tmp_path / "split"
    split.mkdir()
    with tarfile.open(split / "x.tar", "w") as tar:
        for name, data in [("a.mp4", mp4), ("b.mp4", mp4), ("a.txt", b"late caption")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(ForeignIndexError, match="members of sample 'a' are not contiguous"):
        index_foreign_shards(str(split), embed=hash_embed)

    # compressed only; nothing at all
    gz = tmp_path / "gz"
    gz.mkdir()
    (gz / "data.tar.gz").write_bytes(b"\x1f\x8b" + b"\0" * 64)
    with pytest.raises(ForeignIndexError, match="data.tar.gz: compressed.*decompress it"):
        index_foreign_shards(str(gz), embed=hash_embed)

    # broken media and bad json are skipped with a reason; an unknown member ext is carried
    mixed = [
        *good,
        {"__key__": "bad", "mp4": b"not a video" * 50, "txt": b"c"},
        {"__key__": "badjson", "mp4": mp4, "json": b"{oops"},
        {"__key__": "other", "mp4": mp4, "txt": b"d", "seg.weird": b"\1\2"},
    ]
    root = write_foreign(tmp_path / "mixed", mixed)
    summary = index_foreign_shards(str(root), embed=hash_embed)
    assert summary["n_samples"] == 4 and summary["n_skipped"] == 2
    assert summary["skipped"] == {"media does not decode": 1, "invalid json member": 1}
    assert any("bad" in e for e in summary["skipped_examples"])
    assert _epoch(root)["other"].meta["caption"] == "d"

    # a vfm shard directory is not indexed as foreign data
    with pytest.raises(ForeignIndexError, match="not written by `vfm index`"):
        index_foreign_shards(str(shard_dir), embed=hash_embed)


def test_old_indexes_load_unchanged(shard_dir):
    """An index of our own shards has none of the foreign columns and keeps its fingerprint."""
    from vfm_core import storage

    index = read_index(str(shard_dir))
    assert not index.foreign and index.sidecars is None
    assert "sidecars" not in json.loads(index.to_json())
    assert "media" not in json.loads(index.to_json())["samples"][0]
    assert index.fingerprint() == storage.bytes_hash("".join(index.shards["sha256"]).encode())


def test_vfm_index_then_vfm_train(foreign_dir, tmp_path, capsys):
    """The CLI end to end (~6 s): index with the real caption encoder, then train from the
    foreign shards through the tokenizer (images and videos: a one-latent-frame training shape)."""
    import torch

    from vfm_core.cli import main
    from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

    assert main(["index", str(foreign_dir), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_samples"] == 12 and summary["embedding_dim"] == 384
    b = build_loader(shards=str(foreign_dir), seed=0, batch_size=4).next_batch()
    assert all(s.txt_emb.ndim == 2 and s.txt_emb.shape[1] == 384 for s in b.samples)

    torch.manual_seed(0)
    save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config("tok-tiny")), tmp_path / "tok")
    tok = tmp_path / "tok"
    sets = [
        "data.source=shards",
        f"data.shards={foreign_dir}",
        f"data.tokenizer={tok}",
        "data.latent_frames=1",
        "data.latent_height=4",
        "data.latent_width=4",
        "data.batch_size=2",
        "optim.warmup_steps=1",
    ]
    argv = [
        "train",
        "--recipe",
        "dit-tiny",
        "--steps",
        "2",
        "--no-mlflow",
        "--out",
        str(tmp_path / "run"),
    ] + [a for s in sets for a in ("--set", s)]
    assert main(argv) == 0
    assert "trained dit-tiny to step 2" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(rows) == 2 and all(np.isfinite(r["loss"]) for r in rows)

    # a caption key that no sample has: indexed (uncaptioned, counted) and said so
    import shutil

    copy = shutil.copytree(foreign_dir, tmp_path / "copy")
    assert main(["index", str(copy), "--caption-key", "json:nope"]) == 0
    err = capsys.readouterr().err
    assert "warning: none of the 12 samples has a caption at --caption-key json:nope" in err


def test_foreign_index_schema_checks(foreign_dir, tmp_path):
    """The foreign columns come all or none, with a sidecar table inside the dataset."""
    import shutil

    from vfm_core.data.index_tables import DatasetIndexError

    index_foreign_shards(str(foreign_dir), embed=hash_embed)
    root = tmp_path / "copy"
    shutil.copytree(foreign_dir, root)
    doc = json.loads((root / "index.json").read_text())

    def broken(change) -> None:
        bad = json.loads(json.dumps(doc))
        change(bad)
        (root / "index.json").write_text(json.dumps(bad))
        with pytest.raises(DatasetIndexError):
            read_index(str(root))

    broken(lambda d: [s.pop("emb_length") for s in d["samples"]])
    broken(lambda d: d.pop("sidecars"))
    broken(lambda d: d["sidecars"][0].update(name="../emb-000000.tar"))
    broken(lambda d: d["samples"][0].update(member_key="../evil"))
    broken(lambda d: d["samples"][0].update(emb_offset=10**9))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")
def test_vfm_index_says_what_it_does_not_read(tmp_path, capsys):
    """Files that look like shards but are not read (a FIFO, never opened; .TAR; compressed; in
    a subdirectory) and tar members of no sample are one line each in the text summary."""
    from vfm_core.cli import main

    root = tmp_path / "wds"
    root.mkdir()
    with tarfile.open(root / "a.tar", "w") as tar:
        for name, data in [("README", b"x"), ("s0.mp4", _mp4(tmp_path, 0, 5, 32, 32))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    os.mkfifo(root / "z.tar")  # opening it would block until a writer comes: nobody does
    (root / "c.TAR").write_bytes(b"")
    (root / "d.tar.gz").write_bytes(b"\x1f\x8b")
    (root / "sub").mkdir()
    (root / "sub" / "b.tar").write_bytes(b"")

    assert main(["index", str(root)]) == 0
    err = capsys.readouterr().err
    assert "ignored 1 tar members that belong to no sample" in err and "a.tar: README" in err
    assert "4 files that look like shards not read, e.g. c.TAR: extension not .tar" in err
    summary = index_foreign_shards(str(root), embed=hash_embed)
    assert summary["n_samples"] == 1 and summary["ignored_members"] == 1
    assert summary["not_read"] == [
        "c.TAR: extension not .tar in lower case: rename it",
        "d.tar.gz: compressed: the loader reads byte ranges of plain tars, decompress it",
        "sub/b.tar: in a subdirectory: only tars directly under SHARDS_DIR are read",
        "z.tar: a named pipe (FIFO), not a regular file (never opened)",
    ]

    # a shard, a file, a FIFO index where a directory / an index goes: one line naming it
    assert main(["index", str(root / "a.tar")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"vfm index: error: {root / 'a.tar'}: SHARDS_DIR is not a directory but a file; "
        f"to use this shard pass its directory, {root}"
    )
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "index.json")
    assert main(["index", "--migrate", str(fifo)]) == 2
    assert "index.json: cannot read the dataset index (not a regular file (a named pipe" in (
        capsys.readouterr().err
    )


def test_vfm_index_migrate_refuses_indexing_flags(shard_dir, capsys):
    from vfm_core.cli import main

    argv = ["index", "--migrate", str(shard_dir), "--index-format", "json", "--video-key", "webm"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--migrate converts the existing index as it is" in err
    assert "it takes no --video-key, --index-format" in err
