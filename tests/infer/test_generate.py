"""One-process generation: files written and readable, determinism in the seed, CFG batching,
and every bad input named (empty prompt, other architecture, tokenizer channel mismatch,
guidance out of range, frame counts rounded with a warning, bad sizes/steps)."""

from __future__ import annotations

import json
import math
import re
import shutil

import numpy as np
import pytest
import torch
import yaml

from tests.infer.conftest import PROMPT, make_run
from vfm_core.checkpoints.integrity import write_manifest
from vfm_core.checkpoints.load import load_dit
from vfm_core.checkpoints.manager import CheckpointError
from vfm_core.infer.generate import (
    GenerateRequest,
    check_guidance,
    generate,
    initial_noise,
    sample_latent,
    text_condition,
)
from vfm_core.infer.shapes import FramesRoundedWarning, GenerateError, parse_size, plan_latent
from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer
from vfm_core.video.io import decode_frames, probe


def _req(**kw) -> GenerateRequest:
    return GenerateRequest(**{"prompt": PROMPT, "frames": 13, "height": 64, "width": 64, **kw})


def test_generate_writes_mp4_gif_and_latents(tiny_run, tiny_tokenizer, prompt_emb, tmp_path):
    out = tmp_path / "v.mp4"
    res = generate(tiny_run, _req(guidance=3.0), out, tokenizer=tiny_tokenizer, text_emb=prompt_emb)
    info = probe(str(out))
    assert (info.width, info.height) == (64, 64)
    frames = decode_frames(str(out))
    assert len(frames) == 13 == res.frames
    lat = np.load(out.with_suffix(".latent.npy"), allow_pickle=False)
    assert lat.shape == (4, 4, 8, 8) == tuple(res.latent_shape) and np.isfinite(lat).all()
    from PIL import Image

    with Image.open(out.with_suffix(".gif")) as gif:
        assert gif.n_frames == 13
    # the written video is the tokenizer's decode of the written latent
    from vfm_core.tokenizer import load_tokenizer

    tok = load_tokenizer(tiny_tokenizer)
    with torch.no_grad():
        video = tok.decode(torch.from_numpy(lat)[None])  # (1, 3, 13, 64, 64)
    ref = ((video[0].clamp(-1, 1) + 1) * 127.5).permute(1, 2, 3, 0).numpy()
    # H.264 (yuv420, crf 18) keeps luma: compare luma of the file with the decode of the latent
    luma = np.array([0.299, 0.587, 0.114], np.float32)
    y_file, y_ref = frames.astype(np.float32) @ luma, ref @ luma  # (13, 64, 64)
    assert np.corrcoef(y_file.ravel(), y_ref.ravel())[0, 1] > 0.9
    assert np.abs(y_file.mean((1, 2)) - y_ref.mean((1, 2))).max() < 4  # per-frame brightness
    assert res.ranks == 1 and res.steps == 4 and res.decoder.startswith("tokenizer:")


def test_same_seed_same_latent_other_seed_differs(tiny_run, prompt_emb):
    loaded = load_dit(tiny_run)
    text = text_condition(prompt_emb, text_len=8, text_dim=384)  # (1, 8, 384)
    d = loaded.cfg.diffusion
    a = sample_latent(loaded.model, d, initial_noise((4, 4, 8, 8), 3), text, steps=3, guidance=2)
    b = sample_latent(loaded.model, d, initial_noise((4, 4, 8, 8), 3), text, steps=3, guidance=2)
    c = sample_latent(loaded.model, d, initial_noise((4, 4, 8, 8), 4), text, steps=3, guidance=2)
    assert torch.equal(a, b)
    assert (a - c).abs().max() > 0.1
    # guidance changes the sample (the conditional branch is not ignored)
    g1 = sample_latent(loaded.model, d, initial_noise((4, 4, 8, 8), 3), text, steps=3, guidance=1)
    assert (a - g1).abs().max() > 1e-3


