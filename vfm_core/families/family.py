"""What a model family is: one object that the layers above ask instead of comparing
``model.arch`` with a string (torchtitan's ``ModelSpec``).

A family owns its network builder, its training objective, the non-shared terms of the FLOP and
parameter accounting, its layout rules and its synthetic training data. The shared parts live
below it (:mod:`vfm_core.families.terms`, :mod:`vfm_core.families.objective`); the trainer, the
planner and the data source factory hold a family and call it. A new family is one module with a
:class:`Family` subclass, listed in :data:`vfm_core.families.FAMILIES`, and one row of
:data:`vfm_core.config.FAMILY_TRAITS` (its archs and torch-free traits). Its sampler, decoding and
evaluation metric live above this layer, in its ``vfm_core.infer.generation.Generation`` (listed
in ``vfm_core.infer.family_generation.GENERATIONS``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from torch import nn

from vfm_core.config import FAMILY_TRAITS, Config, DataConfig, ModelConfig
from vfm_core.families.terms import Term
from vfm_core.geometry import Grid

if TYPE_CHECKING:
    from vfm_core.data.samples import LatentSource
    from vfm_core.families.objective import Objective


class Family:
    """The interface every family implements (the docstrings say what each returns)."""

    name: ClassVar[str]
    """The family's name in forms, recipes and MLflow (``diffusion``, ``autoregressive``): its
    row of :data:`vfm_core.config.FAMILY_TRAITS`, which sets ``archs`` and ``discrete``."""
    archs: ClassVar[tuple[str, ...]]
    """The ``model.arch`` values whose networks this family builds."""
    discrete: ClassVar[bool]
    """Trains on the token ids of a discrete tokenizer (True) or on continuous latents."""

    def __init_subclass__(cls, **kw: Any) -> None:
        """A family's archs and traits come from its row of the torch-free table (by ``name``),
        which the config checks and the recipes read too; a family never repeats them."""
        super().__init_subclass__(**kw)
        traits = FAMILY_TRAITS[cls.name]
        cls.archs, cls.discrete = traits.archs, traits.discrete

    model_cls: ClassVar[type[nn.Module]]
    """The network, built from the model config."""
    objective_cls: ClassVar[type[Objective]]
    """The training objective (:class:`vfm_core.families.objective.Objective`)."""

    # ------------------------------------------------------------------ model and objective
    def build(self, cfg: ModelConfig) -> nn.Module:
        """The network, constructed on the current default device, uninitialised."""
        return self.model_cls(cfg)

    def objective(self, cfg: Config, **kw: Any) -> Objective:
        """The training objective for ``cfg`` (``kw``: the trainer's draws, device, batch)."""
        return self.objective_cls(cfg, **kw)

    # ------------------------------------------------------------------ accounting
    def flop_terms(
        self, cfg: ModelConfig, lens: list[int], grid: Grid | Sequence[Grid] | None, L: float
    ) -> list[Term]:
        """Every matmul of one forward over samples of ``lens`` tokens and ``L`` caption
        tokens (one row, batch 1)."""
        raise NotImplementedError

    def conditioning_flops(self, cfg: ModelConfig, timestep_embed: float) -> float:
        """Trained FLOPs per sample spent on the conditioning vector (no token in them)."""
        raise NotImplementedError

    def block_norm_params(self, cfg: ModelConfig, sublayers: int) -> int:
        """A block's normalisation / modulation parameters for ``sublayers`` sub-layers."""
        raise NotImplementedError

    def nonblock_params(self, cfg: ModelConfig) -> int:
        """Every parameter outside the blocks."""
        raise NotImplementedError

    def stage_nonblock_params(self, cfg: ModelConfig, *, stage: int, stages: int, tp: int) -> float:
        """The non-block parameters one GPU of pipeline stage ``stage`` of ``stages`` holds
        before FSDP sharding (tensor-parallel parts / tp)."""
        raise NotImplementedError

    def output_activation_bytes(
        self, cfg: ModelConfig, *, tokens: float, tp: int, act_bytes: float
    ) -> float:
        """Activations of the output beyond the blocks' own per micro-batch of ``tokens``."""
        return 0.0

    # ------------------------------------------------------------------ layouts and data
    def layout_reason(self, cfg: ModelConfig, *, cp: int, cp_mode: str) -> str | None:
        """Why a context-parallel layout cannot run this family (None: it can)."""
        return None

    def synthetic_source(
        self, data: DataConfig, model: ModelConfig, *, sigma_data: float
    ) -> LatentSource:
        """The built-in training data of ``data.source='synthetic'``."""
        raise NotImplementedError

    def tokenizer_channels(self, model: ModelConfig) -> int | None:
        """The latent channels the run's tokenizer must have (None: any, e.g. its FSQ codes)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<family {self.name}>"
