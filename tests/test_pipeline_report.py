"""The pipeline report builder on hand-made stage summaries (no Prefect, no MLflow server)."""

from __future__ import annotations

import math

from vfm_core.pipeline_report import headline_metrics, pipeline_report

STAGES = {
    "work_dir": "/w",
    "reused": ["curate", "shard", "tokenizer", "encode", "train"],
    "curate": {"n_clips": 4, "n_rejects": 1, "clips": "/w/curated/clips.parquet"},
    "shard": {"n_samples": 4, "n_shards": 1, "index": "/w/shards/index.json"},
    "tokenizer": {
        "preset": "tok-tiny",
        "psnr": 30.0,
        "baseline_psnr": 20.0,
        "ssim": 0.9,
        "baseline_ssim": 0.5,
        "codebook_usage": math.nan,
        "dir": "/w/tokenizer",
    },
    "train": {"step": 2, "final": {"loss": 0.5, "mfu": 0.01}, "mlflow_run_id": "r-train"},
    "generate": {
        "videos": [{"mp4": "/w/generated/video_000.mp4"}],
        "metrics": {
            "heldout_loss": 0.4,
            "frechet_distance": 0.2,
            "prompt_colour_acc": 0.5,
            "prompt_direction_acc": 0.25,
        },
        "mlflow_run_id": "r-gen",
    },
}


def test_report_rows_and_where_the_runs_are():
    text = pipeline_report(STAGES, name="p", recipe="dit-tiny", experiment="e", parent_run_id="P")
    assert text.startswith("# vfm pipeline `p`")
    assert "| curate | 4 clips, 1 rejects: `/w/curated/clips.parquet` |" in text
    assert "| tokenizer | tok-tiny, PSNR 30.0 dB" in text and "codebook" not in text
    assert "| train | dit-tiny 2 steps, loss 0.5000, MFU 1.0%" in text
    assert "| generate | 1 videos; held-out loss 0.4000, Fréchet distance 0.200" in text
    assert "| prompt following | 0 vocabulary prompts" in text
    runs = text.splitlines()[-1]  # generate ran now, train was reused
    assert "with the evaluate / generate runs nested under it" in runs
    assert "not nested here: train run `r-train`" in runs


def test_headline_metrics_skip_missing_and_nan():
    got = headline_metrics(STAGES)
    assert got["frechet_distance"] == 0.2 and got["tokenizer_psnr"] == 30.0
    assert "fd_ratio_untrained" not in got


def test_finetune_report_rows_and_kept_share():
    from vfm_core.finetune_report import finetune_report

    base = {"prompt_colour_acc": 0.8, "concept_colour_acc": 0.0, "frechet_distance": 0.9}
    rows = {
        "demo model (before)": {**base, "trainable": 0, "wall_s": 0.0},
        "LoRA rank 16": {
            **base,
            "prompt_colour_acc": 0.72,
            "concept_colour_acc": 0.75,
            "trainable": 1234,
            "wall_s": 10.0,
        },
    }
    lines = finetune_report(rows, concept="magenta", steps=5).splitlines()
    assert lines[0] == "# Fine-tuning the demo's model on a new colour: magenta"
    before = next(line for line in lines if line.startswith("| demo model (before)"))
    lora = next(line for line in lines if line.startswith("| LoRA rank 16"))
    assert before.startswith("| demo model (before) | — | — | 0% |")
    assert lora.startswith("| LoRA rank 16 | 1,234 | 10 | 75% |") and "| 90% |" in lora