def test_cfg_evaluates_cond_and_uncond_in_one_batch(tiny_run, prompt_emb):
    loaded = load_dit(tiny_run)
    batches = []
    loaded.model.register_forward_hook(lambda m, args, out: batches.append(args[0].shape[0]))
    text = text_condition(prompt_emb, text_len=8, text_dim=384)
    sample_latent(
        loaded.model,
        loaded.cfg.diffusion,
        initial_noise((4, 4, 8, 8), 0),
        text,
        steps=2,
        guidance=4.0,
    )
    assert batches == [2, 2, 2]  # Heun with 2 steps: 3 evaluations, each on [cond, uncond]


def test_ema_or_raw_weights(tiny_run, tmp_path):
    loaded = load_dit(tiny_run)  # step 1 < three EMA horizons (3000 steps): the raw weights
    assert loaded.weights == "model" and loaded.step == 1 and not loaded.model.training
    assert load_dit(tiny_run, weights="ema").weights == "ema"
    # past the horizon the EMA is used: a run whose EMA differs from its raw weights
    run = make_run(tmp_path / "r", ["train.ema_decay=0.5"])  # three horizons: 6 steps
    ckpt = next((run / "checkpoints").iterdir())
    state = (ckpt / "state.json").read_text()
    for step, weights in ((5, "model"), (6, "ema")):  # 0.5**5 = 3% init: still one step short
        ckpt = ckpt.rename(ckpt.with_name(f"step_{step:08d}"))  # named as a save names it
        (ckpt / "state.json").write_text(state.replace('"step": 1', f'"step": {step}', 1))
        write_manifest(ckpt, step=step)  # edited on purpose: sealed again, as a save would
        assert load_dit(run).weights == weights


def test_latent_preview_without_tokenizer(tiny_run, prompt_emb, tmp_path):
    out = tmp_path / "p.mp4"
    with pytest.warns(UserWarning, match="latent preview"):
        res = generate(tiny_run, _req(frames=5, steps=2), out, text_emb=prompt_emb)
    assert res.decoder == "latent-preview" and len(decode_frames(str(out))) == 5


# ---------------------------------------------------------------------------- bad input
def test_empty_prompt_is_refused(tiny_run, tmp_path):
    for prompt in ("", "   \n"):
        with pytest.raises(GenerateError, match="prompt is empty"):
            generate(tiny_run, _req(prompt=prompt), tmp_path / "x.mp4")


@pytest.mark.parametrize("g", [-0.5, 30.5, math.nan, math.inf])
def test_guidance_out_of_range(tiny_run, prompt_emb, tmp_path, g):
    with pytest.raises(GenerateError, match=r"--guidance .*must be a number in \[0, 30\]"):
        generate(tiny_run, _req(guidance=g), tmp_path / "x.mp4", text_emb=prompt_emb)
    assert check_guidance(0) == 0.0 and check_guidance(30) == 30.0


def test_other_architecture_is_refused(tiny_run, tmp_path):
    # config.yaml says another model than the checkpoint holds
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model"]["arch"], cfg["model"]["hidden"] = "llama_dit", 128
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(CheckpointError, match=r"another architecture.*model.arch: checkpoint 'di"):
        load_dit(run)
    # a checkpoint whose tensors do not fit (state.json and config agree, tensors do not)
    other = make_run(tmp_path / "other", ["model.depth=3"])
    ckpt = next((other / "checkpoints").iterdir())
    for f in ckpt.glob("*.safetensors"):
        f.unlink()
    for f in next((tiny_run / "checkpoints").iterdir()).glob("*.safetensors"):
        shutil.copy(f, ckpt / f.name)
    write_manifest(ckpt, step=1)  # a complete checkpoint, of the wrong tensors
    with pytest.raises(CheckpointError, match=r"does not fit the 'dit' architecture.*blocks\.2"):
        load_dit(other)


