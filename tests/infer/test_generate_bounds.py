"""Issue #27, generation: requests whose estimated memory or time exceeds a bound are refused in
one line before anything large is built (``--force`` runs them with a warning), long sampling
shows progress, and ``--out`` is checked writable before any model is loaded."""

from __future__ import annotations

import os
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.infer.conftest import PROMPT
from vfm_core.checkpoints.load import load_dit
from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides, save_yaml, to_dict, validate
from vfm_core.families import build_model
from vfm_core.infer import diffusion_generation, progress, token_generation
from vfm_core.infer import generate as gen
from vfm_core.infer.ar_sample import SamplingConfig, sample_tokens
from vfm_core.infer.budget import (
    BoundExceededWarning,
    GenerateBounds,
    decoder_flops,
    estimate_ar,
)
from vfm_core.infer.generate import GenerateRequest, generate
from vfm_core.infer.shapes import GenerateError, plan_latent
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, get_tokenizer_config

pytestmark = [  # expected here: the latent preview, and sizes beyond the run's training shape
    pytest.mark.filterwarnings("ignore:no tokenizer:UserWarning"),
    pytest.mark.filterwarnings("ignore::vfm_core.infer.shapes.BeyondTrainingWarning"),
]
EMB = np.ones((1, 384), dtype=np.float32) / np.sqrt(384)
SLOW_CPU = GenerateBounds(device_tflops=0.05)  # a stated rate: the time checks do not depend on
# how fast this machine is (50 GFLOP/s, about 2 cores)


def _req(**kw) -> GenerateRequest:
    return GenerateRequest(**{"prompt": PROMPT, "frames": 13, "height": 64, "width": 64, **kw})


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory) -> Path:
    """An untrained ar-tiny run (depth 2) in the `vfm train` layout."""
    root = tmp_path_factory.mktemp("ar-run")
    cfg = validate(apply_overrides(get_recipe("ar-tiny"), ["model.depth=2", "train.device=cpu"]))
    sd = build_model(cfg.model).state_dict()
    state = {"model": sd, "ema": {k: v.clone() for k, v in sd.items()}}
    CheckpointManager(root).save(1, state, meta={"model": to_dict(cfg.model)})
    save_yaml(cfg, root / "config.yaml")
    return root


@pytest.fixture
def nothing_large(monkeypatch):
    """Fail the test if the noise, the text model or the token sampler is reached."""

    def boom(*_a, **_k):
        raise AssertionError("reached the work a refused request must never start")

    for module, name in (
        (diffusion_generation, "initial_noise"),
        (gen, "embed_prompt"),
        (token_generation, "sample_tokens"),
    ):
        monkeypatch.setattr(module, name, boom)


# ------------------------------------------------------------------ cases 14-18: the bounds
def test_dit_huge_size_is_refused_before_anything_is_built(tiny_run, tmp_path, nothing_large):
    """#14: 100000x100000 used to pass 8 GB RSS (the noise alone is 10 GB) before any message."""
    with pytest.raises(GenerateError) as e:
        generate(tiny_run, _req(height=100000, width=100000), tmp_path / "x.mp4")
    msg = str(e.value)
    assert msg.startswith("--frames 13 --size 100000x100000: needs about ")
    assert " TiB of memory (writing: frames " in msg and "--max-memory-gib" in msg
    assert msg.endswith("lower --size or --steps, or pass --force to run anyway")
    assert "\n" not in msg and not (tmp_path / "x.mp4").exists()


def test_dit_large_size_and_long_video_exceed_the_time_bound(tiny_run, tmp_path, nothing_large):
    """#15 4096x4096 (262,144 tokens) and #16 100,001 frames: hours at any CPU rate."""
    with pytest.raises(GenerateError, match=r"^--frames 13 --size 4096x4096: .*would take about "):
        generate(tiny_run, _req(height=4096, width=4096, bounds=SLOW_CPU), tmp_path / "x.mp4")
    with pytest.raises(GenerateError) as e:
        generate(tiny_run, _req(frames=100001, bounds=SLOW_CPU), tmp_path / "x.mp4")
    msg = str(e.value)
    assert msg.startswith("--frames 100001 --size 64x64: ")
    assert " h (" in msg and "FLOPs in 7 model calls at 5e+10 FLOP/s: --device-tflops)" in msg
    assert "over the bound of 10 min (--max-minutes)" in msg
    assert msg.endswith("lower --frames or --steps, or pass --force to run anyway")


