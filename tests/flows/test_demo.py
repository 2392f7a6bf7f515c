"""The demo at reduced size, through `make demo`'s own entry point (flows.demo.main) and
parameters, for the autoregressive family (`make demo FAMILY=autoregressive`): the captioned
sample, evaluation and report, and the headline metrics both families log on the pipeline's
MLflow run. The diffusion family's demo is the same flow (flows.pipeline) with the diffusion
recipe, which tests/flows/test_pipeline_flow.py runs end to end with the same report and
evaluation; running it here again would only repeat it (CI time, issue #45)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vfm_core.pipeline_report import HEADLINE, TOKENIZER_HEADLINE

REDUCED = {
    "VFM_NO_SERVICES": "1",
    "VFM_DEMO_VIDEOS": "2",
    "VFM_DEMO_STEPS": "3",
    "VFM_DEMO_TOKENIZER_STEPS": "3",
    "VFM_DEMO_EVAL_SAMPLES": "4",
    "VFM_DEMO_EVAL_PROMPTS": "2",
}
TOKENIZER = {f"tokenizer_{k}" for k in TOKENIZER_HEADLINE}
ONE_FAMILY = {"heldout_bits_per_token", "tokenizer_codebook_usage"}  # autoregressive only
BOTH = (set(HEADLINE) | TOKENIZER) - ONE_FAMILY - {k for k in HEADLINE if k.endswith("held_out")}
"""What both families log (the held-out combinations only when a reduced prompt set has them)."""


@pytest.mark.slow
def test_demo_at_reduced_size(prefect_api, data_root, monkeypatch):
    import contextlib
    import io

    import mlflow

    from flows.demo import main

    for k, v in {**REDUCED, "VFM_DEMO_FAMILY": "autoregressive"}.items():
        monkeypatch.setenv(k, v)
    # not capsys: Prefect's console handler keeps the stream it first wrote to, and capsys
    # closes its stream after each test
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main() == 0
    out = buf.getvalue()
    name = "demo-ar"
    work = data_root / "pipeline" / name
    report = (work / "report.md").read_text()
    assert report in out  # the demo prints its report, then where to look
    assert "| prompt following | 2 vocabulary prompts" in report
    assert "x lower than untrained" in report and "two halves of the data" in report
    assert f"report:      {work}/report.md" in out and "MLflow UI:" in out
    assert (work / "generated" / "prompt_following.png").stat().st_size > 0
    times = json.loads((work / "stage_times.json").read_text())  # benchmarks/demo_time.py reads it
    stages = ["sample", "curate", "shard", "tokenizer", "encode", "train", "generate", "report"]
    assert list(times) == stages and all(t["seconds"] > 0 for t in times.values()), times
    assert "Stage times: sample " in report and " s in all, load average " in report
    runs = mlflow.search_runs(
        experiment_names=["vfm-demo"],
        filter_string=f"tags.`vfm.pipeline` = '{name}'",
        output_format="list",
    )
    metrics = runs[0].data.metrics
    assert BOTH <= set(metrics) <= set(HEADLINE) | TOKENIZER
    # the autoregressive family's own rows and metrics
    assert "| train | ar-tiny 3 steps" in report and "bits/token" in report
    assert "of the codebook used" in report and 0 < metrics["tokenizer_codebook_usage"] <= 1
    assert 0 < metrics["heldout_bits_per_token"]
    tokens = np.load(work / "generated" / "video_000.tokens.npy", allow_pickle=False)
    assert tokens.shape == (3, 8, 8) and 0 <= tokens.min() and tokens.max() < 256
    # the demo's top-k reaches the videos' and the evaluation's token draws (logged params)
    assert mlflow.search_runs(
        experiment_names=["vfm-demo"], filter_string="params.top_k = '16'", output_format="list"
    )
