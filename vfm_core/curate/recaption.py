"""Recaption a finished video: new captions for its clips, without splitting or encoding again.

A finished video's state (`DST/_state/{key}.json`, see `pipeline`) holds its clip rows. Its clips
are captioned again by the curation captioner (`CurateCaptioner`: the sidecar, then the VLM) and
the rows' ``caption`` and ``caption_source`` are rewritten; nothing else in a clip row is derived
from the caption (caption text embeddings are made later, by `vfm shard` and by `vfm search`,
whose cache is keyed by the manifest's bytes). The state is replaced atomically, then the caller
assembles the manifests as after any run. A video is recaptioned when asked (`vfm curate
--recaption`, e.g. after adding or fixing sidecars) or when its captions were made with other
caption settings (another `--vlm`, older caption rules: `CurateConfig.caption_settings`).

With ``require_caption``, a clip left without a caption becomes a filter reject (its file is
removed after the state is written), and a video with clips rejected for having no caption is
curated again, since those clips' files are gone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from vfm_core import storage
from vfm_core.annotate.caption import CurateCaptioner
from vfm_core.curate.clip_stages import caption_clip, no_caption_reason, remove_clip
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.records import VideoRef
from vfm_core.curate.stage_base import local_copy
from vfm_core.video.io import VideoError

log = logging.getLogger(__name__)

NO_CAPTION = "no caption"
"""How the filter reason of a clip rejected for having no caption starts."""


def needs_recaption(state: dict[str, Any], cfg: CurateConfig, *, force: bool) -> bool:
    """Whether a finished video is to be recaptioned: asked (`force`) or other caption settings."""
    return force or state.get("captioner") != cfg.caption_settings()


def recaption_video(
    ref: VideoRef,
    state: dict[str, Any],
    cfg: CurateConfig,
    *,
    captioner: CurateCaptioner,
    state_url: str,
    work_dir: str,
) -> dict[str, Any] | None:
    """`state` with every clip captioned again, written to `state_url` (atomically); None when
    the video is to be curated again instead (clips rejected for no caption, or a clip file that
    cannot be decoded for the VLM)."""
    if cfg.require_caption and any(
        r["stage"] == "filter" and r["reason"].startswith(NO_CAPTION) for r in state["rejects"]
    ):
        return None
    clips, rejects, gone, problems = [], list(state["rejects"]), [], set()
    for row in state["clips"]:
        path = row["uri"]
        if captioner.needs_frames and storage.is_remote(path):
            path = local_copy(path, work_dir)
        cap = caption_clip(captioner, ref.url, row, path.removeprefix("file://"))
        if cap.problem:
            problems.add(cap.problem)
        if cap.source == "none" and cfg.require_caption:
            rejects.append(
                {
                    "source_uri": row["source_uri"],
                    "video_id": row["video_id"],
                    "stage": "filter",
                    "reason": no_caption_reason(cap),
                    "start_s": row["start_s"],
                    "end_s": row["end_s"],
                }
            )
            gone.append(row["uri"])
            continue
        clips.append(row | {"caption": cap.text, "caption_source": cap.source})
    new = state | {
        "settings": cfg.settings_hash(),
        "captioner": cfg.caption_settings(),
        "caption_problems": sorted(problems),
        "clips": clips,
        "rejects": rejects,
    }
    storage.write_bytes(state_url, json.dumps(new).encode())
    for uri in gone:  # after the state: a crash in between leaves a stray file, not a lost clip
        remove_clip(uri)
    return new


def recaption_all(
    refs: list[VideoRef],
    states: dict[str, dict],
    *,
    cfg: CurateConfig,
    force: bool,
    work_dir: str,
    state_url: Callable[[str], str],
) -> tuple[dict[str, dict], list[VideoRef]]:
    """Recaption the finished videos among `refs` (their `states`) that need it (`force`, or
    other caption settings), one captioner for all: (their new states, the videos to curate
    again instead). `state_url(source_uri)` is where a video's state lives."""
    redo = [r for r in refs if needs_recaption(states[r.source_uri], cfg, force=force)]
    if not redo:
        return {}, []
    captioner = CurateCaptioner(cfg.vlm)
    captioner.setup()
    done, again = {}, []
    for r in redo:
        try:
            new = recaption_video(
                r,
                states[r.source_uri],
                cfg,
                captioner=captioner,
                state_url=state_url(r.source_uri),
                work_dir=work_dir,
            )
        except storage.StorageError:
            raise  # the store failed, not the input: fail the run (retry/resume)
        except (VideoError, OSError, ValueError) as e:  # e.g. a clip the VLM cannot decode
            log.warning("recaptioning %s failed (%s); curating it again", r.source_uri, e)
            new = None
        if new is None:
            again.append(r)
        else:
            done[r.source_uri] = new
    return done, again