def test_not_a_run_dir_is_refused(tiny_tokenizer, tmp_path):
    with pytest.raises(CheckpointError, match="not a `vfm train` run directory.*--tokenizer"):
        load_dit(tiny_tokenizer)
    with pytest.raises(CheckpointError, match="no such directory"):
        load_dit(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.yaml").write_text("{}\n")
    with pytest.raises(CheckpointError, match="no finished checkpoint"):
        load_dit(tmp_path / "empty")


def test_damaged_checkpoints_are_never_sampled_from(tiny_run, tmp_path, capsys):
    """A run dir: the newest intact checkpoint, the damaged newer one skipped with one warning
    line (as --resume does); a damaged step folder named explicitly: one clear error."""
    run = shutil.copytree(tiny_run, tmp_path / "run")
    older = run / "checkpoints" / "step_00000001"
    newest = shutil.copytree(older, run / "checkpoints" / "step_00000002")
    write_manifest(newest, step=2)  # a newer save's manifest (its step is its folder's)
    (shard,) = sorted(newest.glob("*.safetensors"))
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte inside the weights: loads, but wrong
    shard.write_bytes(bytes(raw))
    capsys.readouterr()
    assert load_dit(run).checkpoint == older
    (warning,) = capsys.readouterr().err.splitlines()
    assert warning == (
        f"warning: skipping checkpoint {newest}: {shard.name}: sha256 differs "
        "from the manifest (the file was modified or corrupted)"
    )
    with pytest.raises(
        CheckpointError,
        match=rf"^--checkpoint: checkpoint {newest}: "
        rf"{shard.name}: sha256 differs",
    ):
        load_dit(newest)


def test_longer_than_trained_is_warned(tiny_run, prompt_emb, tmp_path):
    """tiny_run trained 4 latent frames (13 pixel frames) of 8x8 latents (64x64): 17 frames or
    128x128 is extrapolation, said in one warning naming what it trained on."""
    from vfm_core.infer.shapes import BeyondTrainingWarning

    with pytest.warns(
        BeyondTrainingWarning,
        match=r"--frames 17 --size 64x64: the run trained "
        r"on 13 frames at 64x64 \(latent 4x8x8\)",
    ):
        generate(tiny_run, _req(frames=17, steps=1), tmp_path / "a.mp4", text_emb=prompt_emb)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", BeyondTrainingWarning)  # the trained shape: no warning
        generate(tiny_run, _req(frames=13, steps=1), tmp_path / "b.mp4", text_emb=prompt_emb)


def test_tokenizer_channel_mismatch(tiny_run, prompt_emb, tmp_path):
    tok = CausalVideoAutoencoder(TokenizerConfig(base_channels=16, latent_channels=8))
    save_tokenizer(tok, tmp_path / "tok8")
    with pytest.raises(GenerateError, match=r"--tokenizer .*8 latent channels, expected 4"):
        generate(
            tiny_run, _req(), tmp_path / "x.mp4", tokenizer=tmp_path / "tok8", text_emb=prompt_emb
        )


def test_frames_rounded_up_with_warning(tiny_run, tiny_tokenizer, prompt_emb, tmp_path):
    with pytest.warns(FramesRoundedWarning, match="--frames 10: .*generating 13 frames"):
        res = generate(
            tiny_run,
            _req(frames=10, steps=2),
            tmp_path / "r.mp4",
            tokenizer=tiny_tokenizer,
            text_emb=prompt_emb,
        )
    assert res.frames == 13 and len(decode_frames(str(tmp_path / "r.mp4"))) == 13
    # a temporal patch of 2 needs an even latent length: 13 frames (4 latents) fit, 9 -> 13
    with pytest.warns(FramesRoundedWarning):
        p = plan_latent(9, 64, 64, temporal_factor=4, spatial_factor=8, channels=4, patch=(2, 2, 2))
    assert p.frames == 13 and p.latent == (4, 4, 8, 8)


def test_bad_sizes_steps_frames(tiny_run, prompt_emb, tmp_path):
    with pytest.raises(GenerateError, match=r"--size 60x64: height must be a multiple of 16"):
        generate(tiny_run, _req(height=60), tmp_path / "x.mp4", text_emb=prompt_emb)
    for text in ("64", "axb", "0x64"):
        with pytest.raises(GenerateError, match="--size"):
            parse_size(text)
    with pytest.raises(GenerateError, match=r"--steps 0"):
        generate(tiny_run, _req(steps=0), tmp_path / "x.mp4", text_emb=prompt_emb)
    with pytest.raises(GenerateError, match=r"--frames: must be an integer >= 1"):
        generate(tiny_run, _req(frames=0), tmp_path / "x.mp4", text_emb=prompt_emb)
    with pytest.raises(GenerateError, match=r"--out .*must end in .mp4"):
        generate(tiny_run, _req(), tmp_path / "x.avi", text_emb=prompt_emb)
    with pytest.raises(GenerateError, match=r"cannot be split evenly over 3"):
        plan_latent(
            13, 64, 64, temporal_factor=4, spatial_factor=8, channels=4, patch=(1, 2, 2), cp=3
        )
    with pytest.raises(GenerateError, match=r"prompt embedding has shape \(1, 16\)"):
        text_condition(np.zeros((1, 16), np.float32), text_len=8, text_dim=384)


def test_result_is_json_serialisable(tiny_run, tiny_tokenizer, prompt_emb, tmp_path):
    res = generate(
        tiny_run, _req(steps=1), tmp_path / "j.mp4", tokenizer=tiny_tokenizer, text_emb=prompt_emb
    )
    doc = json.loads(json.dumps(res.to_dict()))
    assert doc["mp4"].endswith("j.mp4") and doc["seed"] == 0


def test_a_prompt_that_is_not_utf8_is_one_line(tiny_run, tmp_path, capsys):
    """Bytes that are not UTF-8 reach Python as lone surrogates: refused naming --prompt (was a
    TypeError traceback from the tokenizer)."""
    from vfm_core.cli import main as vfm_main

    bad = "red \udcff\udcfe circle"  # $'red \xff\xfe circle' on the command line
    with pytest.raises(GenerateError, match=r"^--prompt: not valid UTF-8 text \(at character 4: "):
        generate(tiny_run, _req(prompt=bad), tmp_path / "x.mp4")
    argv = ["generate", "--checkpoint", str(tiny_run), "--prompt", bad]
    assert vfm_main([*argv, "--out", str(tmp_path / "y.mp4")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vfm generate: error: --prompt: not valid UTF-8") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_a_prompt_longer_than_the_encoder_or_the_model_takes_is_cut_with_a_warning():
    import warnings

    from vfm_core.infer.generate import embed_prompt

    with pytest.warns(UserWarning) as caught:  # pooled MiniLM (runs without a text record)
        embed_prompt("a red circle " * 300 + "moving right", text_len=8)
    (w,) = caught
    assert re.fullmatch(
        r"--prompt: \d+ tokens, more than the text encoder's limit of 256: cut to its first 256 "
        r"tokens \(the rest does not condition the video\)",
        str(w.message),
    )
    tokens = {"model": "all-MiniLM-L6-v2", "mode": "tokens", "max_tokens": 512, "normalize": True}
    with pytest.warns(UserWarning, match=r"^--prompt: 11 tokens, more than model.text_len of 8: "):
        assert embed_prompt(PROMPT, record=tokens, text_len=8).shape == (11, 384)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what fits: no warning
        embed_prompt(PROMPT, text_len=8)
        embed_prompt("a red disc", record=tokens, text_len=8)


def test_nan_weights_write_no_video(prompt_emb, tmp_path):
    run = make_run(tmp_path / "nan", scale=math.nan)
    (ckpt,) = (run / "checkpoints").iterdir()
    with pytest.raises(
        GenerateError,
        match=rf"^checkpoint {ckpt}: the sampled latent holds NaN or inf \(\d+ of its weight "
        r"tensors hold NaN or inf, e\.g\. ",
    ):
        generate(run, _req(frames=5, steps=1), tmp_path / "x.mp4", text_emb=prompt_emb)
    assert not (tmp_path / "x.mp4").exists() and not (tmp_path / "x.latent.npy").exists()
