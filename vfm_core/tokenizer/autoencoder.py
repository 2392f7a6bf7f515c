"""Causal 3D video autoencoder with continuous latents, temporal tiling and latent scaling.

Shapes (t_c = temporal factor, s = spatial factor, C = latent channels)::

    pixels  (B, 3, 1 + t_c·k, H, W) in [-1, 1]  --encode-->  latents (B, C, 1 + k, H/s, W/s)

The first frame is encoded alone (all convolutions are causal in time, see
:mod:`vfm_core.tokenizer.causal_conv`), so an image is a one-frame video and shares the latent space
of videos (Cosmos tokenizer, https://arxiv.org/abs/2501.03575, Sec. 3; MAGVIT-v2,
https://arxiv.org/abs/2310.05737).

**Temporal tiling rule** (``tile_latent_frames = n > 0``): the first tile is the input frames
``0 .. t_c·n`` (``1 + t_c·n`` frames -> ``1 + n`` latent frames), every following tile the next
``t_c·n`` frames (-> ``n`` latent frames; the last one may be shorter). Tiles do not overlap: each
causal conv carries the trailing frames of its padded input (its exact causal context) from one tile
to the next, so the tiled result equals the untiled one up to float rounding (tested at 1e-5) while
only one tile's activations are alive. Decoding tiles latent frames the same way
(``1 + n``, then ``n`` each).

**Latent scaling**: per-channel ``latent_mean`` / ``latent_std`` (buffers, saved with the weights)
are dataset statistics of the raw latents (:func:`compute_latent_stats`). ``encode`` returns
*normalised* latents ``(z - mean) / std`` (≈ zero mean, unit std per channel) by default and raw
ones with ``normalize=False``; ``decode`` takes the same convention. The diffusion trainer then
multiplies by ``sigma_data`` (:func:`vfm_core.diffusion.edm.scale_latents` with ``mean=0,
std=1``, or on raw latents with :meth:`CausalVideoAutoencoder.latent_stats`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vfm_core.tokenizer.causal_conv import (
    CausalConv3d,
    CausalDownsample,
    CausalPatchify,
    CausalResBlock,
    CausalUnpatchify,
    CausalUpsample,
    StreamCache,
    make_norm,
)
from vfm_core.tokenizer.config import TokenizerConfig
from vfm_core.tokenizer.fsq import FSQ

__all__ = [
    "AutoencoderOutput",
    "CausalVideoAutoencoder",
    "TokenizerShapeError",
    "compute_latent_stats",
    "psnr",
    "ssim_sum",
]


class TokenizerShapeError(ValueError):
    """A video or latent tensor has a shape the tokenizer cannot take; the message names it."""


def pixels_from_uint8(x: Tensor) -> Tensor:
    """uint8 RGB values (any shape) -> float32 pixels in [-1, 1]: the tokenizer's convention."""
    return x.float() / 127.5 - 1.0