def test_ar_huge_and_long_requests_are_refused(ar_run, tmp_path, nothing_large):
    """#17 (a 40 GB KV-cache allocation traceback) and #18 (ran on): refused in one line."""
    with pytest.raises(GenerateError) as e:
        generate(ar_run, _req(frames=9, height=100000, width=100000), tmp_path / "a.mp4")
    assert "TiB of memory" in str(e.value) and "lower --size, or pass --force" in str(e.value)
    with pytest.raises(GenerateError) as e:
        generate(ar_run, _req(frames=100001, bounds=SLOW_CPU), tmp_path / "a.mp4")
    msg = str(e.value)
    assert msg.startswith("--frames 100001 --size 64x64: ") and "1600064 model calls" in msg
    assert msg.endswith("lower --frames, or pass --force to run anyway")


def test_bounds_are_configurable_and_force_runs_with_a_warning(tiny_run, tmp_path):
    tiny = GenerateBounds(max_memory_gib=1e-3, max_minutes=1e-6)
    with pytest.raises(GenerateError) as e:
        generate(tiny_run, _req(steps=1, bounds=tiny), tmp_path / "x.mp4", text_emb=EMB)
    msg = str(e.value)
    assert "over the bound of 1.02 MiB (--max-memory-gib)" in msg
    assert "over the bound of 6e-05 s (--max-minutes)" in msg
    tiny.force = True
    with pytest.warns(BoundExceededWarning, match=r"--max-minutes\); running anyway \(--force\)"):
        res = generate(tiny_run, _req(steps=1, bounds=tiny), tmp_path / "f.mp4", text_emb=EMB)
    assert Path(res.mp4).stat().st_size > 0
    with pytest.raises(GenerateError, match="--max-minutes 0: must be a positive number"):
        generate(tiny_run, _req(bounds=GenerateBounds(max_minutes=0)), tmp_path / "x.mp4")
    with pytest.raises(GenerateError, match="--max-memory-gib -1: must be a positive number"):
        generate(tiny_run, _req(bounds=GenerateBounds(max_memory_gib=-1)), tmp_path / "x.mp4")


