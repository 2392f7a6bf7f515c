"""`curate(src, dst)`: raw videos -> H.264 clips + validated manifests, resumable.

    DST/clips/{clip_id}.mp4     accepted clips (clip_id = hash(video_id, span, clip settings))
    DST/clips.parquet           AnnotatedClips (the shard writer's input)
    DST/rejects.parquet         Rejects: source_uri, stage, reason, start_s / end_s (+ video_id)
    DST/videos.parquet          VideoManifest of the readable inputs
    DST/_state/{key}.json       one per finished input video: its clip and reject rows
    DST/_pending/               clips of unfinished videos, only while a run is going
    DST/.vfm-writer.lock        who is writing DST, only while a run is going (one at a time)

Resumability: a video is finished when all of its final items arrived; its clips are then
committed (moved from DST/_pending, where the encoder writes them, to DST/clips) and its state
file is written atomically. A run discards DST/_pending at its start, at its end and when it
fails (Ctrl-C included), so an interrupted run leaves no clip that no state names (a kill in
the few renames just before a state write excepted: the rerun curates that video again). A rerun
skips inputs whose state file matches (same source, size and settings) and re-runs the rest; clip
ids are deterministic, so a clip committed before a crash is overwritten, never duplicated.
Inputs that failed to be read (stage "read", e.g. a transient S3 error) are not marked finished
and are retried. One run writes DST at a time (:mod:`vfm_core.output_lock`): a second is
refused in one line naming the first. The manifests are rebuilt from the state files of the
current inputs, so accepted ∪ rejected = inputs, always; and within each probed input, its clips
and rejects together cover its whole duration (`coverage`: a short shot, a transition, a
filtered clip is a reject row with its start / end seconds and reason; the summary counts those
seconds).

A damaged state file (truncated, corrupt bytes, not a state object) never stops a run: it is
reported in one warning line and rebuilt from the manifests of the last finished run when
``DST/_state/_manifests.json`` says they were made with the same settings from the same input
bytes; otherwise the video is curated again.

Captions can be redone: ``recaption=True`` (`vfm curate --recaption`) captions the clips of every
finished video again (new or fixed sidecars) and a finished video whose captions were made with
other caption settings (another VLM) is recaptioned anyway; clips are neither split nor encoded
again (`vfm_core.curate.recaption`). A sidecar that cannot be used (not UTF-8, not JSON) is passed
over: the clips are kept without its caption (``caption_source`` none), and the run names the file
and the reason (a warning, ``caption_problems`` in the result, and the summary line).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from vfm_core import storage
from vfm_core.contracts import (
    AnnotatedClips,
    ContractError,
    Rejects,
    VideoManifest,
    empty,
    validate,
    write_manifest,
)
from vfm_core.curate.clip_stages import commit_clips, discard_pending, remove_clips
from vfm_core.curate.coverage import coverage_gaps, seconds
from vfm_core.curate.executors import Executor, get_executor
from vfm_core.curate.inputs import check_paths, discover_videos
from vfm_core.curate.recaption import recaption_all
from vfm_core.curate.records import AnnotatedClip, Item, ProbedVideo, RejectRow, VideoRef
from vfm_core.curate.semdedup import SemDedupConfig, find_duplicates
from vfm_core.curate.stages import CurateConfig, build_stages
from vfm_core.output_lock import output_lock

log = logging.getLogger(__name__)


def _state_url(dst: str, source_uri: str) -> str:
    key = hashlib.sha256(source_uri.encode()).hexdigest()[:20]
    return storage.join(dst, "_state", f"{key}.json")


def _size(url: str) -> int | None:
    try:
        fs, path = storage.filesystem(url)
        return int(fs.size(path))
    except (OSError, ValueError):
        return None


_ASSEMBLED = "_manifests.json"
"""Under DST/_state: the settings and input sizes the current manifests were assembled from."""


def _state_from_manifests(dst: str, ref: VideoRef, cfg: CurateConfig) -> dict[str, Any] | None:
    """`ref`'s state rebuilt from the manifests, when they were assembled with these settings
    from these input bytes (None otherwise, or when they cannot be read)."""
    from vfm_core.contracts import read_manifest

    try:
        rec = json.loads(storage.read_bytes(storage.join(dst, "_state", _ASSEMBLED)))
        sizes = rec["sizes"]
        if (
            rec["settings"] not in (cfg.settings_hash(), cfg.legacy_settings_hash())
            or ref.source_uri not in sizes
            or sizes[ref.source_uri] != _size(ref.url)
        ):
            return None
        rows = {}
        for name, schema in (
            ("clips", AnnotatedClips),
            ("rejects", Rejects),
            ("videos", VideoManifest),
        ):
            df = read_manifest(storage.join(dst, f"{name}.parquet"), schema)
            rows[name] = df.filter(pl.col("source_uri") == ref.source_uri).to_dicts()
    except Exception:  # noqa: BLE001 - no usable manifests: the caller curates the video again
        return None
    if not rows["clips"] and not rows["rejects"]:
        return None
    if any(r["stage"] == "semdedup" for r in rows["rejects"]):
        return None  # its removed clips are in no manifest: curate the video again
    return {
        "source_uri": ref.source_uri,
        "settings": cfg.settings_hash(),
        "captioner": rec.get("captioner"),
        "size_bytes": _size(ref.url),
        "video": (rows["videos"] or [None])[0],
        "clips": rows["clips"],
        "rejects": rows["rejects"],
    }


def load_state(dst: str, ref: VideoRef, cfg: CurateConfig) -> dict[str, Any] | None:
    """The finished state of `ref` under `dst`, if it matches the input and settings. A damaged
    state file is reported (one warning line) and rebuilt from the manifests when they match."""
    url = _state_url(dst, ref.source_uri)
    if not storage.exists(url):
        return None
    try:
        state = json.loads(storage.read_bytes(url))
        if not isinstance(state, dict) or not all(
            isinstance(state.get(k), list) for k in ("clips", "rejects")
        ):
            raise ValueError("not a curation state object")
    except (OSError, ValueError) as e:  # JSON and UTF-8 errors are ValueErrors
        state = _state_from_manifests(dst, ref, cfg)
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        log.warning(
            "curation state %s of %s is damaged (%s); %s",
            url,
            ref.source_uri,
            why,
            "rebuilt from the manifests" if state else "curating the video again",
        )
        if state is None:
            return None
        storage.write_bytes(url, json.dumps(state).encode())
    same = (
        state.get("source_uri") == ref.source_uri
        and state.get("settings") in (cfg.settings_hash(), cfg.legacy_settings_hash())
        and state.get("size_bytes") == _size(ref.url)
    )
    return state if same else None


def _warn_narrow_sources(refs: list[VideoRef], states: dict, out_width: int | None) -> None:
    """One warning naming the videos whose clips are narrower than ``out_width`` (--width): a
    clip is never upscaled, so those keep their source's (or crop's) width."""
    if out_width is None:
        return
    want = max(2, out_width - out_width % 2)
    narrow = {
        r.source_uri: min(c["width"] for c in states[r.source_uri]["clips"])
        for r in refs
        if any(c["width"] < want for c in states[r.source_uri]["clips"])
    }
    if narrow:
        log.warning(
            "curation: --width %d is above the picture of %d video(s), whose clips keep their "
            "own width (never upscaled): %s",
            out_width,
            len(narrow),
            "; ".join(f"{u} ({w} px)" for u, w in list(narrow.items())[:5]),
        )


def _write_state(dst: str, ref: VideoRef, cfg: CurateConfig, finals: list[Item]) -> dict:
    clips = [x.manifest_row() for x in finals if isinstance(x, AnnotatedClip)]
    rejects = [x.manifest_row() for x in finals if isinstance(x, RejectRow)]
    probed = [
        x.clip.span.video if isinstance(x, AnnotatedClip) else x.video
        for x in finals
        if isinstance(x, AnnotatedClip) or x.video is not None
    ]
    video = probed[0].manifest_row() if probed else None
    problems = {x.caption_problem for x in finals if isinstance(x, AnnotatedClip)} - {None}
    state = {
        "source_uri": ref.source_uri,
        "settings": cfg.settings_hash(),
        "captioner": cfg.caption_settings(),
        "caption_problems": sorted(problems),
        "size_bytes": _size(ref.url),
        "video": video,
        "clips": clips,
        "rejects": rejects,
    }
    # clips first: every state names only committed clips (a kill between the two leaves
    # committed clips without a state; the rerun curates the video into the same clip ids)
    commit_clips(dst, [c["clip_id"] for c in clips])
    if any(r["stage"] == "read" for r in rejects):
        return state  # unreadable now: retry on the next run
    url = _state_url(dst, ref.source_uri)
    try:  # the clips its state names now (any settings): those not made again are replaced
        old = json.loads(storage.read_bytes(url))["clips"]
        replaced = {str(c["clip_id"]) for c in old} - {c["clip_id"] for c in clips}
    except (OSError, ValueError, TypeError, KeyError):  # no state, a damaged one
        replaced = set()
    storage.write_bytes(url, json.dumps(state).encode())
    remove_clips(dst, sorted(replaced))  # earlier settings' clips of the video: in no manifest
    return state


def process(
    refs: list[VideoRef],
    dst: str,
    *,
    cfg: CurateConfig,
    executor: Executor,
    work_dir: str,
    progress: bool = False,
) -> dict[str, dict]:
    """Run the stages over `refs`, largest file first; write each video's state as soon as it
    is complete. Largest first: on several workers the longest video's split (one worker's
    work, before any of its clips can start) begins at once while the others fill the rest."""
    by_uri = {r.source_uri: r for r in refs}
    refs = sorted(refs, key=lambda r: -(_size(r.url) or 0))  # stable: ties keep their order
    parts: dict[str, list[Item]] = defaultdict(list)
    states: dict[str, dict] = {}
    stages = build_stages(cfg, dst=dst, work_dir=work_dir)
    bar = _bar(len(refs), progress)
    for item in executor.run(stages, refs):
        if not isinstance(item, AnnotatedClip | RejectRow):
            raise TypeError(f"curation ended with a {type(item).__name__}, not a clip or reject")
        uri = item.source_uri
        parts[uri].append(item)
        if len(parts[uri]) == item.n_parts:
            states[uri] = _write_state(dst, by_uri[uri], cfg, parts.pop(uri))
            bar.update(1)
    bar.close()
    if parts:
        missing = sorted(parts)
        raise RuntimeError(f"curation lost items of {len(missing)} video(s): {missing[:5]}")
    return states


def _discard_pending(dst: str, whose: str, *, quiet: bool = False) -> None:
    """`discard_pending`, logged; `quiet`: on the way out of a failure, whose own error must
    not be hidden by a second one."""
    try:
        n = discard_pending(dst)
    except Exception:  # noqa: BLE001 - the next run's start discards them again
        if not quiet:
            raise
        log.warning("curation: could not delete the uncommitted clips under %s", dst)
        return
    if n:
        log.info("curation: deleted %d uncommitted clip(s) of %s under %s/_pending", n, whose, dst)


def recaption_finished(
    refs: list[VideoRef],
    states: dict[str, dict],
    dst: str,
    *,
    cfg: CurateConfig,
    force: bool,
    work_dir: str,
) -> tuple[dict[str, dict], list[VideoRef]]:
    """Recaption the finished videos among `refs` (their `states`) that need it (`force`, or
    other caption settings): (their new states, the videos to curate again instead)."""
    return recaption_all(
        refs,
        states,
        cfg=cfg,
        force=force,
        work_dir=work_dir,
        state_url=lambda uri: _state_url(dst, uri),
    )


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="video", desc="curate", disable=not enabled, file=sys.stderr)


def _frame(rows: list[dict], schema) -> pl.DataFrame:
    if not rows:
        return empty(schema)
    df = pl.DataFrame(rows, infer_schema_length=None)
    if "embedding" in df.columns:
        df = df.with_columns(pl.col("embedding").cast(pl.List(pl.Float32)))
    return df


def assemble(
    dst: str, states: Iterable[dict], semdedup: SemDedupConfig | None = None
) -> dict[str, Any]:
    """Write clips / rejects / videos manifests (sorted, validated) from per-video states; with
    ``semdedup`` on, near-duplicate clips move to the rejects naming the clip they duplicate.

    Returns the manifest URLs, row counts (``n_audio``: clips with sound), the seconds of source
    in clips (``clip_s``) and in rejects (``rejected_s``), and ``coverage_gaps``: ranges of a
    probed input in no row (logged as a warning; empty unless a stage lost a range)."""
    clips, rejects, videos, problems = [], [], [], []
    first_of: dict[str, str] = {}  # video_id -> first source_uri with that content
    for st in states:
        vid = (st.get("video") or {}).get("video_id")
        if vid is not None and vid in first_of:  # same bytes under another name: one copy only
            rejects.append(
                {
                    "source_uri": st["source_uri"],
                    "video_id": vid,
                    "stage": "probe",
                    "reason": f"duplicate: same content as {first_of[vid]}",
                    "start_s": 0.0,
                    "end_s": float(st["video"].get("duration_s") or 0.0),
                }
            )
            continue
        if vid is not None:
            first_of[vid] = st["source_uri"]
        clips += st["clips"]
        rejects += st["rejects"]
        problems += st.get("caption_problems") or []
        if st.get("video"):
            videos.append(st["video"])
    if semdedup is not None and semdedup.threshold is not None:
        clips, dup_rejects = _semdedup(clips, semdedup)
        rejects += dup_rejects
    cdf = _frame(clips, AnnotatedClips)
    if cdf.height:
        cdf = cdf.sort("source_uri", "start_s")
    rdf = _frame(rejects, Rejects)
    if rdf.height:
        rdf = rdf.with_columns(pl.col("start_s", "end_s").cast(pl.Float64)).sort(
            "source_uri", "start_s", nulls_last=False
        )
    vdf = _frame(videos, VideoManifest)
    if vdf.height:
        vdf = vdf.sort("source_uri")
    gaps = coverage_gaps(
        cdf,
        rdf,
        {v["source_uri"]: v["duration_s"] for v in videos},
        tol_s={v["source_uri"]: 2.0 / v["fps"] for v in videos},
    )
    if gaps:
        log.warning(
            "curation: %d range(s) of the inputs are in no clip and no reject: %s",
            len(gaps),
            "; ".join(map(str, gaps[:5])),
        )
    for p in problems:
        log.warning("%s: its clips have no caption from it (fix it, then --recaption)", p)
    out = {
        "clips": write_manifest(cdf, storage.join(dst, "clips.parquet"), AnnotatedClips),
        "rejects": write_manifest(rdf, storage.join(dst, "rejects.parquet"), Rejects),
        "videos": write_manifest(vdf, storage.join(dst, "videos.parquet"), VideoManifest),
        "n_clips": cdf.height,
        "n_rejects": rdf.height,
        "n_videos": vdf.height,
        "n_uncaptioned": int((cdf["caption_source"] == "none").sum()) if cdf.height else 0,
        "n_audio": int((cdf["audio"] == "kept").sum()) if "audio" in cdf.columns else 0,
        "caption_problems": problems,
        "clip_s": round(seconds(cdf), 3),
        "rejected_s": round(seconds(rdf), 3),
        "coverage_gaps": [str(g) for g in gaps],
        "reject_causes": _causes(rdf),
    }
    return out


def _causes(rejects: pl.DataFrame) -> dict[str, int]:
    """Reject rows per cause (a reason's text before its first colon: "static", "truncated"),
    most frequent first."""
    if not rejects.height:
        return {}
    causes = rejects["reason"].cast(pl.Utf8).str.split(":").list.first().str.strip_chars()
    counts = causes.value_counts(sort=True)
    return {str(c): int(n) for c, n in counts.iter_rows()}


def _semdedup(clips: list[dict], cfg: SemDedupConfig) -> tuple[list[dict], list[dict]]:
    """(kept clips, reject rows of the near-duplicates) — see vfm_core.curate.semdedup."""
    with_emb = [i for i, c in enumerate(clips) if c.get("embedding")]
    if len(with_emb) < 2:
        return clips, []
    emb = np.array([clips[i]["embedding"] for i in with_emb], dtype=np.float32)  # (N, D)
    dups = find_duplicates(emb, [clips[i]["clip_id"] for i in with_emb], cfg)
    gone = {with_emb[d.index]: d for d in dups}
    rejects = []
    for i, d in gone.items():
        c, kept = clips[i], clips[with_emb[d.kept]]
        rejects.append(
            {
                "source_uri": c["source_uri"],
                "video_id": c.get("video_id"),
                "stage": "semdedup",
                "reason": f"near-duplicate of clip {kept['clip_id']} ({kept['source_uri']} "
                f"{kept['start_s']:.2f}-{kept['end_s']:.2f} s): cosine {d.cosine:.3f} >= "
                f"{cfg.threshold:g}",
                "start_s": c.get("start_s"),
                "end_s": c.get("end_s"),
            }
        )
    return [c for i, c in enumerate(clips) if i not in gone], rejects


def check_coverage(refs: list[VideoRef], states: dict[str, dict]) -> None:
    """accepted ∪ rejected = inputs: every input has a state with at least one row."""
    lost = [
        r.source_uri
        for r in refs
        if not (states.get(r.source_uri) or {}).get("clips")
        and not (states.get(r.source_uri) or {}).get("rejects")
    ]
    if lost:
        raise ContractError("curation", "coverage", [f"inputs with no clip and no reject: {lost}"])


def curate(
    src: str,
    dst: str,
    *,
    executor: str | Executor = "local",
    config: CurateConfig | None = None,
    progress: bool | None = None,
    refs: list[VideoRef] | None = None,
    recaption: bool = False,
) -> dict[str, Any]:
    """Curate every video under `src` into `dst`; returns counts and manifest URLs.

    `refs` replaces discovery (e.g. a subset of inputs). Finished inputs (state files from an
    earlier run with the same settings) are skipped; with `recaption` their clips are captioned
    again (also without it when the caption settings changed), never split or encoded again.
    """
    cfg = config or CurateConfig()
    dst = check_paths(src, dst)
    ex = get_executor(executor)  # bad names / settings fail before any work
    cfg.splitter_obj()
    t0 = time.perf_counter()
    refs = discover_videos(src) if refs is None else refs
    if not refs:
        raise storage.StorageError(str(src), "no videos given to curate (an empty subset)")
    # one writer per DST: a second run into it is refused before it reads or removes anything
    with output_lock(dst, what="DST"):
        return _curate_locked(
            refs, dst, cfg=cfg, ex=ex, progress=progress, recaption=recaption, t0=t0
        )


def _curate_locked(
    refs: list[VideoRef],
    dst: str,
    *,
    cfg: CurateConfig,
    ex: Executor,
    progress: bool | None,
    recaption: bool,
    t0: float,
) -> dict[str, Any]:
    """:func:`curate` once DST's writer lock is held: skip, recaption, process, assemble."""
    states: dict[str, dict] = {}
    todo = []
    for r in refs:
        st = load_state(dst, r, cfg)
        if st is None:
            todo.append(r)
        else:
            states[r.source_uri] = st
    if progress is None:
        progress = sys.stderr.isatty()
    work_dir = tempfile.mkdtemp(prefix="vfm-curate-")
    try:
        finished = [r for r in refs if r.source_uri in states]
        recaptioned, again = recaption_finished(
            finished, states, dst, cfg=cfg, force=recaption, work_dir=work_dir
        )
        states.update(recaptioned)
        for r in again:
            del states[r.source_uri]
        todo = [r for r in refs if r.source_uri not in states]
        skipped = len(refs) - len(todo)
        if todo:
            _discard_pending(dst, "an interrupted run")
            if not storage.is_remote(dst):  # DST/clips exists even when no clip is committed
                Path(dst, "clips").mkdir(parents=True, exist_ok=True)
        states.update(
            process(todo, dst, cfg=cfg, executor=ex, work_dir=work_dir, progress=progress)
        )
    except BaseException:  # a failure or Ctrl-C: the unfinished videos' clips go
        _discard_pending(dst, "this failed run", quiet=True)
        raise
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    _discard_pending(dst, "rejected clips")  # e.g. a clip whose annotation failed
    check_coverage(refs, states)
    out = assemble(dst, [states[r.source_uri] for r in refs], cfg.semdedup)
    record = {
        "settings": cfg.settings_hash(),
        "captioner": cfg.caption_settings(),
        "sizes": {r.source_uri: states[r.source_uri].get("size_bytes") for r in refs},
    }
    storage.write_bytes(storage.join(dst, "_state", _ASSEMBLED), json.dumps(record).encode())
    out.update(
        n_inputs=len(refs),
        n_skipped=skipped,
        n_recaptioned=len(recaptioned),
        wall_s=round(time.perf_counter() - t0, 3),
    )
    _warn_narrow_sources(refs, states, cfg.out_width)
    if out["n_clips"] and out["n_uncaptioned"] == out["n_clips"]:
        log.warning(
            "curation: none of the %d clips has a caption: put a caption sidecar (.txt / .json) "
            "beside each video or pass a VLM, then vfm curate --recaption (docs/curation.md)",
            out["n_clips"],
        )
    return out


def read_clips(dst: str) -> pl.DataFrame:
    """`DST/clips.parquet`, validated."""
    from vfm_core.contracts import read_manifest

    return read_manifest(storage.join(dst, "clips.parquet"), AnnotatedClips)


def rows_valid(rows: list[dict], schema, *, what: str) -> None:
    """Validate rows (e.g. one video's state) against a schema; raises ContractError."""
    validate(_frame(rows, schema), schema, what=what)


__all__ = [
    "ProbedVideo",
    "assemble",
    "check_coverage",
    "curate",
    "load_state",
    "process",
    "read_clips",
    "recaption_finished",
    "rows_valid",
]
