"""Video-to-world and image-to-video generation of the DiT family: ``--prompt-video`` /
``--prompt-image`` frames, encoded with the run's tokenizer, stay the first latent frames of the
video the sampler writes, and the frames after them depend on them; on two context-parallel
ranks the result is the one-process latent; a run not trained on frames, too many prompt frames,
another size or a missing file are one line each."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

try:  # tests/infer/conftest.py's, as this folder's tests import it
    from conftest import make_run
except ImportError:  # the ranks of _on_ranks import this module in fresh processes, where
    make_run = None  # ``conftest`` may be another test folder's; they do not need it

from tests.parallel.parallel_harness import run_ranks
from vfm_core.infer.generate import generate
from vfm_core.infer.request import GenerateRequest
from vfm_core.infer.shapes import GenerateError
from vfm_core.tokenizer import load_tokenizer
from vfm_core.video.io import decode_frames
from vfm_core.video.transcode import encode_h264

EMB = np.random.default_rng(0).normal(size=(1, 384)).astype(np.float32)
FRAME_COND = ["diffusion.frame_cond=0.5", "diffusion.frame_cond_max=2", "data.latent_frames=3"]


@pytest.fixture(scope="module")
def frame_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("fc"), FRAME_COND)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    frames = np.random.default_rng(1).integers(0, 256, (6, 32, 32, 3), dtype=np.uint8)
    encode_h264(frames, root / "clip.mp4", fps=8)
    Image.fromarray(frames[0]).save(root / "first.png")
    return root


def _request(**kw) -> GenerateRequest:
    return GenerateRequest(prompt="x", frames=9, height=32, width=32, gif=False, seed=3, **kw)


def _encoded(tok_dir, path, n: int) -> torch.Tensor:
    x = torch.from_numpy(decode_frames(path)[:n]).permute(3, 0, 1, 2)[None]  # (1, 3, F, H, W)
    with torch.no_grad():
        return load_tokenizer(tok_dir).encode(x.float() / 127.5 - 1.0)[0]  # (C, K, h, w)


def test_prompt_frames_are_kept_and_continued(frame_run, media, tiny_tokenizer, tmp_path):
    kw = dict(tokenizer=tiny_tokenizer, text_emb=EMB)
    plain = np.load(generate(frame_run, _request(), tmp_path / "a.mp4", **kw).latent)
    video = _request(prompt_video=str(media / "clip.mp4"), prompt_frames=2)
    got = np.load(generate(frame_run, video, tmp_path / "v.mp4", **kw).latent)  # (C, 3, h, w)
    want = _encoded(tiny_tokenizer, media / "clip.mp4", 5)  # 1 + 4·(2-1) frames -> 2 latent
    np.testing.assert_allclose(got[:, :2], want.numpy(), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[:, 2], plain[:, 2], atol=1e-4)  # the continuation follows it
    image = _request(prompt_image=str(media / "first.png"))
    first = np.load(generate(frame_run, image, tmp_path / "i.mp4", **kw).latent)
    png = _encoded(tiny_tokenizer, media / "first.png", 1)  # the image, not the H.264 frame
    np.testing.assert_allclose(first[:, :1], png.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "kw", "message"),
    [
        ([], dict(prompt_image="first.png"), "not trained to continue clips"),
        (FRAME_COND, dict(prompt_video="clip.mp4", prompt_frames=3), "frame_cond_max=2"),
        (FRAME_COND, dict(prompt_image="first.png", prompt_frames=2), "an image is one frame"),
        (FRAME_COND, dict(prompt_video="nowhere.mp4"), "nowhere.mp4: no such file"),
        (FRAME_COND, dict(prompt_tokens="t.npy"), "only autoregressive runs continue a token"),
    ],
)
def test_bad_frame_prompts_are_one_line(overrides, kw, message, media, tiny_tokenizer, tmp_path):
    run = make_run(tmp_path / "run", overrides)
    kw = {
        k: (str(media / v) if k.startswith("prompt_") and k != "prompt_frames" else v)
        for k, v in kw.items()
    }
    with pytest.raises(GenerateError, match=message):
        generate(run, _request(**kw), tmp_path / "o.mp4", tokenizer=tiny_tokenizer, text_emb=EMB)
    assert not (tmp_path / "o.mp4").exists()


def test_another_size_is_named(frame_run, media, tiny_tokenizer, tmp_path):
    req = GenerateRequest(
        prompt="x", frames=9, height=64, width=64, gif=False, prompt_image=str(media / "first.png")
    )
    with pytest.raises(GenerateError, match=r"frames are 32x32, the requested --size is 64x64"):
        generate(frame_run, req, tmp_path / "o.mp4", tokenizer=tiny_tokenizer, text_emb=EMB)


def _on_ranks(rank, world, run, image, tok, out):
    res = generate(run, _request(prompt_image=image), out, tokenizer=tok, text_emb=EMB)
    return {"ranks": res.ranks, "latent": res.latent}


@pytest.mark.slow
def test_two_ranks_continue_an_image_as_one_process(frame_run, media, tiny_tokenizer, tmp_path):
    """Context-parallel sampling of a frame prompt: the ranks split the tokens (and their
    per-frame noise levels) and write the one-process latent."""
    image = str(media / "first.png")
    two = run_ranks(
        _on_ranks, 2, str(frame_run), image, str(tiny_tokenizer), str(tmp_path / "2.mp4")
    )
    assert two[0]["ranks"] == 2
    req = _request(prompt_image=image)
    one = generate(frame_run, req, tmp_path / "1.mp4", tokenizer=tiny_tokenizer, text_emb=EMB)
    got, want = np.load(two[0]["latent"]), np.load(one.latent)
    assert np.abs(got - want).max() <= 1e-4