def test_normal_requests_run_as_before_with_their_estimate(tiny_run, tmp_path, capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error", BoundExceededWarning)
        res = generate(tiny_run, _req(steps=2), tmp_path / "n.mp4", text_emb=EMB)
    assert 0 < res.estimate_gib < 0.1 and 0 < res.estimate_s < 60
    assert "denoising" not in capsys.readouterr().err  # quick: no progress shown


def test_cli_refuses_in_one_line_before_loading_anything(tiny_run, tmp_path, capsys, monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("loaded a model for a refused request")

    monkeypatch.setattr(gen, "load_dit", boom)
    monkeypatch.setattr(gen, "prompt_encoder", boom)
    args = ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPT, "--seed", "1"]
    code = vfm_main([*args, "--size", "100000x100000", "--out", str(tmp_path / "a.mp4")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("vfm generate: error: --frames 13 --size 100000x100000: needs about")
    code = vfm_main(
        [*args, "--frames", "100001", "--device-tflops", "0.05", "--out", str(tmp_path / "b.mp4")]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "lower --frames or --steps" in err


# ------------------------------------------------------------------ the estimate's parts
def test_decoder_flops_equal_the_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    for cfg in (TokenizerConfig(base_channels=16), get_tokenizer_config("tok-8x16x16")):
        with torch.device("meta"):
            tok = CausalVideoAutoencoder(cfg)
        z = torch.zeros(1, cfg.latent_channels, 5, 4, 4, device="meta")  # (1, C, 1 + 4, h, w)
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            video = tok.decoder(z)  # (1, 3, F, H, W)
        f, h, w = video.shape[2:]
        assert decoder_flops(cfg, f, h, w) == fc.get_total_flops()


def test_ar_kv_cache_estimate_is_what_sampling_allocates(ar_run, monkeypatch):
    loaded = load_dit(ar_run)
    made = []
    new = loaded.model.new_caches
    monkeypatch.setattr(loaded.model, "new_caches", lambda n: made.extend(new(n)) or made)
    plan = plan_latent(9, 64, 64, temporal_factor=4, spatial_factor=8, channels=4, patch=(1,) * 3)
    for g in (1.0, 3.0):
        made.clear()
        sample_tokens(loaded.model, torch.ones(1, 8, 384), (3, 8, 8), SamplingConfig(guidance=g))
        est = estimate_ar(
            loaded.cfg.model, plan, guidance=g, prompt_tokens=0, decoder=None, rate=(1e10, "")
        )
        used = sum(c.k.nbytes + c.v.nbytes for c in made)
        assert est.phases["sampling"]["kv cache"] == used


# ------------------------------------------------------------------ progress
def test_progress_lines_once_sampling_runs_long(tiny_run, ar_run, tmp_path, caplog, monkeypatch):
    """Through the library's logger: stderr of `vfm generate` and of the ranks, a Prefect run's
    log (tests/flows: the `vfm_core` loggers reach it)."""
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)  # "long": any duration
    caplog.set_level("INFO", logger="vfm_core.infer.progress")
    generate(tiny_run, _req(steps=2), tmp_path / "d.mp4", text_emb=EMB)
    assert "denoising (2 heun steps): 3/3 calls (100%)" in caplog.text, caplog.text
    caplog.clear()
    generate(ar_run, _req(frames=9, temperature=0.0), tmp_path / "a.mp4", text_emb=EMB)
    lines = [r.getMessage() for r in caplog.records if r.name == "vfm_core.infer.progress"]
    assert "sampling tokens: 192/192 tokens (100%)" in lines[-1] and "left" in lines[-1], lines
    assert len(lines) <= 12
    caplog.clear()
    generate(tiny_run, _req(steps=2, progress=False), tmp_path / "q.mp4", text_emb=EMB)
    assert "denoising" not in caplog.text


# ------------------------------------------------------------------ case 24: the output path
def _unwritable_dirs(tmp_path: Path) -> list[Path]:
    dirs = []
    if os.geteuid() != 0:  # root writes through permission bits
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        dirs.append(ro)
    if sys.platform == "linux" and Path("/sys").is_dir():
        dirs.append(Path("/sys"))  # sysfs: no file can be created there, not even by root
    return dirs


def test_unwritable_out_is_refused_before_the_model_loads(tiny_run, tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("loaded the model before checking --out")

    monkeypatch.setattr(gen, "load_dit", boom)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    (tmp_path / "busy.latent.npy").mkdir()
    cases = [(d / "v.mp4", r"cannot create files in ") for d in _unwritable_dirs(tmp_path)]
    cases += [
        (a_file / "v.mp4", r"file\.txt is a file, not a directory"),
        (a_file / "sub" / "deeper" / "v.mp4", r"file\.txt is a file, not a directory"),
        (tmp_path / "busy.mp4", r"busy\.latent\.npy is a directory"),
        (tmp_path / "v.avi", r"must end in \.mp4"),
    ]
    for out, msg in cases:
        with pytest.raises(GenerateError, match=rf"^--out {re.escape(str(out))}: .*{msg}"):
            generate(tiny_run, _req(), out, text_emb=EMB)
    assert a_file.read_text() == "x" and not list(tmp_path.glob(".vfm-write-probe-*"))


def test_cli_unwritable_out_is_one_line(tiny_run, tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    code = vfm_main(
        ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPT, "--out", f"{a_file}/v.mp4"]
    )
    err = capsys.readouterr().err
    want = f"vfm generate: error: --out {a_file}/v.mp4: {a_file} is a file, not a directory\n"
    assert code == 2 and err == want


def test_missing_out_directories_are_still_created(tiny_run, tmp_path):
    out = tmp_path / "new" / "dir" / "v.mp4"
    res = generate(tiny_run, _req(steps=1), out, text_emb=EMB)
    assert Path(res.mp4) == out and out.stat().st_size > 0
