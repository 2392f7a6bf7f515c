"""Clip search: vector index backends, caption / like search over a tiny clips dir, the index
cache, ``vfm search`` and the Prefect subset task."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vfm_core.cli import main as vfm
from vfm_core.search import (
    ClipSearch,
    ClipSearchConfig,
    ExactIndex,
    FaissIndex,
    IndexConfig,
    SearchError,
    load_index,
    search_clips,
)
from vfm_core.search.cache import CACHE_DIR
from vfm_core.search.manifest import read_manifest

CAPTIONS = {
    "c0": "a red circle moving right",
    "c1": "a blue square sliding left",
    "c2": "a white car driving on a wet road at night",
    "c3": "green leaves of a tree in the wind",
    "c4": "",  # no caption: found by --like only
}
EXACT = ClipSearchConfig(index=IndexConfig(backend="exact"))


def write_clips_dir(
    root: Path,
    *,
    videos: bool = False,
    drop: tuple[str, ...] = (),
    captions: dict[str, str] = CAPTIONS,
) -> Path:
    """``root/clips.parquet`` (+ tiny real mp4s under clips/ when ``videos``)."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    ids = list(captions)
    if videos:
        from vfm_core.video.synthetic import Segment, VideoSpec, make_video

        (root / "clips").mkdir(exist_ok=True)
        for i, cid in enumerate(ids):
            spec = VideoSpec(
                width=32, height=24, fps=8.0, seed=i, segments=(Segment(kind="moving", n_frames=6),)
            )
            make_video(root / "clips" / f"{cid}.mp4", spec)
    cols = {
        "clip_id": ids,
        "video_id": [f"v{i // 2}" for i in range(len(ids))],
        "uri": [f"clips/{c}.mp4" for c in ids],
        "caption": [captions[c] for c in ids],
        "embedding": rng.standard_normal((len(ids), 16)).astype(np.float32).tolist(),
    }
    table = pa.table({k: v for k, v in cols.items() if k not in drop})
    pq.write_table(table, root / "clips.parquet")
    return root


@pytest.fixture(scope="module")
def clips_dir(tmp_path_factory) -> Path:
    return write_clips_dir(tmp_path_factory.mktemp("search") / "clips", videos=True)


def run(capsys, *args: str) -> tuple[int, str, str]:
    try:
        rc = vfm(["search", *args])
    except SystemExit as e:  # argparse errors
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


# ----------------------------------------------------------------------------- vector index


def test_faiss_agrees_with_exact_on_small_data(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((400, 32)).astype(np.float32)  # (N, D)
    q = rng.standard_normal((20, 32)).astype(np.float32)  # (Q, D)
    exact = ExactIndex(x)
    s_ex, i_ex = exact.search(q, 5)  # (Q, 5)
    assert (np.diff(s_ex, axis=1) <= 0).all()  # best first
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
        x / np.linalg.norm(x, axis=1, keepdims=True)
    ).T  # (Q, N)
    brute = np.argsort(-cos, axis=1)[:, :5]
    assert (i_ex == brute).all()
    ivf = FaissIndex.build(x, IndexConfig(faiss_kind="ivf", nprobe=10_000))  # probes every list
    s_ivf, i_ivf = ivf.search(q, 5)
    assert ivf.config.nlist == 400 // 39 and (i_ivf == i_ex).all()
    np.testing.assert_allclose(s_ivf, s_ex, atol=1e-5)
    hnsw = FaissIndex.build(x, IndexConfig(faiss_kind="hnsw"))
    assert np.mean([len(set(a) & set(b)) / 5 for a, b in zip(hnsw.search(q, 5)[1], i_ex)]) > 0.95
    for index in (exact, ivf, hnsw):  # save -> load: same answers, no pickle involved
        url = index.save(str(tmp_path / index.config.backend / index.config.faiss_kind))
        again = load_index(url)
        assert type(again) is type(index) and len(again) == 400
        assert (again.search(q, 5)[1] == index.search(q, 5)[1]).all()
    assert exact.search(q[:1], 1000)[1].shape == (1, 400)  # k > N: every row once
    with pytest.raises(SearchError, match="not a readable vector index"):
        load_index(str(tmp_path / "nothing"))


