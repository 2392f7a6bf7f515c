"""Random numbers per parallel dimension (paper Table 3), independent of the layout.

| draw                      | across DP         | across CP         | across TP / PP        |
|---------------------------|-------------------|-------------------|-----------------------|
| timestep sigma, CFG drop  | differ            | same              | same                  |
| Gaussian noise            | differ            | differ            | same                  |
| weight init               | one (FSDP: shard) | one (FSDP: shard) | shards/stages of one  |

Instead of one sequential stream per rank (whose numbers would change with the rank count) every
draw is *counter-based*: a function of (seed, purpose, step, global sample index[, latent frame]).
Data-parallel ranks hold different samples, so their sigma and noise differ; the ranks of one
CP x TP x PP group hold the same samples, so their sigma is the same; a CP rank draws the noise of
its own latent frames only, so CP ranks differ — and every layout, one process included, produces
the same global sigma and noise, which is what makes N-process training equal 1-process training.

Weight init is not drawn here: every rank builds the model on the ``meta`` device, keeps only its
own pipeline stages and TP / FSDP shards, and fills them from generators keyed by (seed, parameter
name, row block) (:mod:`vfm_core.models.init`, in the order of :mod:`vfm_core.parallel.apply`),
so no rank ever holds the full model and the shards gather to the single-process init.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

_PURPOSES = ("sigma", "noise", "keep", "frames")


def counter_generator(seed: int, purpose: str, *counters: int, device="cpu") -> torch.Generator:
    """A generator seeded by a hash of (seed, purpose, counters): independent streams per key."""
    if purpose not in _PURPOSES:
        raise ValueError(f"rng purpose {purpose!r} unknown (known: {_PURPOSES})")
    key = ":".join(str(int(c)) for c in (seed, *counters))
    digest = hashlib.blake2b(f"{purpose}:{key}".encode(), digest_size=8).digest()
    return torch.Generator(device=device).manual_seed(int.from_bytes(digest, "little") >> 1)


@dataclass(kw_only=True, slots=True)
class StepRNG:
    """The draws of one rank: which global samples it holds and which latent frames it owns."""

    seed: int
    """Run seed (``train.seed``)."""
    dp_rank: int = 0
    """This rank's data-parallel index: it holds samples [dp_rank*B, (dp_rank+1)*B)."""
    cp_rank: int = 0
    """This rank's context-parallel index: it owns latent frames chunk ``cp_rank`` of ``cp``."""
    cp: int = 1
    """Context-parallel degree."""

    @classmethod
    def from_dims(cls, seed: int, dims) -> StepRNG:
        """Coordinates from a built :class:`vfm_core.parallel.dims.ParallelDims`."""
        return cls(seed=seed, dp_rank=dims.dp_rank(), cp_rank=dims.coord("cp"), cp=dims.cp)

    def sample_ids(self, batch: int) -> range:
        """Global indices of this rank's ``batch`` samples within the global batch."""
        return range(self.dp_rank * batch, (self.dp_rank + 1) * batch)

    def sigma(self, step: int, batch: int, *, p_mean: float, p_std: float) -> torch.Tensor:
        """EDM training noise levels ln(sigma) ~ N(p_mean, p_std^2), (B,) float64."""
        n = torch.cat(
            [
                torch.randn(
                    1, generator=counter_generator(self.seed, "sigma", step, i), dtype=torch.float64
                )
                for i in self.sample_ids(batch)
            ]
        )  # (B,)
        return (p_mean + p_std * n).exp()

    def keep_caption(self, step: int, batch: int, dropout: float) -> torch.Tensor:
        """Classifier-free-guidance caption keep mask (B,) bool: dropped with prob ``dropout``."""
        u = torch.cat(
            [
                torch.rand(
                    1, generator=counter_generator(self.seed, "keep", step, i), dtype=torch.float64
                )
                for i in self.sample_ids(batch)
            ]
        )  # (B,)
        return u >= dropout

    def cond_frames(self, step: int, batch: int, share: float, most: int) -> torch.Tensor:
        """Clean leading latent frames of each sample (B,) int64 (video-to-world training): 0
        with probability 1 - ``share``, else uniform in 1..``most``."""
        out = []
        for i in self.sample_ids(batch):
            g = counter_generator(self.seed, "frames", step, i)
            u = torch.rand(2, generator=g, dtype=torch.float64)  # (2,)
            out.append(0 if float(u[0]) >= share else 1 + int(float(u[1]) * most))
        return torch.tensor(out, dtype=torch.int64)  # (B,)

    def cp_frames(self, frames: int) -> range:
        """The latent frames this CP rank owns (contiguous chunk; tokens are (t, h, w) raster)."""
        if frames % self.cp:
            raise ValueError(
                f"latent frames {frames} cannot be split evenly over cp={self.cp} ranks"
            )
        per = frames // self.cp
        return range(self.cp_rank * per, (self.cp_rank + 1) * per)

    def noise(
        self, step: int, shape: tuple[int, ...], *, frames: range | None = None
    ) -> torch.Tensor:
        """Standard normal noise for latents of ``shape`` (B, C, T, H, W), float32.

        ``frames=None`` draws all T frames; pass :meth:`cp_frames` to draw this CP rank's frames
        only: the result is then (B, C, len(frames), H, W) and equals that slice of the full draw.
        """
        b, c, t, h, w = shape
        frames = range(t) if frames is None else frames
        if frames and (frames.start < 0 or frames.stop > t):
            raise ValueError(f"frames {frames} outside the {t} latent frames")
        per_sample = []
        for i in self.sample_ids(b):
            per_frame = [
                torch.randn(c, h, w, generator=counter_generator(self.seed, "noise", step, i, f))
                for f in frames
            ]  # len(frames) x (C, H, W)
            per_sample.append(torch.stack(per_frame, dim=1))  # (C, t', H, W)
        return torch.stack(per_sample)  # (B, C, t', H, W)
