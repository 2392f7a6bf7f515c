"""Captions that can be redone: provenance, the majority rule for segment captions, unusable
sidecars, the uncaptioned count, and `recaption` rewriting captions without encoding again."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import polars as pl
import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.contracts import Rejects, read_manifest
from vfm_core.curate import curate
from vfm_core.curate.cli import summary_line
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.pipeline import read_clips


def _src(good_dir, tmp_path: Path) -> tuple[Path, Path]:
    """A source folder with demo0.mp4 and no caption sidecar; (folder, video)."""
    src = tmp_path / "raw"
    src.mkdir()
    video = src / "demo0.mp4"
    os.link(good_dir[0] / "demo0.mp4", video)
    return src, video


def _files(dst: Path) -> dict[str, tuple[int, str]]:
    """Each clip file's mtime (ns) and content hash."""
    return {
        p.name: (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
        for p in sorted((dst / "clips").iterdir())
    }


def test_recaption_after_adding_sidecars_keeps_the_clips(good_dir, tmp_path, caplog):
    src, video = _src(good_dir, tmp_path)
    dst = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="vfm_core.curate.pipeline"):
        first = curate(str(src), str(dst), config=CFG)
    clips = read_clips(str(dst)).sort("start_s")
    n = clips.height
    assert n >= 3 and set(clips["caption_source"]) == {"none"} and set(clips["caption"]) == {""}
    assert first["n_uncaptioned"] == n and first["caption_problems"] == []
    assert f"{n} clips (" in summary_line(first) and f"{n} without caption)" in summary_line(first)
    assert "none of the" in caplog.text and "--recaption" in caplog.text  # says so, once
    files = _files(dst)
    assert len(files) == n

    # per-shot captions: the first clip's segment covers it; the second segment reaches only
    # 0.16 s into the second clip, which keeps the video's caption (no majority)
    c0, c1 = clips.row(0, named=True), clips.row(1, named=True)
    sidecar = {
        "caption": "the whole video",
        "segments": [
            {"start_s": c0["start_s"], "end_s": c0["end_s"], "caption": "the first shot"},
            {"start_s": c1["start_s"] - 0.5, "end_s": c1["start_s"] + 0.16, "caption": "brief"},
        ],
    }
    video.with_suffix(".json").write_text(json.dumps(sidecar))
    same = curate(str(src), str(dst), config=CFG)  # a rerun alone does not look at captions
    assert same["n_skipped"] == 1 and same["n_recaptioned"] == 0 and same["n_uncaptioned"] == n

    again = curate(str(src), str(dst), config=CFG, recaption=True)
    assert again["n_skipped"] == 1 and again["n_recaptioned"] == 1 and again["n_uncaptioned"] == 0
    assert "1 already done, 1 recaptioned" in summary_line(again)
    assert "0 without caption" in summary_line(again)
    new = read_clips(str(dst)).sort("start_s")
    assert new["caption"].to_list() == ["the first shot"] + ["the whole video"] * (n - 1)
    assert new["caption_source"].to_list() == ["segment"] + ["sidecar"] * (n - 1)
    # the same clips: ids, rows and files untouched (no re-split, no re-encode)
    keep = [c for c in clips.columns if c not in ("caption", "caption_source")]
    assert new.select(keep).equals(clips.select(keep))
    assert _files(dst) == files
    assert_covered(dst)
    # the state holds the new captions: a plain rerun keeps them
    rerun = curate(str(src), str(dst), config=CFG)
    assert rerun["n_recaptioned"] == 0
    assert read_clips(str(dst)).sort("start_s")["caption"].to_list() == new["caption"].to_list()


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("demo0.json", '{"caption": "café"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9"),
        ("demo0.txt", "café crème".encode("cp1252"), "not UTF-8 text (byte 0xe9"),
        ("demo0.json", b'{"caption": "x",}', "invalid JSON"),
    ],
)
def test_unusable_sidecar_keeps_the_clips_and_names_the_file(
    good_dir, tmp_path, caplog, name, data, reason
):
    src, video = _src(good_dir, tmp_path)
    (src / name).write_bytes(data)
    dst = tmp_path / "out"
    with caplog.at_level(logging.WARNING, logger="vfm_core.curate.pipeline"):
        out = curate(str(src), str(dst), config=CFG)
    clips = read_clips(str(dst))
    rejects = read_manifest(dst / "rejects.parquet", Rejects)
    # the video is accounted for: clips without the caption, no reject because of the sidecar
    assert clips.height > 0 and set(clips["caption_source"]) == {"none"}
    assert not rejects.filter(pl.col("reason").str.contains("sidecar")).height
    assert set(rejects["stage"]) <= {"split", "filter"}
    assert_covered(dst)
    # one clear reason naming the file: in the result, the log and the summary line
    expected = f"sidecar caption {src / name}: {reason}"
    assert len(out["caption_problems"]) == 1 and out["caption_problems"][0].startswith(expected)
    assert caplog.text.count(expected) == 1
    assert f"unusable caption sidecar: {expected}" in summary_line(out)
    # nothing half-written: the clip files are exactly the manifest's, the states are JSON
    assert sorted(p.name for p in (dst / "clips").iterdir()) == sorted(
        f"{c}.mp4" for c in clips["clip_id"]
    )
    assert not [p for p in dst.rglob("*") if ".tmp" in p.name or ".part" in p.name]
    files = _files(dst)
    # fixed: recaptioned, the problem gone, the clips untouched
    (src / name).write_text('{"caption": "café"}' if name.endswith(".json") else "café crème")
    fixed = curate(str(src), str(dst), config=CFG, recaption=True)
    assert fixed["caption_problems"] == [] and fixed["n_uncaptioned"] == 0
    assert set(read_clips(str(dst))["caption"]) == {
        "café" if name.endswith("json") else "café crème"
    }
    assert _files(dst) == files
    assert_covered(dst)