# ----------------------------------------------------------------------------- clip search


def test_caption_query_ranks_the_matching_caption_first(clips_dir):
    search = ClipSearch(str(clips_dir), EXACT)
    hits = search.query("red circle")
    assert hits[0].clip_id == "c0" and hits[0].caption == CAPTIONS["c0"]
    assert [h.rank for h in hits] == [1, 2, 3, 4]  # c4 has no caption: not in the caption index
    assert search.query("a car at night", top_k=1)[0].clip_id == "c2"
    assert Path(hits[0].uri).is_absolute() and Path(hits[0].uri).exists()
    faiss_hits = ClipSearch(str(clips_dir)).query("red circle")
    assert [h.clip_id for h in faiss_hits] == [h.clip_id for h in hits]


def test_like_returns_the_clip_itself_first(clips_dir):
    for cfg in (EXACT, ClipSearchConfig()):
        _, hits = search_clips(str(clips_dir), like="c4", config=cfg)
        assert hits[0].clip_id == "c4" and hits[0].score == pytest.approx(1.0, abs=1e-5)
        assert len(hits) == 5


def test_index_cache_is_reused_and_rebuilt_when_the_manifest_changes(tmp_path):
    root = write_clips_dir(tmp_path / "clips")
    first = ClipSearch(str(root)).index("embedding")
    assert first.built and Path(first.url, "rows.json").exists()
    again = ClipSearch(str(root)).index("embedding")
    assert not again.built and again.url == first.url
    write_clips_dir(root, captions={**CAPTIONS, "c5": "a new clip"})  # the manifest changes
    changed = ClipSearch(str(root)).index("embedding")
    assert changed.built and changed.url != first.url and len(changed.index) == 6
    assert [p.name for p in (root / CACHE_DIR).iterdir()] == [Path(changed.url).name]
    # the exact and faiss indexes of one manifest live side by side: alternating loads each
    exact = ClipSearch(str(root), EXACT).index("embedding")
    assert exact.built and exact.url != changed.url
    assert not ClipSearch(str(root)).index("embedding").built
    assert not ClipSearch(str(root), EXACT).index("embedding").built
    Path(changed.url, "rows.json").unlink()  # an incomplete cache folder is rebuilt
    assert ClipSearch(str(root)).index("embedding").built
    write_clips_dir(root, captions={**CAPTIONS, "c6": "another clip"})  # both are stale now
    latest = ClipSearch(str(root)).index("embedding")
    assert [p.name for p in (root / CACHE_DIR).iterdir()] == [Path(latest.url).name]


# ----------------------------------------------------------------------------- vfm search


def test_cli_table_json_like_and_sheet(clips_dir, capsys, tmp_path):
    rc, out, err = run(capsys, str(clips_dir), "a red circle", "--top", "2", "--exact")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "score", "clip_id", "caption", "uri"]
    assert len(lines) == 3 and lines[1].split()[:3][::2] == ["1", "c0"]
    assert "2 of 4 clips (1 more without a caption: not searched), exact index" in err  # c4
    rc, out, err = run(capsys, str(clips_dir), "a red circle", "--top", "2", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["clip_id"] for r in rows][0] == "c0" and len(rows) == 2
    assert set(rows[0]) == {"rank", "clip_id", "score", "caption", "uri"}
    sheet = tmp_path / "hits.png"
    rc, out, err = run(
        capsys, str(clips_dir), "--like", "c1", "--top", "3", "--json", "--sheet", str(sheet)
    )
    assert rc == 0, err
    assert json.loads(out)[0]["clip_id"] == "c1" and f"contact sheet: {sheet}" in err
    assert "3 of 5 clips, faiss index" in err  # every clip has an embedding: none left out
    from PIL import Image

    with Image.open(sheet) as im:
        assert im.height > 3 * 24 and im.width > 6 * 32


