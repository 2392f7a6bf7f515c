"""Curation flow: discover -> per-video curation (probe, split, stitch, transcode, annotate,
filter; retried, resumable) -> validated manifests.

Thin by design: parameters are a pydantic model (a form in the Prefect UI). With executor
"local" each video is one task run, so a crash loses at most the videos in flight (as many run at
once as this process has CPUs: 48 sample videos at once on 2 cores took 85 s where 2 at a time took
36 s, the threads fighting over the interpreter lock and the cores); with "ray"
one task runs all videos through Ray Data (a local instance, or the cluster at `ray_address`),
which balances workers across stages and nodes. Either way a rerun skips finished videos. The
flow holds DST's writer lock while its tasks run (one writer per DST). Never imports torch.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow, unmapped
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field, create_model, model_validator

from flows.forms import Form, with_deployment_defaults
from tasks.curate import curate_ray_task, curate_video_task, discover_task, write_manifests_task
from tasks.events import emit_stage_completed
from tasks.progress import ProgressArtifact
from vfm_core.config_fields import form_fields
from vfm_core.curate.cli import FLAGS, CurationFailed, nothing_curated, summary_line
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.executors import parse_ray_address, share_cpus
from vfm_core.curate.inputs import check_paths
from vfm_core.curate.semdedup import SemDedupConfig
from vfm_core.openmp import usable_cpus
from vfm_core.output_lock import output_lock

FIELDS = tuple(name for name in FLAGS if name != "image_model")
"""The `CurateConfig` fields the form has: the flags of `vfm curate` (one list: an option added
there is on the form too) but the image captioner's model path; generated from the config
(defaults: the same as `vfm curate`'s; bounds, choices, descriptions: the fields' own);
``semdedup`` is `SemDedupConfig`'s ``threshold``."""


class _Paths(Form):
    src: str = Field(..., description="input folder, s3:// prefix or video file")
    dst: str = Field(..., description="output folder or s3:// prefix")


CurateFields = create_model(
    "CurateFields",
    __base__=_Paths,
    __module__=__name__,
    **form_fields(CurateConfig, FIELDS),
    semdedup=form_fields(SemDedupConfig, ("threshold",))["threshold"],
)
"""The paths and the curation settings of the form (:data:`FIELDS`, ``semdedup``)."""


class CurateParams(CurateFields):
    """Form of the curation flow (defaults: `CurateConfig`'s, the same as `vfm curate`)."""

    recaption: bool = Field(
        False,
        description="caption the clips of finished videos again (after adding or fixing caption "
        "sidecars), without splitting or encoding; a changed vlm recaptions anyway",
    )
    executor: Literal["local", "ray"] = Field(
        "local", description="local: one task per video here; ray: all videos on Ray Data"
    )
    ray_address: str | None = Field(
        None,
        description="with ray: HOST:PORT of a running cluster's head, or auto "
        "(None: start a local Ray instance in the task)",
    )

    @model_validator(mode="after")
    def _ray_address(self) -> CurateParams:
        if self.ray_address is not None:
            if self.executor != "ray":
                raise ValueError("ray_address needs executor 'ray'")
            parse_ray_address(self.ray_address)  # ValueError naming the expected forms
        self.config()  # settings that would reject every clip (max_len_s < min_len_s, ...)
        return self

    def config(self) -> CurateConfig:
        return CurateConfig(
            **{name: getattr(self, name) for name in FIELDS},
            semdedup=SemDedupConfig(threshold=self.semdedup),  # type: ignore[attr-defined]
        )


@flow(name="curate", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=usable_cpus()))
def curate_flow(params: CurateParams) -> dict[str, Any]:
    params = with_deployment_defaults(params)
    cfg = params.config().to_dict()
    out = check_paths(params.src, params.dst)  # before any work: both given, DST outside SRC
    refs = discover_task(params.src)
    with output_lock(out, what="dst"):  # one writer per DST: the flow's tasks write it for it
        return _curate(params, refs, cfg)


def _curate(params: CurateParams, refs: list[dict[str, str]], cfg: dict[str, Any]) -> dict:
    """The tasks of the flow, DST's writer lock held."""
    dst = params.dst
    if params.executor == "ray":
        results = curate_ray_task(
            refs, dst, cfg, address=params.ray_address, recaption=params.recaption
        )
    else:
        # usable_cpus() videos at once (the task runner); fewer videos share out the rest, so
        # one long video's clips are still transcoded side by side
        workers = share_cpus(len(refs))
        futures = curate_video_task.map(
            refs,
            dst=unmapped(dst),
            config=unmapped(cfg),
            recaption=unmapped(params.recaption),
            workers=unmapped(workers),
        )
        bar = ProgressArtifact("curate-progress", len(refs), description=f"videos curated ({dst})")
        for done, _ in enumerate(as_completed(futures), 1):  # the run page's bar
            bar.update(done)
        results = [f.result() for f in futures]
    summary = write_manifests_task(refs, dst, cfg, results)
    print(f"{summary_line(summary)} -> {summary['clips']}")
    failed = nothing_curated(summary)
    if failed:  # the run ends Failed here, and the chain's next stage is not started
        raise CurationFailed(failed)
    emit_stage_completed(
        "curate", {"dst": dst, "clips": summary["clips"], "n_clips": summary["n_clips"]}
    )
    return summary


if __name__ == "__main__":
    import sys

    from flows.entry import run_main

    run_main(
        lambda: curate_flow(CurateParams(src=sys.argv[1], dst=sys.argv[2])), name="flows.curate"
    )
