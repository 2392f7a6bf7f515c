"""Prefect tasks around curation: discover, one video (retried) or all videos on Ray, manifests.

Each task wraps one `vfm_core.curate` call, checks its contract at the boundary and returns
small JSON-able results (URIs, counts, rows of one video only when they could not be persisted).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from typing import Any

from prefect import task

from tasks.logs import task_logger
from tasks.retry import unless_input_error
from vfm_core.contracts import AnnotatedClips, Rejects
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.executors import LocalExecutor, RayClusterError, RayExecutor
from vfm_core.curate.inputs import discover_videos, resolve_dst
from vfm_core.curate.pipeline import (
    assemble,
    check_coverage,
    load_state,
    process,
    recaption_finished,
    rows_valid,
)
from vfm_core.curate.records import VideoRef


def _ref(d: dict[str, Any]) -> VideoRef:
    if not isinstance(d, dict) or not {"source_uri", "url"} <= set(d):
        raise ValueError(f"curate task: expected a video ref with source_uri and url, got {d!r}")
    return VideoRef(source_uri=str(d["source_uri"]), url=str(d["url"]))


@task(
    name="curate-discover", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def discover_task(src: str) -> list[dict[str, str]]:
    """Input videos under `src` as [{"source_uri", "url"}]."""
    refs = [dataclasses.asdict(r) for r in discover_videos(src)]
    task_logger().info("%d input videos under %s", len(refs), src)
    return refs


def _process(refs: list[VideoRef], dst: str, cfg: CurateConfig, executor) -> dict[str, dict]:
    work_dir = tempfile.mkdtemp(prefix="vfm-curate-")
    try:
        return process(refs, dst, cfg=cfg, executor=executor, work_dir=work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _recaption(
    refs: list[VideoRef], states: dict[str, dict], dst: str, cfg: CurateConfig, force: bool
) -> tuple[dict[str, dict], list[VideoRef]]:
    """Finished videos recaptioned where asked or needed: (new states, videos to curate again)."""
    work_dir = tempfile.mkdtemp(prefix="vfm-curate-")
    try:
        return recaption_finished(refs, states, dst, cfg=cfg, force=force, work_dir=work_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _result(
    r: VideoRef, dst: str, cfg: CurateConfig, state: dict, skipped: bool, recaptioned: bool
) -> dict:
    """Check the contract of one video's state; its counts (+ the state if not persisted)."""
    rows_valid(state["clips"], AnnotatedClips, what=f"clips of {r.source_uri}")
    rows_valid(state["rejects"], Rejects, what=f"rejects of {r.source_uri}")
    check_coverage([r], {r.source_uri: state})
    persisted = load_state(dst, r, cfg) is not None
    out = {
        "source_uri": r.source_uri,
        "n_clips": len(state["clips"]),
        "n_rejects": len(state["rejects"]),
        "skipped": skipped,
        "recaptioned": recaptioned,
        "state": None if persisted else state,  # unreadable inputs are not persisted
    }
    task_logger().info(
        "%s: %d clips, %d rejects%s",
        r.source_uri,
        out["n_clips"],
        out["n_rejects"],
        (" (already done, recaptioned)" if recaptioned else " (already done)") if skipped else "",
    )
    return out


@task(name="curate-video", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def curate_video_task(
    ref: dict[str, str],
    dst: str,
    config: dict[str, Any],
    recaption: bool = False,
    workers: int = 1,
) -> dict[str, Any]:
    """Curate one video into `dst` (skipped when already finished; its clips captioned again
    with `recaption` or changed caption settings) on `workers` threads (`LocalExecutor`);
    returns its counts."""
    r, cfg, dst = _ref(ref), CurateConfig.from_dict(config), resolve_dst(dst)
    state = load_state(dst, r, cfg)
    recaptioned = False
    if state is not None:
        new, again = _recaption([r], {r.source_uri: state}, dst, cfg, recaption)
        recaptioned = r.source_uri in new
        state = None if again else new.get(r.source_uri, state)
    skipped = state is not None
    if state is None:
        state = _process([r], dst, cfg, LocalExecutor(workers=workers))[r.source_uri]
    return _result(r, dst, cfg, state, skipped, recaptioned)  # contract: valid rows, covered


def retry_unless_no_cluster(task, task_run, state) -> bool:
    """A wrong Ray address fails once, fast; anything else (a node lost mid-run) is retried."""
    try:
        state.result()
    except RayClusterError:
        return False
    except Exception:
        return True
    return True


@task(
    name="curate-ray", retries=1, retry_delay_seconds=5, retry_condition_fn=retry_unless_no_cluster
)
def curate_ray_task(
    refs: list[dict[str, str]],
    dst: str,
    config: dict[str, Any],
    address: str | None = None,
    recaption: bool = False,
) -> list[dict[str, Any]]:
    """Curate all unfinished videos in one Ray Data run (address None: a local Ray instance);
    returns per-video counts like `curate_video_task`. A retry skips the videos that finished;
    finished videos are recaptioned here (with `recaption` or changed caption settings)."""
    vrefs, cfg, dst = [_ref(d) for d in refs], CurateConfig.from_dict(config), resolve_dst(dst)
    done = {r.source_uri: load_state(dst, r, cfg) for r in vrefs}
    finished = [r for r in vrefs if done[r.source_uri] is not None]
    new, again = _recaption(finished, done, dst, cfg, recaption)
    done.update(new)
    done.update({r.source_uri: None for r in again})
    todo = [r for r in vrefs if done[r.source_uri] is None]
    task_logger().info(
        "%d of %d videos to curate on Ray (%s)", len(todo), len(vrefs), address or "local instance"
    )
    states = _process(todo, dst, cfg, RayExecutor(address=address)) if todo else {}
    out = []
    for r in vrefs:
        skipped = done[r.source_uri] is not None
        state = done[r.source_uri] or states[r.source_uri]
        out.append(_result(r, dst, cfg, state, skipped, r.source_uri in new))
    return out


@task(
    name="curate-manifests", retries=1, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def write_manifests_task(
    refs: list[dict[str, str]], dst: str, config: dict[str, Any], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """Validated clips / rejects / videos manifests of all inputs; returns URIs and counts."""
    cfg, dst = CurateConfig.from_dict(config), resolve_dst(dst)
    pending = {x["source_uri"]: x["state"] for x in results if x.get("state") is not None}
    states = {}
    for d in refs:
        r = _ref(d)
        states[r.source_uri] = load_state(dst, r, cfg) or pending.get(r.source_uri) or {}
    vrefs = [_ref(d) for d in refs]
    check_coverage(vrefs, states)  # accepted ∪ rejected = inputs
    out = assemble(dst, [states[r.source_uri] for r in vrefs], cfg.semdedup)
    out.update(
        n_inputs=len(refs),
        n_skipped=sum(bool(x.get("skipped")) for x in results),
        n_recaptioned=sum(bool(x.get("recaptioned")) for x in results),
    )
    return out