@pytest.mark.parametrize(
    "args, needle",
    [
        (["{dir}", "   "], "the query is empty"),
        (["{dir}"], "give a text query or --like CLIP_ID"),
        (["{dir}", "red", "--like", "c0"], "not both"),
        (["{dir}", "--like", "nope"], "--like: no clip 'nope' in"),
        (["{dir}", "red", "--top", "0"], "--top must be >= 1, got 0"),
        (["{dir}", "red", "--top", "x"], "--top must be an integer"),
        (["{empty}", "red"], "no readable clips.parquet"),
        (["{nocap}", "red"], "no caption column; text search needs captions"),
        (["{blank}", "red"], "all 5 captions are empty"),
        (["{noemb}", "--like", "c0"], "no embedding column; --like needs clip embeddings"),
        (["{zero}", "--like", "c0"], "{zero} has no clips ("),  # segfaulted in pyarrow
        (["{zero}", "--like", "c0", "--exact"], "{zero} has no clips ("),
        (["{zero}", "red"], "{zero} has no clips ("),  # not "all 0 captions are empty"
        (["{intid}", "--like", "1"], "clip_id column is int64, expected strings"),
        (["{fifo}", "red"], "not a regular file (a named pipe (FIFO))"),  # blocked forever
        (["{afile}", "red"], "{afile}: not a folder; expected a curated clips dir"),
        (["{dir}", "red", "--sheet", "{afile}/x.png"], "--sheet {afile}/x.png: cannot make its"),
        (["{dir}", "red", "--sheet", "{empty}"], "give a path ending in .png"),
        (["{dir}", "red", "--sheet", "{fifo}/p.png"], "named pipe (FIFO), not a file to write"),
        (["{dir}", "red", "--sheet", "{fifo}/d.png"], "d.png: a directory, not a file to write"),
        (["{dir}", "red", "--sheet", "s3://b/x.png"], "written locally, give a local path"),
        (
            ["{dir}", "--jsn", "red"],
            "unrecognized arguments: --jsn red (--jsn: did you mean --json",
        ),
        (["{dir}", "red", "--top", "2", "blue"], "unrecognized arguments: blue"),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, clips_dir, tmp_path, capsys):
    dirs = {
        "dir": clips_dir,
        "empty": tmp_path / "empty",
        "nocap": write_clips_dir(tmp_path / "nocap", drop=("caption",)),
        "blank": write_clips_dir(tmp_path / "blank", captions=dict.fromkeys(CAPTIONS, " ")),
        "noemb": write_clips_dir(tmp_path / "noemb", drop=("embedding",)),
        "zero": tmp_path / "zero",  # a curation whose every input was rejected
        "intid": tmp_path / "intid",
        "fifo": tmp_path / "fifo",
        "afile": tmp_path / "afile",
    }
    (tmp_path / "empty").mkdir()
    full = pq.read_table(clips_dir / "clips.parquet")
    for name, table in [
        ("zero", full.slice(0, 0)),
        ("intid", full.set_column(0, "clip_id", pa.array(range(len(full))))),
    ]:
        dirs[name].mkdir()
        pq.write_table(table, dirs[name] / "clips.parquet")
    dirs["fifo"].mkdir()
    os.mkfifo(dirs["fifo"] / "clips.parquet")  # a writer never comes: opening it would block
    os.mkfifo(dirs["fifo"] / "p.png")
    (dirs["fifo"] / "d.png").mkdir()
    dirs["afile"].write_text("not a folder")
    rc, out, err = run(capsys, *[a.format(**dirs) for a in args])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert lines[0].startswith("vfm search: error: "), lines[0]
    assert needle.format(**dirs) in lines[0], lines[0]
    assert not (tmp_path / "empty" / CACHE_DIR).exists()


def test_the_query_may_follow_the_flags(clips_dir, capsys):
    want = run(capsys, str(clips_dir), "a red circle", "--top", "2", "--exact", "--json")
    assert want[0] == 0 and len(json.loads(want[1])) == 2, want[2]
    for args in (
        [str(clips_dir), "--top", "2", "--exact", "--json", "a red circle"],
        ["--exact", str(clips_dir), "--json", "--top", "2", "a red circle"],
    ):
        assert run(capsys, *args)[:2] == want[:2], args


def test_a_manifest_without_rows_names_no_clip_and_does_not_crash(clips_dir, tmp_path):
    """``row_of`` on 0 rows: pyarrow's indices_nonzero(equal(...)) segfaulted there."""
    pq.write_table(
        pq.read_table(clips_dir / "clips.parquet").slice(0, 0), tmp_path / "clips.parquet"
    )
    with pytest.raises(SearchError, match=r"no clip 'c0' in .* \(0 clips\)"):
        read_manifest(str(tmp_path)).row_of("c0")


# ----------------------------------------------------------------------------- Prefect task


def test_search_subset_task_writes_the_subset_manifest(clips_dir, tmp_path):
    from tasks.search import search_subset_task

    work = tmp_path / "clips"
    shutil.copytree(clips_dir, work, ignore=shutil.ignore_patterns(CACHE_DIR))
    out = search_subset_task.fn(str(work), "a car at night", 2, str(tmp_path / "subset"))
    assert out["n_clips"] == 2 and out["clip_ids"][0] == "c2"
    sub, full = pq.read_table(out["clips"]), pq.read_table(work / "clips.parquet")
    assert sub.schema.equals(full.schema, check_metadata=False)
    assert sub.column("clip_id").to_pylist() == out["clip_ids"]
    assert all(Path(u).is_absolute() and Path(u).exists() for u in sub.column("uri").to_pylist())
    meta = json.loads(Path(out["search"]).read_text())
    assert meta["query"] == "a car at night" and meta["hits"][0]["clip_id"] == "c2"


# ----------------------------------------------------------------------------- s3://


@pytest.fixture
def s3(monkeypatch):
    """moto's S3-protocol server on 127.0.0.1 with a bucket ``vfm-search``."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    import socket

    import fsspec

    from vfm_core import storage

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    fsspec.filesystem("s3").clear_instance_cache()
    fs, _ = storage.filesystem("s3://vfm-search")
    fs.mkdir("vfm-search")
    yield fs
    fs.rm("vfm-search", recursive=True)  # moto's backend is process-global
    fs.clear_instance_cache()
    server.stop()


def test_search_an_s3_clips_dir(s3, clips_dir, capsys, tmp_path):
    s3.put(str(clips_dir / "clips.parquet"), "vfm-search/clips/clips.parquet")
    s3.put(str(clips_dir / "clips"), "vfm-search/clips/", recursive=True)
    url = "s3://vfm-search/clips"
    for how in ("built", "cached"):
        rc, out, err = run(
            capsys, url, "--like", "c2", "--top", "2", "--json", "--sheet", str(tmp_path / "s3.png")
        )
        assert rc == 0, err
        hits = json.loads(out)
        assert hits[0]["clip_id"] == "c2" and hits[0]["uri"] == f"{url}/clips/c2.mp4"
        assert f"({how}: {url}/_search/embedding-" in err
    assert (tmp_path / "s3.png").stat().st_size > 0


def test_reading_a_manifest_never_aborts_the_interpreter_at_exit(tmp_path):
    """Arrow's threaded read of in-memory parquet bytes aborted 1 process exit in 5 to 30 after
    reading a manifest ('terminate called without an active exception', rc 134;
    apache/arrow#33975): twelve processes that read one and exit all exit cleanly (a guard
    that caught the threaded read in 1 run of 3)."""
    import subprocess
    import sys

    n = 13
    table = pa.table(
        {
            "clip_id": pa.array([f"c{i}" for i in range(n)], pa.large_string()),
            "uri": pa.array([f"clips/c{i}.mp4" for i in range(n)], pa.large_string()),
            "caption": pa.array(["a red disc moving right"] * n, pa.large_string()),
            "embedding": pa.array([np.ones(512, np.float32)] * n, pa.large_list(pa.float32())),
        }
    )
    pq.write_table(table, tmp_path / "clips.parquet")
    code = f"from vfm_core.search.manifest import read_manifest; read_manifest({str(tmp_path)!r})"
    rcs = [
        subprocess.run([sys.executable, "-c", code], capture_output=True).returncode
        for _ in range(12)
    ]
    assert rcs == [0] * 12