def uint8_from_pixels(x: Tensor) -> Tensor:
    """Pixels in [-1, 1] (any shape) -> uint8 RGB values, the inverse of :func:`pixels_from_uint8`
    (clamped, rounded)."""
    return ((x.detach().float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


@dataclass(kw_only=True, slots=True)
class AutoencoderOutput:
    recon: Tensor
    """Reconstruction (B, 3, T, H, W)."""
    latent: Tensor
    """Raw (unnormalised) latent that was decoded (B, C, 1 + k, H/s, W/s); sampled for KL."""
    reg: Tensor
    """Regulariser value (scalar; 0 for ``regulariser='none'``), not yet weighted."""


def _widths(cfg: TokenizerConfig) -> list[int]:
    return [cfg.base_channels * m for m in cfg.channel_mult]


class Encoder(nn.Module):
    """patchify -> conv_in -> per stage (res blocks, 2x down) -> bottleneck res block -> norm,
    SiLU, conv_out.

    Down-sampling in time and space happens in the first stages (cheapest: fewer voxels early)."""

    def __init__(self, cfg: TokenizerConfig) -> None:
        super().__init__()
        w, g = _widths(cfg), cfg.norm_groups
        self.patch = CausalPatchify(cfg.patch_t, cfg.patch_s)
        self.conv_in = CausalConv3d(cfg.in_channels * cfg.patch_t * cfg.patch_s**2, w[0], 3)
        self.blocks = nn.ModuleList()
        for i in range(cfg.num_stages):
            for _ in range(cfg.num_res_blocks):
                self.blocks.append(CausalResBlock(w[i], w[i], groups=g, norm=cfg.norm))
            self.blocks.append(
                CausalDownsample(
                    w[i],
                    w[i + 1],
                    temporal=i < cfg.temporal_down_stages,
                    spatial=i < cfg.spatial_down_stages,
                    shortcut=cfg.shortcuts,
                )
            )
        self.blocks.append(CausalResBlock(w[-1], w[-1], groups=g, norm=cfg.norm))
        self.norm_out = make_norm(cfg.norm, w[-1], g)
        out = cfg.latent_channels * (2 if cfg.regulariser == "kl" else 1)
        self.conv_out = CausalConv3d(w[-1], out, 3)
        self.out_group = w[-1] // out if cfg.shortcuts else 0
        if cfg.shortcuts and self.out_group * out != w[-1]:
            raise ValueError(f"shortcuts: latent width {out} must divide {w[-1]}")

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        h = self.conv_in(self.patch(x, cache), cache)  # (B, w0, T/pt, H/ps, W/ps)
        for blk in self.blocks:
            h = blk(h, cache)
        z = self.conv_out(nn.functional.silu(self.norm_out(h)), cache)  # (B, C|2C, T', h, w)
        if self.out_group:  # DC-AE bottleneck shortcut: channel-group mean of the features
            b, c, t, hh, ww = h.shape
            z = z + h.view(b, c // self.out_group, self.out_group, t, hh, ww).mean(dim=2)
        return z


class Decoder(nn.Module):
    """conv_in -> bottleneck res block -> per stage (2x up, res blocks) -> norm, SiLU, conv_out
    -> unpatchify. Up-sampling mirrors the encoder (its last stages)."""

    def __init__(self, cfg: TokenizerConfig) -> None:
        super().__init__()
        w, g = _widths(cfg), cfg.norm_groups
        self.conv_in = CausalConv3d(cfg.latent_channels, w[-1], 3)
        self.in_repeat = w[-1] // cfg.latent_channels if cfg.shortcuts else 0
        if cfg.shortcuts and self.in_repeat * cfg.latent_channels != w[-1]:
            raise ValueError(f"shortcuts: latent_channels must divide {w[-1]}")
        self.blocks = nn.ModuleList([CausalResBlock(w[-1], w[-1], groups=g, norm=cfg.norm)])
        for i in reversed(range(cfg.num_stages)):
            self.blocks.append(
                CausalUpsample(
                    w[i + 1],
                    w[i],
                    temporal=i < cfg.temporal_down_stages,
                    spatial=i < cfg.spatial_down_stages,
                    shortcut=cfg.shortcuts,
                )
            )
            for _ in range(cfg.num_res_blocks):
                self.blocks.append(CausalResBlock(w[i], w[i], groups=g, norm=cfg.norm))
        self.norm_out = make_norm(cfg.norm, w[0], g)
        self.conv_out = CausalConv3d(w[0], cfg.in_channels * cfg.patch_t * cfg.patch_s**2, 3)
        self.unpatch = CausalUnpatchify(cfg.patch_t, cfg.patch_s)

    def forward(self, z: Tensor, cache: StreamCache | None = None) -> Tensor:
        h = self.conv_in(z, cache)  # (B, w_last, T', h, w)
        if self.in_repeat:  # DC-AE bottleneck shortcut: channel-repeated latent
            h = h + z.repeat_interleave(self.in_repeat, dim=1)
        for blk in self.blocks:
            h = blk(h, cache)
        h = self.conv_out(nn.functional.silu(self.norm_out(h)), cache)  # (B, 3·pt·ps², T/pt, ..)
        return self.unpatch(h, cache)  # (B, 3, T, H, W)


class CausalVideoAutoencoder(nn.Module):
    """Causal 3D video autoencoder (see the module docstring for shapes, tiling and scaling)."""

    def __init__(self, cfg: TokenizerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.fsq = FSQ(cfg.fsq_levels) if cfg.fsq_levels else None  # discrete bottleneck
        self.register_buffer("latent_mean", torch.zeros(cfg.latent_channels))
        self.register_buffer("latent_std", torch.ones(cfg.latent_channels))

    # ---------------------------------------------------------------- shapes
    def latent_shape(self, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
        """(C, 1 + k, H/s, W/s) for a video of ``frames = 1 + t_c·k`` frames of H x W."""
        self.check_video_shape((1, self.cfg.in_channels, frames, height, width))
        t, s = self.cfg.temporal_factor, self.cfg.spatial_factor
        return (self.cfg.latent_channels, 1 + (frames - 1) // t, height // s, width // s)

    def frames_for_latent(self, latent_frames: int) -> int:
        """Pixel frames decoded from ``latent_frames = 1 + k``: ``1 + t_c·k``."""
        return 1 + self.cfg.temporal_factor * (latent_frames - 1)

    def check_video_shape(self, shape: tuple[int, ...] | torch.Size) -> None:
        """Raise :class:`TokenizerShapeError` unless ``shape`` is (B, 3, 1 + t_c·k, H, W) with
        H and W divisible by the spatial factor."""
        t, s, c = self.cfg.temporal_factor, self.cfg.spatial_factor, self.cfg.in_channels
        shape = tuple(shape)
        if len(shape) != 5:
            raise TokenizerShapeError(
                f"video must be (B, {c}, T, H, W), got shape {shape} "
                "(for an image (B, C, H, W) use x.unsqueeze(2): a one-frame video)"
            )
        _, ch, frames, h, w = shape
        if ch != c:
            raise TokenizerShapeError(f"video {shape} has {ch} channels, the tokenizer takes {c}")
        if frames < 1 or (frames - 1) % t:
            lo = 1 + t * max(0, (frames - 1) // t)
            raise TokenizerShapeError(
                f"video {shape} has {frames} frames; the tokenizer takes 1 + {t}·k frames "
                f"(e.g. {lo} or {lo + t})"
            )
        if h % s or w % s or h < s or w < s:
            raise TokenizerShapeError(
                f"video {shape}: height {h} and width {w} must be positive multiples of the "
                f"spatial factor {s}"
            )

    def check_latent_shape(self, shape: tuple[int, ...] | torch.Size) -> None:
        """Raise :class:`TokenizerShapeError` unless ``shape`` is (B, C, T', h, w)."""
        shape, c = tuple(shape), self.cfg.latent_channels
        if len(shape) != 5 or shape[1] != c or shape[2] < 1:
            raise TokenizerShapeError(
                f"latent must be (B, {c}, 1 + k, h, w) with {c} latent channels, got {shape}"
            )

    # ---------------------------------------------------------------- scaling
    def latent_stats(self) -> tuple[Tensor, Tensor]:
        """Per-channel (mean, std) broadcastable to latents: two (1, C, 1, 1, 1) tensors."""
        shape = (1, -1, 1, 1, 1)
        return self.latent_mean.view(shape), self.latent_std.view(shape)

    def set_latent_stats(self, mean: Tensor, std: Tensor) -> None:
        """Store per-channel statistics (C,) of raw latents (saved with the weights)."""
        c = self.cfg.latent_channels
        mean, std = torch.as_tensor(mean).flatten(), torch.as_tensor(std).flatten()
        if mean.numel() != c or std.numel() != c:
            raise TokenizerShapeError(
                f"latent stats need {c} channels, got mean {tuple(mean.shape)} std "
                f"{tuple(std.shape)}"
            )
        if not bool((std > 0).all()):
            raise ValueError("latent std must be positive")
        self.latent_mean.copy_(mean)
        self.latent_std.copy_(std)

    def normalize(self, z: Tensor) -> Tensor:
        """Raw -> normalised latents, ``(z - mean) / std`` per channel."""
        mean, std = self.latent_stats()
        return (z - mean.to(z)) / std.to(z)  # (B, C, T', h, w)

    def denormalize(self, z: Tensor) -> Tensor:
        """Normalised -> raw latents, ``z * std + mean`` per channel."""
        mean, std = self.latent_stats()
        return z * std.to(z) + mean.to(z)  # (B, C, T', h, w)

    # ---------------------------------------------------------------- encode / decode
    def _tile(self, tile_latent_frames: int | None) -> int:
        n = self.cfg.tile_latent_frames if tile_latent_frames is None else tile_latent_frames
        if n < 0:
            raise ValueError(f"tile_latent_frames must be >= 0, got {n}")
        return n

    def _moments(self, x: Tensor, tile: int) -> Tensor:
        """Encoder output (B, C or 2C, 1 + k, h, w), optionally over temporal tiles."""
        t_c = self.cfg.temporal_factor
        if tile == 0 or x.shape[2] <= 1 + t_c * tile:
            return self.encoder(x)
        cache: StreamCache = {}
        bounds = [0, 1 + t_c * tile]
        while bounds[-1] < x.shape[2]:
            bounds.append(min(bounds[-1] + t_c * tile, x.shape[2]))
        parts = [self.encoder(x[:, :, a:b], cache) for a, b in zip(bounds, bounds[1:])]
        return torch.cat(parts, dim=2)  # (B, C|2C, 1 + k, h, w)

    def encode(
        self, x: Tensor, *, normalize: bool = True, tile_latent_frames: int | None = None
    ) -> Tensor:
        """Pixels (B, 3, 1 + t_c·k, H, W) in [-1, 1] -> latents (B, C, 1 + k, H/s, W/s).

        Deterministic (the KL posterior's mean). ``normalize``: return ``(z - mean) / std`` with
        the stored per-channel statistics (default) or the raw latent. ``tile_latent_frames``:
        temporal tile in latent frames (None = config default, 0 = whole clip), see the module
        docstring for the rule.
        """
        self.check_video_shape(x.shape)
        h = self._moments(x, self._tile(tile_latent_frames))
        z = h[:, : self.cfg.latent_channels]  # (B, C, 1 + k, h, w): KL mean or the latent
        if self.fsq is not None:  # discrete: the FSQ codes in [-1, 1], never normalised
            return self.fsq(z.movedim(1, -1)).movedim(-1, 1)
        return self.normalize(z) if normalize else z

    @torch.no_grad()
    def encode_frames(
        self,
        frames,
        *,
        size: tuple[int, int] | None = None,
        num_frames: int | None = None,
    ) -> Tensor:
        """RGB uint8 frames (F, H, W, 3) (numpy or torch) -> normalised latent (C, T', h, w)
        (a discrete tokenizer: its FSQ codes), on the tokenizer's device.

        The one place a clip becomes a tokenizer input: centre-cropped to ``size`` (H', W')
        (default: the largest multiples of the spatial factor), cut to its first ``num_frames``
        frames (default: the most of the form 1 + k x temporal factor), and mapped to [-1, 1]
        (:func:`pixels_from_uint8`). Too small a clip is a :class:`TokenizerShapeError`."""
        x = torch.as_tensor(frames)
        if x.ndim != 4 or x.shape[-1] != 3:
            raise TokenizerShapeError(f"frames: expected (F, H, W, 3) RGB, got {tuple(x.shape)}")
        f, h, w = x.shape[:3]
        t_c, s = self.cfg.temporal_factor, self.cfg.spatial_factor
        hh, ww = size if size is not None else ((h // s) * s, (w // s) * s)
        keep = num_frames if num_frames is not None else 1 + t_c * ((f - 1) // t_c)
        if h < s or w < s:
            raise TokenizerShapeError(f"{h}x{w} frames are smaller than the spatial factor {s}")
        if hh == 0 or ww == 0 or hh > h or ww > w or keep > f:
            raise TokenizerShapeError(
                f"a {f}-frame {h}x{w} clip cannot give {keep} frames of {hh}x{ww} (spatial "
                f"factor {s}, frames of the form 1 + k x {t_c})"
            )
        y0, x0 = (h - hh) // 2, (w - ww) // 2
        clip = x[:keep, y0 : y0 + hh, x0 : x0 + ww]  # (F', H', W', 3)
        pixels = pixels_from_uint8(clip.permute(3, 0, 1, 2)[None])  # (1, 3, F', H', W')
        device = next(self.parameters()).device
        return self.encode(pixels.to(device))[0]  # (C, T', h, w)

    # ---------------------------------------------------------------- discrete tokens
    def _discrete(self) -> FSQ:
        if self.fsq is None:
            raise TokenizerShapeError(
                "this tokenizer is continuous (no fsq_levels): it has no token ids; train one "
                "with --discrete"
            )
        return self.fsq

    @property
    def vocab_size(self) -> int:
        """Token ids of a discrete tokenizer: prod(fsq_levels)."""
        return self._discrete().vocab_size

    def encode_tokens(self, x: Tensor, *, tile_latent_frames: int | None = None) -> Tensor:
        """Pixels (B, 3, 1 + t_c·k, H, W) -> token ids (B, 1 + k, H/s, W/s) int64."""
        fsq = self._discrete()
        codes = self.encode(x, tile_latent_frames=tile_latent_frames)  # (B, C, T', h, w)
        return fsq.codes_to_indices(codes.movedim(1, -1))

    def decode_tokens(self, ids: Tensor, *, tile_latent_frames: int | None = None) -> Tensor:
        """Token ids (B, 1 + k, h, w) -> pixels (B, 3, 1 + t_c·k, h·s, w·s)."""
        fsq = self._discrete()
        if ids.ndim != 4:
            raise TokenizerShapeError(f"token ids must be (B, 1 + k, h, w), got {tuple(ids.shape)}")
        codes = fsq.indices_to_codes(ids).movedim(-1, 1)  # (B, C, T', h, w)
        dtype = next(self.parameters()).dtype
        return self.decode(codes.to(dtype), normalized=False, tile_latent_frames=tile_latent_frames)

    def decode(
        self, z: Tensor, *, normalized: bool = True, tile_latent_frames: int | None = None
    ) -> Tensor:
        """Latents (B, C, 1 + k, h, w) -> pixels (B, 3, 1 + t_c·k, h·s, w·s), unclamped.

        ``normalized``: ``z`` is normalised (as :meth:`encode` returns by default) or raw.
        """
        self.check_latent_shape(z.shape)
        if normalized and self.fsq is None:
            z = self.denormalize(z)
        tile = self._tile(tile_latent_frames)
        if tile == 0 or z.shape[2] <= 1 + tile:
            return self.decoder(z)
        cache: StreamCache = {}
        bounds = [0, 1 + tile]
        while bounds[-1] < z.shape[2]:
            bounds.append(min(bounds[-1] + tile, z.shape[2]))
        parts = [self.decoder(z[:, :, a:b], cache) for a, b in zip(bounds, bounds[1:])]
        return torch.cat(parts, dim=2)  # (B, 3, 1 + t_c·k, H, W)

    def forward(self, x: Tensor, *, generator: torch.Generator | None = None) -> AutoencoderOutput:
        """Training pass on raw latents: encode, regularise, (sample for KL), decode."""
        self.check_video_shape(x.shape)
        h = self.encoder(x)  # (B, C|2C, 1 + k, h, w)
        c = self.cfg.latent_channels
        if self.cfg.regulariser == "kl":
            mean, logvar = h[:, :c], h[:, c:].clamp(-30.0, 20.0)
            eps = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
            z = mean + torch.exp(0.5 * logvar) * eps  # (B, C, 1 + k, h, w)
            # KL(N(mean, var) || N(0, 1)) per element, Kingma & Welling 2014 (appendix B)
            reg = 0.5 * (mean.square() + logvar.exp() - 1.0 - logvar).mean()
        elif self.fsq is not None:  # straight-through rounding to the FSQ grid
            z = self.fsq(h.movedim(1, -1)).movedim(-1, 1)  # (B, C, 1 + k, h, w)
            # l2: the pre-quantisation latent kept where tanh still responds (unpenalised, the
            # encoder drives it to +-100 and every channel to its two end levels: ~2% of the
            # codebook used, measured on the demo sample)
            reg = h.square().mean() if self.cfg.regulariser == "l2" else z.new_zeros(())
        elif self.cfg.regulariser == "l2":
            z = h
            reg = z.square().mean()
        else:
            z = h
            reg = z.new_zeros(())
        return AutoencoderOutput(recon=self.decoder(z), latent=z, reg=reg)


@torch.no_grad()
def compute_latent_stats(
    model: CausalVideoAutoencoder, clips: Iterable[Tensor], *, max_batches: int | None = None
) -> tuple[Tensor, Tensor]:
    """Per-channel mean and std (each (C,)) of raw latents over ``clips`` (B, 3, T, H, W),
    accumulated in float64. Store them with :meth:`CausalVideoAutoencoder.set_latent_stats`."""
    c = model.cfg.latent_channels
    s1 = torch.zeros(c, dtype=torch.float64)
    s2 = torch.zeros(c, dtype=torch.float64)
    n = 0
    was_training = model.training
    model.eval()
    for i, x in enumerate(clips):
        if max_batches is not None and i >= max_batches:
            break
        z = model.encode(x, normalize=False).double().cpu()  # (B, C, T', h, w)
        s1 += z.sum(dim=(0, 2, 3, 4))
        s2 += z.square().sum(dim=(0, 2, 3, 4))
        n += z.numel() // c
    model.train(was_training)
    if n == 0:
        raise ValueError("compute_latent_stats: no clips")
    mean = s1 / n
    std = (s2 / n - mean.square()).clamp_min(0.0).sqrt().clamp_min(1e-6)
    return mean.float(), std.float()


def ssim_sum(x: Tensor, y: Tensor) -> tuple[float, int]:
    """(sum over frames, frame count) of the SSIM (Wang et al. 2004: 11 x 11 Gaussian window,
    sigma 1.5, K1 0.01, K2 0.03, channel mean) between videos (B, 3, T, H, W) in [-1, 1] (data
    range 2); frames smaller than the window use the whole frame as one window."""
    b, c, t, h, w = x.shape
    a = x.clamp(-1, 1).double().movedim(2, 1).reshape(b * t, c, h, w)  # (B*T, 3, H, W)
    r = y.clamp(-1, 1).double().movedim(2, 1).reshape(b * t, c, h, w)
    size = min(11, h, w)
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * 1.5**2))
    g = g / g.sum()
    kernel = (g[:, None] * g[None, :]).expand(c, 1, size, size)  # depth-wise (3, 1, k, k)

    def blur(z: Tensor) -> Tensor:
        return F.conv2d(z, kernel, groups=c)

    c1, c2 = (0.01 * 2) ** 2, (0.03 * 2) ** 2
    mu_a, mu_r = blur(a), blur(r)
    var_a = blur(a * a) - mu_a**2
    var_r = blur(r * r) - mu_r**2
    cov = blur(a * r) - mu_a * mu_r
    num = (2 * mu_a * mu_r + c1) * (2 * cov + c2)
    s = num / ((mu_a**2 + mu_r**2 + c1) * (var_a + var_r + c2))  # (B*T, 3, H', W')
    return s.mean(dim=(1, 2, 3)).sum().item(), b * t


def psnr(x: Tensor, y: Tensor) -> float:
    """PSNR in dB of videos in [-1, 1] (peak-to-peak 2), after clamping to that range."""
    mse = (x.clamp(-1, 1) - y.clamp(-1, 1)).double().square().mean().item()
    return math.inf if mse == 0 else 10.0 * math.log10(4.0 / mse)