def test_required_caption_with_unusable_sidecar_rejects_naming_the_file(good_dir, tmp_path):
    src, video = _src(good_dir, tmp_path)
    video.with_suffix(".txt").write_bytes(b"\xff\xfebad")
    dst = tmp_path / "out"
    cfg = CurateConfig(min_len_s=1.0, require_caption=True)
    out = curate(str(src), str(dst), config=cfg)
    rejects = read_manifest(dst / "rejects.parquet", Rejects)
    no_cap = rejects.filter(pl.col("reason").str.starts_with("no caption"))
    assert out["n_clips"] == 0 and no_cap.height > 0
    assert no_cap["reason"].str.contains("demo0.txt: not UTF-8", literal=True).all()
    assert not list((dst / "clips").iterdir())
    assert_covered(dst)
    # fixed and recaptioned: the rejected clips had no files, so the video is curated again
    video.with_suffix(".txt").write_text("a caption at last")
    again = curate(str(src), str(dst), config=cfg, recaption=True)
    assert again["n_skipped"] == 0 and again["n_clips"] > 0 and again["n_uncaptioned"] == 0
    assert_covered(dst)


def test_changed_caption_settings_recaption_and_old_states_are_kept(good_dir, tmp_path):
    src, video = _src(good_dir, tmp_path)
    video.with_suffix(".txt").write_text("from the sidecar")
    dst = tmp_path / "out"
    curate(str(src), str(dst), config=CFG)
    files = _files(dst)
    (state_file,) = [p for p in (dst / "_state").glob("*.json") if not p.name.startswith("_")]
    # a state from before caption provenance: the old settings hash, no captioner, "sidecar"
    state = json.loads(state_file.read_text())
    state["settings"] = CFG.legacy_settings_hash()
    del state["captioner"], state["caption_problems"]
    state_file.write_text(json.dumps(state))
    out = curate(str(src), str(dst), config=CFG)
    assert out["n_skipped"] == 1 and out["n_recaptioned"] == 1
    assert json.loads(state_file.read_text())["captioner"] == CFG.caption_settings()
    assert set(read_clips(str(dst))["caption"]) == {"from the sidecar"}
    assert _files(dst) == files
    # the captioner is not a clip setting: the same clip ids with or without a VLM
    with_vlm = CurateConfig(min_len_s=CFG.min_len_s, vlm="/some/model")
    assert with_vlm.settings_hash() == CFG.settings_hash()
    assert with_vlm.clip_settings() == CFG.clip_settings()
    assert with_vlm.caption_settings() != CFG.caption_settings()


def test_summary_line_counts_uncaptioned_clips():
    out = {
        "n_inputs": 3,
        "n_skipped": 1,
        "wall_s": 1.0,
        "n_clips": 7,
        "clip_s": 20.0,
        "n_uncaptioned": 4,
        "n_rejects": 2,
        "rejected_s": 3.0,
    }
    line = summary_line(out)
    assert "(1 already done)" in line and "7 clips (20.0 s, 4 without caption)" in line
    problems = ["sidecar caption /v/a.json: invalid JSON (x)", "sidecar caption /v/b.txt: y"]
    line = summary_line(out | {"caption_problems": problems, "n_recaptioned": 1})
    assert "(1 already done, 1 recaptioned)" in line
    tail = "sidecar: sidecar caption /v/a.json: invalid JSON (x) (+1 more, see the log)"
    assert line.endswith(tail)


def test_flow_form_and_task_recaption(good_dir, tmp_path):
    from flows.curate import CurateParams
    from tasks.curate import curate_video_task, write_manifests_task

    params = CurateParams(src="a", dst="b")
    assert (
        params.recaption is False and "recaption" in CurateParams.model_json_schema()["properties"]
    )
    src, video = _src(good_dir, tmp_path)
    dst, cfg = str(tmp_path / "out"), CFG.to_dict()
    ref = {"source_uri": str(video), "url": str(video)}
    first = curate_video_task.fn(ref, dst, cfg)
    assert not first["skipped"] and not first["recaptioned"]
    video.with_suffix(".txt").write_text("added later")
    again = curate_video_task.fn(ref, dst, cfg, recaption=True)
    assert again["skipped"] and again["recaptioned"] and again["n_clips"] == first["n_clips"]
    summary = write_manifests_task.fn([ref], dst, cfg, [again])
    assert summary["n_recaptioned"] == 1 and summary["n_uncaptioned"] == 0
    assert set(read_clips(dst)["caption"]) == {"added later"}
    assert_covered(dst)


def test_cli_recaption_flag(good_dir, tmp_path, capsys):
    import argparse

    from vfm_core.curate.cli import add_parser, run

    parser = argparse.ArgumentParser()
    curate_parser = add_parser(parser.add_subparsers())
    assert "--recaption" in curate_parser.format_help()
    src, video = _src(good_dir, tmp_path)
    dst = str(tmp_path / "out")
    assert run(parser.parse_args(["curate", str(src), dst, "--min-len", "1"])) == 0
    assert "without caption" in capsys.readouterr().out
    video.with_suffix(".txt").write_text("added later")
    assert run(parser.parse_args(["curate", str(src), dst, "--min-len", "1", "--recaption"])) == 0
    out = capsys.readouterr().out
    assert "(1 already done, 1 recaptioned)" in out and "0 without caption" in out
