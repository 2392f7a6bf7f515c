"""Causal 3D building blocks: convolution, per-frame normalisation, residual block, re-sampling.

Causal in time means output frame ``t`` depends only on input frames ``<= t``: every temporal kernel
is padded on the past side only, by replicating the first frame (as in the causal video VAEs of
MAGVIT-v2, https://arxiv.org/abs/2310.05737, Sec. 3.1, and Cosmos tokenizer,
https://arxiv.org/abs/2501.03575, Sec. 3). Normalisation is an RMSNorm over channels per voxel or a
GroupNorm per frame, so it never mixes statistics across time either. Consequences:

* the first frame is processed alone, so an image is a one-frame video;
* a long video can be processed in temporal chunks with **exact** results when every causal conv
  carries the last ``L - n_out·stride`` frames of its padded input to the next chunk (a
  :data:`StreamCache`), the scheme used for chunked encoding by e.g. Mochi's and CogVideoX's causal
  VAEs. Passing ``cache=None`` processes a whole clip at once.

A temporal 2x down-sampling conv (kernel 3, stride 2, 2 replicate frames of past padding) maps
``1 + 2m`` frames to ``1 + m``; the matching up-sampling repeats every frame twice and drops the
first copy of frame 0, mapping ``1 + m`` to ``1 + 2m``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "CausalConv3d",
    "CausalDownsample",
    "CausalResBlock",
    "CausalPatchify",
    "CausalUnpatchify",
    "CausalUpsample",
    "ChannelRMSNorm",
    "FrameGroupNorm",
    "StreamCache",
    "make_norm",
]

StreamCache = dict[nn.Module, Tensor]
"""State carried between temporal chunks: per module, the trailing frames its next chunk needs
(for :class:`CausalUpsample`, an empty marker meaning "the first frame has been seen")."""


class CausalConv3d(nn.Module):
    """3D convolution, causal in time (replicate-pad the past), zero 'same' padding in space.

    Output length for a whole clip of ``T`` frames: ``(T - 1) // stride_t + 1``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int] = 3,
        *,
        stride: tuple[int, int, int] = (1, 1, 1),
    ) -> None:
        super().__init__()
        k = (kernel_size,) * 3 if isinstance(kernel_size, int) else tuple(kernel_size)
        self.kernel_t, self.stride_t = k[0], stride[0]
        self.conv = nn.Conv3d(
            in_channels, out_channels, k, stride=stride, padding=(0, k[1] // 2, k[2] // 2)
        )

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        kt, st = self.kernel_t, self.stride_t
        prev = cache.get(self) if cache is not None else None
        if prev is None:  # start of the clip: replicate the first frame kt - 1 times
            prev = x[:, :, :1].expand(-1, -1, kt - 1, -1, -1)  # (B, C, kt-1, H, W)
        xp = torch.cat([prev, x], dim=2)  # (B, C, P + T, H, W)
        n_out = (xp.shape[2] - kt) // st + 1
        if cache is not None:  # frames not yet consumed by a full kernel window
            cache[self] = xp[:, :, n_out * st :].clone()  # (B, C, L - n_out*st, H, W)
        if n_out < 1:
            raise ValueError(
                f"temporal chunk of {x.shape[2]} frames too short for a causal conv with "
                f"kernel {kt} and stride {st}"
            )
        return self.conv(xp[:, :, : (n_out - 1) * st + kt])  # (B, C_out, n_out, H', W')


class FrameGroupNorm(nn.GroupNorm):
    """GroupNorm over (C/G, H, W) of each frame separately: no statistics across time."""

    def forward(self, x: Tensor) -> Tensor:
        b, c, t, h, w = x.shape
        y = x.transpose(1, 2).reshape(b * t, c, h, w)  # (B*T, C, H, W)
        y = F.group_norm(y, self.num_groups, self.weight, self.bias, self.eps)
        return y.reshape(b, t, c, h, w).transpose(1, 2)  # (B, C, T, H, W)


class ChannelRMSNorm(nn.Module):
    """RMS normalisation over channels at every voxel (as the Wan 2.1 video VAE's ``RMS_norm``,
    https://arxiv.org/abs/2503.20314): no statistics across space or time, so it is causal and
    tile-exact, and it keeps the absolute level of each position (faster to train than GroupNorm
    on small CPU models)."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.scale, self.eps = channels**0.5, eps

    def forward(self, x: Tensor) -> Tensor:
        y = F.normalize(x, dim=1, eps=self.eps) * self.scale  # (B, C, T, H, W)
        return y * self.weight.view(1, -1, 1, 1, 1) + self.bias.view(1, -1, 1, 1, 1)


def make_norm(kind: str, channels: int, groups: int) -> nn.Module:
    """``rms``: :class:`ChannelRMSNorm`; ``group``: :class:`FrameGroupNorm` with ``groups``."""
    if kind == "rms":
        return ChannelRMSNorm(channels)
    if kind == "group":
        return FrameGroupNorm(groups, channels)
    raise ValueError(f"unknown norm {kind!r} (rms or group)")


class CausalResBlock(nn.Module):
    """Pre-activation residual block: (norm, SiLU, causal conv) x 2 + skip (1x1x1 when widths
    differ), as in the VAE of Rombach et al. 2022 (https://arxiv.org/abs/2112.10752) made causal;
    the second conv starts at zero so the block starts as the identity (skip) map."""

    def __init__(
        self, in_channels: int, out_channels: int, *, groups: int, norm: str = "rms"
    ) -> None:
        super().__init__()
        self.norm1 = make_norm(norm, in_channels, groups)
        self.conv1 = CausalConv3d(in_channels, out_channels, 3)
        self.norm2 = make_norm(norm, out_channels, groups)
        self.conv2 = CausalConv3d(out_channels, out_channels, 3)
        # zero-init the residual branch: every block starts as identity (Goyal et al. 2017,
        # https://arxiv.org/abs/1706.02677, Sec. 5.1), which trains faster from scratch
        nn.init.zeros_(self.conv2.conv.weight)
        nn.init.zeros_(self.conv2.conv.bias)
        self.skip = (
            nn.Conv3d(in_channels, out_channels, 1)
            if in_channels != out_channels
            else nn.Identity()
        )

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)), cache)  # (B, C_out, T, H, W)
        h = self.conv2(F.silu(self.norm2(h)), cache)  # (B, C_out, T, H, W)
        return self.skip(x) + h


class CausalDownsample(nn.Module):
    """2x spatial and/or 2x causal temporal down-sampling by a strided causal conv:
    ``(B, C, 1 + 2m, H, W) -> (B, C', 1 + m, H/2, W/2)`` when both.

    ``shortcut``: add a parameter-free residual, space-to-depth of the input averaged over channel
    groups (DC-AE, Chen et al. 2024, https://arxiv.org/abs/2410.10733, Sec. 3.2, made causal with
    :class:`CausalPatchify`): it makes high-compression autoencoders train much faster."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        temporal: bool,
        spatial: bool = True,
        shortcut: bool = False,
    ) -> None:
        super().__init__()
        st, ss = (2 if temporal else 1), (2 if spatial else 1)
        self.conv = CausalConv3d(in_channels, out_channels, 3, stride=(st, ss, ss))
        self.shortcut = CausalPatchify(st, ss) if shortcut else None
        self.group = in_channels * st * ss * ss // out_channels
        if shortcut and self.group * out_channels != in_channels * st * ss * ss:
            raise ValueError(f"shortcut: {out_channels} must divide {in_channels}·{st * ss * ss}")

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        y = self.conv(x, cache)  # (B, C', 1 + m, H/2, W/2)
        if self.shortcut is None:
            return y
        r = self.shortcut(x, cache)  # (B, C·st·ss², 1 + m, H/2, W/2)
        b, c, t, h, w = r.shape
        return y + r.view(b, c // self.group, self.group, t, h, w).mean(dim=2)


class CausalUpsample(nn.Module):
    """2x nearest spatial (and optionally causal temporal) up-sampling followed by a causal conv.

    Temporal: each frame is repeated twice and, at the start of a clip, the first copy of frame 0 is
    dropped, so ``1 + m`` frames become ``1 + 2m`` and frame 0 stays a single (image) frame.
    ``shortcut``: add depth-to-space of the channel-repeated input (DC-AE's up-sampling residual).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        *,
        temporal: bool,
        spatial: bool = True,
        shortcut: bool = False,
    ) -> None:
        super().__init__()
        self.temporal, self.spatial = temporal, spatial
        self.conv = CausalConv3d(in_channels, out_channels, 3)
        st, ss = (2 if temporal else 1), (2 if spatial else 1)
        self.shortcut = CausalUnpatchify(st, ss) if shortcut else None
        self.repeat = out_channels * st * ss * ss // in_channels
        if shortcut and self.repeat * in_channels != out_channels * st * ss * ss:
            raise ValueError(f"shortcut: {in_channels} must divide {out_channels}·{st * ss * ss}")

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        r = None
        if self.shortcut is not None:  # depth-to-space of channel-repeated input
            r = self.shortcut(x.repeat_interleave(self.repeat, dim=1), cache)  # (B, C', T', 2H, 2W)
        if self.temporal:
            x = x.repeat_interleave(2, dim=2)  # (B, C, 2T, H, W)
            if cache is None or self not in cache:  # first chunk: frame 0 is not duplicated
                x = x[:, :, 1:]  # (B, C, 2T - 1, H, W)
                if cache is not None:
                    cache[self] = x.new_empty(0)
        if self.spatial:
            b, c, t, h, w = x.shape
            x = F.interpolate(x.reshape(b, c * t, h, w), scale_factor=2.0, mode="nearest")
            x = x.reshape(b, c, t, 2 * h, 2 * w)  # (B, C, T', 2H, 2W)
        y = self.conv(x, cache)  # (B, C_out, T', H', W')
        return y if r is None else y + r


class CausalPatchify(nn.Module):
    """Causal space-time space-to-depth: ``(B, C, 1 + pt·k, H, W) -> (B, C·pt·ps², 1 + k, H/ps,
    W/ps)``. At the clip start frame 0 is replicated ``pt - 1`` times, so the first output frame
    holds frame 0 alone (as the causal padding of Cosmos tokenizer's wavelet patching, Sec. 3).
    Channel order is (c, dt, dy, dx)."""

    def __init__(self, patch_t: int, patch_s: int) -> None:
        super().__init__()
        self.pt, self.ps = patch_t, patch_s

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        pt, ps = self.pt, self.ps
        if pt > 1 and (cache is None or self not in cache):
            first = x[:, :, :1].expand(-1, -1, pt - 1, -1, -1)  # (B, C, pt - 1, H, W)
            x = torch.cat([first, x], dim=2)  # (B, C, pt·(1 + k), H, W)
            if cache is not None:
                cache[self] = x.new_empty(0)
        b, c, t, h, w = x.shape
        if t % pt:
            raise ValueError(f"temporal chunk of {t} frames is not a multiple of patch_t {pt}")
        x = x.reshape(b, c, t // pt, pt, h // ps, ps, w // ps, ps)
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6)  # (B, C, pt, ps, ps, T/pt, H/ps, W/ps)
        return x.reshape(b, c * pt * ps * ps, t // pt, h // ps, w // ps)


class CausalUnpatchify(nn.Module):
    """Inverse of :class:`CausalPatchify`: ``(B, C·pt·ps², 1 + k, h, w) -> (B, C, 1 + pt·k, h·ps,
    w·ps)``; at the clip start the first ``pt - 1`` (padding) frames are dropped."""

    def __init__(self, patch_t: int, patch_s: int) -> None:
        super().__init__()
        self.pt, self.ps = patch_t, patch_s

    def forward(self, x: Tensor, cache: StreamCache | None = None) -> Tensor:
        pt, ps = self.pt, self.ps
        b, cp, t, h, w = x.shape
        c = cp // (pt * ps * ps)
        x = x.reshape(b, c, pt, ps, ps, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
        x = x.reshape(b, c, t * pt, h * ps, w * ps)  # (B, C, pt·T, H, W)
        if pt > 1 and (cache is None or self not in cache):
            x = x[:, :, pt - 1 :]  # (B, C, 1 + pt(T-1), H, W)
            if cache is not None:
                cache[self] = x.new_empty(0)
        return x
