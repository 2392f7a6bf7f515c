"""``make demo``: the whole pipeline on the built-in synthetic sample, on CPU, then where to look.

sample videos → curate → shard → tokenizer → encode latents → train dit-tiny → generate → report,
as one Prefect flow (flows/pipeline.py) with every run in MLflow. A second ``make demo`` resumes:
finished stages are skipped (``make clean`` starts over). ``VFM_DEMO_STEPS`` sets the DiT steps.
"""

from __future__ import annotations

import os
import sys
import time

from flows.pipeline import PipelineParams, pipeline_flow
from vfm_core.tracking import ui_hint


def main() -> int:
    t0 = time.time()
    params = PipelineParams(
        name="demo",
        train_steps=int(os.environ.get("VFM_DEMO_STEPS", "1000")),
        tokenizer_steps=int(os.environ.get("VFM_DEMO_TOKENIZER_STEPS", "800")),
        overrides=["optim.lr=0.001"],
        experiment="vfm-demo",
    )
    out = pipeline_flow(params)
    tr = out["train"]
    print("\n" + "=" * 78)
    print(f"demo done in {time.time() - t0:.0f} s: {out['work_dir']}")
    print(out["report"])
    print()
    if out.get("generate"):
        for video in out["generate"]["videos"]:
            print(f"  generated:   {video['mp4']}  (+ .gif)")
    print(f"  checkpoint:  {tr['checkpoint']}")
    print(f"  report:      {out['work_dir']}/report.md")
    print(f"  MLflow:      run {tr['mlflow_run_id']}, experiment vfm-demo")
    print(f"  look at it:  {ui_hint()}   then open http://127.0.0.1:5000")
    print("=" * 78)
    return 0


if __name__ == "__main__":
    sys.exit(main())
