"""Writing generated videos: [-1, 1] tensors -> uint8 frames -> MP4 (H.264), GIF, latent .npy."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from vfm_core.infer.shapes import GenerateError
from vfm_core.tokenizer.autoencoder import uint8_from_pixels
from vfm_core.video.transcode import encode_h264

__all__ = ["check_writable", "latent_preview", "output_paths", "to_uint8_frames", "write_outputs"]


def output_paths(out: str | Path) -> list[Path]:
    """Every file a generation may write for ``out``: the MP4, GIF, latents and token ids."""
    out = Path(out)
    return [out, *(out.with_suffix(s) for s in (".gif", ".latent.npy", ".tokens.npy"))]


def check_writable(out: str | Path) -> Path:
    """Refuse (:class:`GenerateError`, naming ``--out``) an output path that cannot be written,
    before any model is loaded: it must end in ``.mp4``; its directory, or the nearest existing
    ancestor (missing directories are created when the files are written), must be a directory
    in which a probe file can be created and removed; and none of :func:`output_paths` may be an
    existing directory or a file without write permission."""
    out = Path(out)
    if out.suffix.lower() != ".mp4":
        raise GenerateError(f"--out {out}: must end in .mp4")
    parent = out.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # a missing directory: it will be created inside this one
    if not parent.is_dir():
        raise GenerateError(f"--out {out}: {parent} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".vfm-write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise GenerateError(
            f"--out {out}: cannot create files in {parent} ({e.strerror or e}); choose a "
            "writable directory"
        ) from None
    for path in output_paths(out):
        if path.is_dir():
            raise GenerateError(f"--out {out}: {path} is a directory")
        if path.exists() and not os.access(path, os.W_OK):
            raise GenerateError(f"--out {out}: {path} exists and is not writable")
    return out


def to_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """(3, F, H, W) in [-1, 1] -> (F, H, W, 3) uint8 (values outside [-1, 1] are clamped)."""
    x = uint8_from_pixels(video)
    return x.permute(1, 2, 3, 0).contiguous().numpy()  # (F, H, W, 3)


def latent_preview(
    latent: torch.Tensor,
    *,
    temporal_factor: int,
    spatial_factor: int,
    scale: float | None = None,
) -> torch.Tensor:
    """A look at a latent without a tokenizer: (B, C, T', h, w) -> (B, 3, 1 + t_c(T'-1), H, W).

    The first 3 channels (repeated if C < 3) divided by ``scale`` (None: each clip's channel std)
    and squashed with tanh; frame 0 alone then every latent frame repeated ``t_c`` times (the
    causal layout); nearest up-sampling. A fixed ``scale`` keeps clips comparable (evaluation).
    """
    z = latent.float()
    c = z.shape[1]
    z = z[:, [i % c for i in range(3)]]  # (B, 3, T', h, w)
    div = z.std(dim=(2, 3, 4), keepdim=True) + 1e-6 if scale is None else scale
    z = torch.tanh(z / div)
    first, rest = z[:, :, :1], z[:, :, 1:].repeat_interleave(temporal_factor, dim=2)
    z = torch.cat([first, rest], dim=2)  # (B, 3, F, h, w)
    z = z.repeat_interleave(spatial_factor, dim=3).repeat_interleave(spatial_factor, dim=4)
    return z  # (B, 3, F, H, W)


def write_outputs(
    frames: np.ndarray, latent: np.ndarray, out: str | Path, *, fps: int, gif: bool = True
) -> dict[str, str | None]:
    """Write ``out`` (MP4), ``out.gif`` (if ``gif`` and Pillow is installed) and
    ``out.latent.npy``; frames (F, H, W, 3) uint8, latent (C, T', h, w). Returns the paths."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if fps <= 0:
        raise ValueError(f"fps: must be positive, got {fps}")
    encode_h264(frames, out, fps=fps, crf=18)
    lat_path = out.with_suffix(".latent.npy")
    np.save(lat_path, np.ascontiguousarray(latent, dtype=np.float32), allow_pickle=False)
    gif_path = None
    if gif:
        try:
            from PIL import Image
        except ImportError:
            Image = None
        if Image is not None:
            imgs = [Image.fromarray(f) for f in frames]
            gif_path = out.with_suffix(".gif")
            imgs[0].save(
                gif_path,
                save_all=True,
                append_images=imgs[1:],
                duration=max(1, round(1000 / fps)),
                loop=0,
            )
            gif_path = str(gif_path)
    return {"mp4": str(out), "gif": gif_path, "latent": str(lat_path)}
