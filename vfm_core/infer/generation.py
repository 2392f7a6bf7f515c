"""What inference asks a model family: its :class:`Generation` (the inference half of
torchtitan's ``ModelSpec``; :mod:`vfm_core.families` owns the training half and sits below
``infer``, so the samplers and everything built on them live here).

A generation says how a request of its family is planned (the latent's channels, how it splits
over ranks, the options its sampler refuses), what it costs (:mod:`vfm_core.infer.budget`), how
it samples and decodes a video, and how a checkpoint is evaluated (its held-out metric and the
clips it draws). The planner (:mod:`vfm_core.infer.request`), :func:`vfm_core.infer.generate.
generate` and :func:`vfm_core.infer.evaluate.evaluate` hold one and call it, with no branch on
the family; :func:`vfm_core.infer.family_generation.generation_of` picks a config's. A new
family's inference is one subclass, listed in :data:`vfm_core.infer.family_generation.
GENERATIONS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from vfm_core.config import Config
from vfm_core.families import Family
from vfm_core.infer.shapes import GenerateError, LatentPlan

if TYPE_CHECKING:
    from vfm_core.checkpoints.load import LoadedDiT
    from vfm_core.infer.budget import CostEstimate
    from vfm_core.infer.evaluate import EvalConfig
    from vfm_core.infer.request import GenerateRequest
    from vfm_core.tokenizer.config import TokenizerConfig

__all__ = ["Generation", "Sampled"]


@dataclass(kw_only=True, slots=True)
class Sampled:
    """What :meth:`Generation.sample` drew for one request (the same on every rank)."""

    latent: torch.Tensor
    """(1, C, T', h, w): the denoised latent, or the FSQ codes of the sampled tokens."""
    tokens: torch.Tensor | None = None
    """(1, T', h, w) the sampled token ids (token families), else None."""
    ranks: int
    """Ranks that sampled it."""
    steps: int
    """Sampler steps, or model calls (one per token)."""

    @property
    def values(self) -> torch.Tensor:
        """What the family's decoder reads: the token ids, else the latent."""
        return self.latent if self.tokens is None else self.tokens


class Generation:
    """The interface every family's inference implements (the docstrings say what each does)."""

    family: ClassVar[Family]
    """The model family whose checkpoints this generates from."""
    token_prompt: ClassVar[bool] = False
    """Its prompts are token ids, read and checked once by the launcher and handed to every
    rank as a tokens file (else every rank reads the prompt file itself)."""

    # ------------------------------------------------------------------ the request
    def check_request(self, cfg: Config, request: GenerateRequest) -> None:
        """Refuse, in one line, the request's options that only another family's sampler reads
        (never silently ignored)."""
        raise NotImplementedError

    def latent_channels(self, cfg: Config, tok: TokenizerConfig | None) -> int:
        """Channels of the planned latent with a decoder of config ``tok`` (None: none)."""
        raise NotImplementedError

    def latent_split(self, world: int) -> int:
        """Ranks whose token slices the latent's token count must divide (``plan_latent``'s
        ``cp``) when sampling on ``world`` ranks."""
        raise NotImplementedError

    def load_decoder(self, cfg: Config, path: Any) -> Any:
        """The run's tokenizer at ``path``, checked against the model (GenerateError)."""
        raise NotImplementedError

    def prompt(
        self, cfg: Config, request: GenerateRequest, decoder: Any, plan: LatentPlan, s: int
    ) -> torch.Tensor | None:
        """The checked prompt the sampler continues (spatial factor ``s``), or None: token ids
        (1, P) of the autoregressive family, clean latent frames (1, C, K, h, w) of the
        diffusion family."""
        return None

    # ------------------------------------------------------------------ the cost
    def estimate(
        self,
        cfg: Config,
        request: GenerateRequest,
        plan: LatentPlan,
        *,
        steps: int,
        guidance: float,
        dtype_bytes: int,
        **common: Any,
    ) -> CostEstimate:
        """Memory and time of sampling and decoding ``plan`` (``common``: the decoder, ranks,
        rate and device type :mod:`vfm_core.infer.budget` takes for every family)."""
        raise NotImplementedError

    def time_flags(self, steps: int) -> tuple[str, ...]:
        """Flags beyond the size that shorten sampling at ``steps`` steps."""
        return ()

    def probe_call(
        self, loaded: LoadedDiT, request: GenerateRequest, plan: LatentPlan, *, guidance: float
    ) -> Callable[[], Any]:
        """One steady model call of sampling ``plan``, inputs built (what
        :mod:`vfm_core.infer.probe` times; :attr:`CostEstimate.call_s` is its estimate): a
        denoiser call, or one cached token step half-way through the video."""
        raise NotImplementedError

    # ------------------------------------------------------------------ sampling and decoding
    def sample(
        self,
        loaded: LoadedDiT,
        request: GenerateRequest,
        plan: LatentPlan,
        *,
        text: torch.Tensor,
        null: torch.Tensor,
        prompt: torch.Tensor | None,
        decoder: Any,
        steps: int,
        guidance: float,
        show: bool,
        world: int,
    ) -> Sampled:
        """Sample the request's video on ``world`` ranks from its seed, conditioned on ``text``
        with the unconditional ``null`` (each (1, L, Dt)); ``show``: progress on stderr."""
        raise NotImplementedError

    def codes(self, cfg: Config, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        """The latent (B, C, T', h, w) of sampled ``values`` (without a decoder: what the
        latent preview shows)."""
        raise NotImplementedError

    def decode(self, decoder: Any, values: torch.Tensor) -> torch.Tensor:
        """Videos (B, 3, F, H, W) in ~[-1, 1] of sampled ``values`` by the run's tokenizer."""
        raise NotImplementedError

    # ------------------------------------------------------------------ evaluation
    def heldout(
        self,
        model: torch.nn.Module,
        cfg: Config,
        values: torch.Tensor,
        text: torch.Tensor,
        ec: EvalConfig,
        *,
        desc: str = "held-out loss",
    ) -> dict[str, float]:
        """The held-out metric of ``values`` with captions ``text`` (its ``heldout_loss`` key
        included); ``desc`` names its progress lines."""
        raise NotImplementedError

    def eval_batch(self, ec: EvalConfig) -> int:
        """Clips per call of :meth:`eval_draws`'s sampler."""
        raise NotImplementedError

    def eval_draws(
        self,
        model: torch.nn.Module,
        cfg: Config,
        ec: EvalConfig,
        null: torch.Tensor,
        shape: torch.Size,
        *,
        guidance: float,
    ) -> Callable[..., torch.Tensor]:
        """``draw(i, text, prompt=None)``: the clips of rows ``i ..`` of ``shape`` for ``text``
        (b, L, Dt), drawn from seed ``ec.seed + 1`` so every checkpoint sees the same noise;
        ``prompt``: their leading latent frames, kept as given and continued (latents
        (b, C, K, H, W) | token ids (b, K, H, W))."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared
    def _refuse(
        self, cfg: Config, request: GenerateRequest, names: tuple[str, ...], what: str, takes: str
    ) -> None:
        """Refuse the request's fields ``names`` set away from their defaults: ``what`` they
        are, and what this run's sampler ``takes`` instead."""
        defaults = {f.name: f.default for f in fields(request)}
        given = ["--" + n.replace("_", "-") for n in names if getattr(request, n) != defaults[n]]
        if given:
            raise GenerateError(
                f"{' / '.join(given)}: {what}; this run's model.arch is {cfg.model.arch!r} (its "
                f"sampler {takes})"
            )

    def __repr__(self) -> str:
        return f"<generation {self.family.name}>"
