"""Autoregressive generation over context-parallel ranks: the prompt's prefill split over the
ranks gives the same caches, logits (<= 1e-5, float32) and tokens as one prefill; token and
video prompts are read and checked; bad prompt flags are one line, exit 2.

In-process: the zigzag layout places every input once; a prefill run in consecutive chunks
equals one prefill (keys/values of a position depend only on the positions before it: what the
split relies on); :class:`SplitPrefill` on a one-rank gloo group runs the whole code path
(padding, causal ring with positions, all-gather, broadcast). Multi-process (slow): ``vfm generate
--nproc 2`` writes the same tokens.npy as ``--nproc 1``, greedy and seeded with guidance."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from vfm_core.cli import main as vfm_main
from vfm_core.config import ModelConfig, apply_overrides
from vfm_core.infer.ar_prefill import SplitPrefill, prefill_layout
from vfm_core.infer.ar_sample import SamplingConfig, local_prefill, sample_tokens
from vfm_core.infer.generate import GenerateRequest, generate
from vfm_core.models.ar import CausalVideoTransformer
from vfm_core.models.local_attention import LocalAttention
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer
from vfm_core.train.main import run_training

CFG = ModelConfig(
    arch="ar", vocab_size=40, hidden=32, depth=2, heads=4, kv_heads=2, text_dim=8, text_len=2
)
GRID = (2, 4, 4)
EMB = np.ones((1, 384), dtype=np.float32) / np.sqrt(384)
SMALL = [
    "model.depth=2",
    "model.hidden=64",
    "model.heads=4",
    "model.kv_heads=2",
    "train.steps=2",
    "data.batch_size=1",
    "tracking.mlflow=false",
    "data.latent_height=4",
    "data.latent_width=4",
]
pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer")  # latent previews are expected
# 9 frames of 32x32 -> a 3 x 4 x 4 latent grid (4x8x8 factors), 48 tokens
GEN = ["--prompt", "x", "--frames", "9", "--size", "32x32", "--no-gif"]


def _model(dtype=torch.float32) -> CausalVideoTransformer:
    torch.manual_seed(0)
    model = CausalVideoTransformer(CFG).to(dtype).eval()
    with torch.no_grad():  # larger than the init's 0.02: logits far from uniform
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _inputs(model, b: int, m: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(m)
    ids = torch.randint(0, CFG.vocab_size, (b, m), generator=g)
    ids[:, 0] = model.bos
    text = torch.randn(b, CFG.text_len, CFG.text_dim, generator=g, dtype=dtype)
    return ids, text, model.rope(GRID)[:m].to(dtype)  # (B, m), (B, L, Dt), (m, d/2)


# ------------------------------------------------------------------ (a) in-process
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_layout_places_every_input_once(world):
    for m in (1, 2, 5, 8, 17, 33):
        lay = prefill_layout(m, world)
        assert lay.padded % (2 * world) == 0 and m <= lay.padded < m + 2 * world
        assert sorted(lay.positions.flatten().tolist()) == list(range(lay.padded))
        rank, j = lay.owner(m - 1)
        assert int(lay.positions[rank, j]) == m - 1
        gathered = lay.positions.flatten().float()[None, :, None]  # rank order, as all_gather
        assert lay.to_raster(gathered, dim=1).flatten().tolist() == list(range(m))


def test_chunked_prefill_equals_one_prefill():
    model = _model(torch.float64)
    ids, text, rope = _inputs(model, 2, 13, torch.float64)
    one, chunked = model.new_caches(16), model.new_caches(16)
    ref = local_prefill(model, ids, text, rope, one)  # (B, V)
    for a, b in ((0, 4), (4, 9), (9, 13)):  # what ranks 0, 1, 2 would own, run in order
        last = local_prefill(model, ids[:, a:b], text, rope[a:b], chunked)
    assert torch.allclose(last, ref, atol=1e-12)
    for c1, c2 in zip(one, chunked, strict=True):
        assert torch.allclose(c1.k[:, :, :13], c2.k[:, :, :13], atol=1e-12)
        assert torch.allclose(c1.v[:, :, :13], c2.v[:, :, :13], atol=1e-12)


@pytest.fixture
def one_rank_group(tmp_path):
    """A one-rank gloo default group (an earlier test of the session may have left one)."""
    if dist.is_initialized():
        assert dist.get_world_size() == 1
        yield
        return
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_split_prefill_on_one_rank_equals_local_prefill(one_rank_group):
    model, split = _model(), SplitPrefill()
    for m in (1, 6, 13):  # 13: padded to 14, the last input at the zigzag's second chunk
        ids, text, rope = _inputs(model, 2, m)
        c1, c2 = model.new_caches(32), model.new_caches(32)
        a, b = local_prefill(model, ids, text, rope, c1), split(model, ids, text, rope, c2)
        assert c2[0].length == m and (a - b).abs().max() <= 1e-5
        for x, y in zip(c1, c2, strict=True):
            assert (x.k[:, :, :m] - y.k[:, :, :m]).abs().max() <= 1e-5
    assert all(  # restored
        isinstance(blk.self_attn[0].core, LocalAttention) for blk in model.blocks.values()
    )
    text = _inputs(model, 1, 1)[1]
    prompt = torch.arange(20)[None] % CFG.vocab_size
    for kw in (dict(temperature=0.0), dict(temperature=1.0, top_k=10, guidance=3.0, seed=2)):
        ref = sample_tokens(model, text, GRID, SamplingConfig(**kw), prompt=prompt)
        got = sample_tokens(model, text, GRID, SamplingConfig(**kw), prompt=prompt, prefill=split)
        assert torch.equal(ref, got)


# ------------------------------------------------------------------ runs and prompts
@pytest.fixture(scope="module")
def ar_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar-cp-run")
    run_training(apply_overrides(get_recipe("ar-tiny"), SMALL), out_dir=out, progress=False)
    return out


@pytest.fixture(scope="module")
def base_tokens(ar_run, tmp_path_factory):
    """A greedy 3 x 4 x 4 sample of the run: the token prompt of the tests."""
    out = tmp_path_factory.mktemp("base") / "base.mp4"
    req = GenerateRequest(prompt="x", frames=9, height=32, width=32, temperature=0.0, gif=False)
    return generate(ar_run, req, out, text_emb=EMB).tokens


def test_token_prompt_is_kept(ar_run, base_tokens, tmp_path):
    req = GenerateRequest(
        prompt="x",
        frames=9,
        height=32,
        width=32,
        seed=5,
        gif=False,
        prompt_tokens=base_tokens,
        prompt_frames=2,
    )
    out = np.load(generate(ar_run, req, tmp_path / "p.mp4", text_emb=EMB).tokens)
    assert out.shape == (3, 4, 4) and np.array_equal(out[:2], np.load(base_tokens)[:2])


def test_video_prompt_is_encoded_with_the_tokenizer(ar_run, tmp_path):
    from vfm_core.tokenizer import load_tokenizer
    from vfm_core.video.io import decode_frames
    from vfm_core.video.transcode import encode_h264

    torch.manual_seed(1)
    tok = CausalVideoAutoencoder(TokenizerConfig(base_channels=8, fsq_levels=(4, 4, 4, 4)))
    tok_dir = save_tokenizer(tok, tmp_path / "tok").parent  # 256 ids: the run's vocabulary
    frames = np.random.default_rng(0).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    encode_h264(frames, tmp_path / "clip.mp4", fps=8)
    req = GenerateRequest(
        prompt="x",
        frames=9,
        height=32,
        width=32,
        gif=False,
        prompt_video=str(tmp_path / "clip.mp4"),
        prompt_frames=2,
    )
    res = generate(ar_run, req, tmp_path / "v.mp4", tokenizer=tok_dir, text_emb=EMB)
    x = torch.from_numpy(decode_frames(tmp_path / "clip.mp4")[:5]).permute(3, 0, 1, 2)[None]
    with torch.no_grad():
        want = load_tokenizer(tok_dir).encode_tokens(x.float() / 127.5 - 1.0)[0]  # (2, 4, 4)
    assert np.array_equal(np.load(res.tokens)[:2], want.numpy())


# ------------------------------------------------------------------ (c) bad prompt flags
def _bad(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        np.save(path, data, allow_pickle=False)
    return str(path)


@pytest.mark.parametrize(
    "make,extra,msg",
    [
        (lambda p: str(p / "missing.npy"), [], "no such file"),
        (lambda p: _bad(p, "junk.npy", b"not an npy"), [], "not a readable .npy"),
        (lambda p: _bad(p, "f.npy", np.zeros((3, 4, 4), np.float32)), [], "integer token ids"),
        (lambda p: _bad(p, "g.npy", np.zeros((3, 8, 8), np.int32)), [], "use --size 64x64"),
        (lambda p: _bad(p, "v.npy", np.full((3, 4, 4), 256, np.int32)), [], "[0, 256)"),
        (
            lambda p: _bad(p, "s.npy", np.zeros((1, 4, 4), np.int32)),
            ["--prompt-frames", "2"],
            "holds 1 latent frames",
        ),
        (
            lambda p: _bad(p, "l.npy", np.zeros((3, 4, 4), np.int32)),
            ["--prompt-frames", "4"],
            "longer than the video's 3 latent frames",
        ),
        (
            lambda p: _bad(p, "n.npy", np.zeros((3, 4, 4), np.int32)),
            ["--nproc", "2", "--prompt-frames", "0"],
            "--prompt-frames: must be an integer >= 1",
        ),
    ],
)
def test_bad_token_prompts_are_one_line(ar_run, tmp_path, capsys, make, extra, msg):
    out = str(tmp_path / "o.mp4")
    code = vfm_main(
        [
            "generate",
            "--checkpoint",
            str(ar_run),
            *GEN,
            "--out",
            out,
            "--prompt-tokens",
            make(tmp_path),
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and msg in err and len(err.splitlines()) == 1, err
    assert err.startswith("vfm generate: error: --prompt-")


def test_video_prompt_without_tokenizer_and_dit_runs_are_refused(
    ar_run, tiny_run, tmp_path, capsys
):
    video = _bad(tmp_path, "v.mp4", b"\x00" * 64)
    code = vfm_main(
        [
            "generate",
            "--checkpoint",
            str(ar_run),
            *GEN,
            "--out",
            str(tmp_path / "o.mp4"),
            "--prompt-video",
            video,
        ]
    )
    assert code == 2 and "needs the run's discrete tokenizer" in capsys.readouterr().err
    ids = _bad(tmp_path, "t.npy", np.zeros((1, 8, 8), np.int32))
    code = vfm_main(
        [
            "generate",
            "--checkpoint",
            str(tiny_run),
            "--prompt",
            "x",
            "--out",
            str(tmp_path / "d.mp4"),
            "--prompt-tokens",
            ids,
        ]
    )
    assert code == 2 and "only autoregressive runs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # one prompt, not both
        vfm_main(
            [
                "generate",
                "--checkpoint",
                str(ar_run),
                *GEN,
                "--out",
                "o.mp4",
                "--prompt-tokens",
                ids,
                "--prompt-video",
                video,
            ]
        )
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


# ------------------------------------------------------------------ (b) multi-process
@pytest.mark.slow
def test_cli_nproc_2_writes_the_tokens_of_one_process(ar_run, base_tokens, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    prompt = ["--prompt-tokens", base_tokens, "--prompt-frames", "2"]
    for name, kw in (
        ("greedy", ["--temperature", "0"]),
        ("seeded", ["--seed", "3", "--top-k", "50", "--guidance", "3"]),
    ):
        one, two = tmp_path / f"{name}1.mp4", tmp_path / f"{name}2.mp4"
        args = ["generate", "--checkpoint", str(ar_run), *GEN, *prompt, *kw]
        assert vfm_main([*args, "--out", str(one)]) == 0
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "vfm_core.cli",
                *args,
                "--out",
                str(two),
                "--nproc",
                "2",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr[-3000:]
        assert '"ranks": 2' in p.stdout
        a, b = np.load(one.with_suffix(".tokens.npy")), np.load(two.with_suffix(".tokens.npy"))
        assert np.array_equal(a, b), name
        assert np.array_equal(a[:2], np.load(base_tokens)[:2])
