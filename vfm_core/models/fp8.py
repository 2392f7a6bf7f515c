"""Thin, runtime-selected FP8 adapter (``train.fp8: off | auto | on``): transformer-engine
linears under ``fp8_autocast`` where TE is installed (optional ``gpu`` extra), else torch-native
FP8 linears (``torch._scaled_mm``, :mod:`vfm_core.models.fp8_torch`).

FP8 GEMMs need an Ada / Hopper GPU (compute capability >= 8.9); transformer-engine cannot be
imported without CUDA, so everything TE-specific is imported lazily. What runs:

* :func:`fp8_status` / :func:`fp8_backend` say whether FP8 can run and which backend: ``"te"``
  (transformer-engine importable: delayed scaling, HYBRID e4m3/e5m2), ``"torch"`` (TE absent or
  broken: tensorwise dynamic scaling per call, the recipe of torchao's ``Float8Linear``) or
  ``None`` (no CUDA, or a GPU older than 8.9);
* :func:`resolve_fp8` maps the setting to on/off and says why (``auto`` falls back to the
  configured dtype; ``on`` where FP8 cannot run is a :class:`ConfigError` naming the setting);
* :func:`fp8_linear_names` picks the GEMMs that go to FP8: the projections and MLP inside the
  transformer blocks whose sizes FP8 kernels accept (multiples of 16). AdaLN modulation, the
  embedders and the final layer stay in the higher precision (the paper keeps the conditioning
  path and the output in bf16);
* :func:`to_fp8_linears` swaps those ``nn.Linear`` for the backend's FP8 linear
  (:func:`to_te_linears`: ``te.Linear``; torch: ``fp8_torch.Float8Linear``) with the same
  parameter names (checkpoints stay interchangeable with the torch model). On a model built on
  the ``meta`` device (what :func:`vfm_core.parallel.apply.apply_layout` converts) only module
  classes change and no data is touched: the layout then shards, materialises and initialises
  the FP8 linears like every other module, so no rank holds the whole model and the weights
  equal the non-FP8 model's for the same seed (torchao's ``convert_to_float8_training`` on a
  meta model, torchtitan's order). On a materialised model the weights come along;
* :func:`fp8_autocast` is TE's ``fp8_autocast`` when on with the TE backend, a no-op context
  otherwise (the torch backend scales every call itself).

Tensor parallelism shards ``nn.Linear`` with DTensor plans, which neither FP8 linear handles,
so FP8 with ``parallel.tp > 1`` resolves to off (``auto``) or is refused (``on``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from vfm_core.config import ConfigError
from vfm_core.models.linear_swap import swap_linears
from vfm_core.models.te_adapter import te_status

FP8_MIN_CAPABILITY = (8, 9)
_FP8_SKIP = ("modulation",)  # AdaLN: conditioning path stays in bf16 / fp32


def _fp8_select() -> tuple[str | None, str]:
    """(backend or None, reason): ``"te"``, ``"torch"`` or ``None`` (module docstring)."""
    if not torch.cuda.is_available():
        return None, "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if cap < FP8_MIN_CAPABILITY:
        return None, f"GPU compute capability {cap[0]}.{cap[1]} < 8.9 (FP8 needs Ada or Hopper)"
    te_usable, te_reason = te_status()  # CUDA present: transformer-engine importable?
    if te_usable:
        return "te", "transformer-engine FP8 (delayed scaling, HYBRID)"
    if not hasattr(torch, "_scaled_mm"):
        return None, f"{te_reason}; this torch has no _scaled_mm"
    why = (
        "transformer-engine not installed"
        if te_reason.startswith("transformer-engine not installed")
        else te_reason
    )
    return "torch", f"torch-native FP8 (torch._scaled_mm, tensorwise dynamic scaling; {why})"


def fp8_status() -> tuple[bool, str]:
    """(usable, reason) for FP8 GEMMs on this machine, by either backend (:func:`fp8_backend`)."""
    backend, reason = _fp8_select()
    return backend is not None, reason


def fp8_backend() -> str | None:
    """The FP8 backend this machine runs: ``"te"`` (transformer-engine), ``"torch"``
    (``torch._scaled_mm``) or ``None`` (FP8 cannot run; :func:`fp8_status` says why)."""
    return _fp8_select()[0]


def resolve_fp8(requested: str, *, tp: int = 1, lora: bool = False) -> tuple[bool, str]:
    """``train.fp8`` ('off', 'auto', 'on') -> (FP8 on?, why); ``lora``: the run adds LoRA
    adapters, which FP8 linears do not take."""
    if requested == "off":
        return False, "off (configured)"
    if requested not in ("auto", "on"):
        raise ConfigError(f"train.fp8: unknown value {requested!r} (off | auto | on)")
    usable, reason = fp8_status()
    if usable and tp > 1:
        usable, reason = (
            False,
            (
                f"parallel.tp={tp}: DTensor tensor parallelism shards plain torch linears, "
                "not FP8 ones"
            ),
        )
    if usable and lora:
        usable, reason = False, "train.lora: LoRA adapters are added to plain linears, not FP8"
    if requested == "on" and not usable:
        raise ConfigError(f"train.fp8: 'on' requested but FP8 cannot run: {reason}")
    return usable, reason if usable else f"off ({reason})"


def fp8_linear_names(model: nn.Module) -> list[str]:
    """Names of the ``nn.Linear`` modules inside ``model.blocks`` that run in FP8: not AdaLN
    modulation, both feature sizes multiples of 16 (FP8 GEMM alignment)."""
    names = []
    for name, mod in model.named_modules():
        if not name.startswith("blocks.") or not isinstance(mod, nn.Linear):
            continue
        if any(part in _FP8_SKIP for part in name.split(".")):
            continue
        if mod.in_features % 16 or mod.out_features % 16:
            continue
        names.append(name)
    return names


def to_te_linears(model: nn.Module) -> int:
    """Replace the FP8-eligible linears of ``model`` by ``transformer_engine.pytorch.Linear``
    with the same parameter names; returns how many were replaced (CUDA + TE only). A meta
    linear becomes a meta ``te.Linear`` (TE defers its own initialisation on ``meta``: the
    layout's ``to_empty`` + ``init_parameters`` fill it); a materialised one keeps its weights."""
    backend, reason = _fp8_select()
    if backend != "te":
        reason = reason if backend is None else te_status()[1]
        raise ConfigError(f"train.fp8: cannot convert linears to transformer-engine: {reason}")
    import transformer_engine.pytorch as te

    def te_linear(old: nn.Linear) -> nn.Module:
        meta = old.weight.is_meta
        new = te.Linear(
            old.in_features,
            old.out_features,
            bias=old.bias is not None,
            params_dtype=old.weight.dtype,
            device="meta" if meta else old.weight.device,  # TE compares with the string
        )
        if not meta:
            with torch.no_grad():
                new.weight.copy_(old.weight)
                if old.bias is not None:
                    new.bias.copy_(old.bias)
        return new.train(old.training)

    return swap_linears(model, fp8_linear_names(model), te_linear)


def to_fp8_linears(model: nn.Module, *, backend: str | None = None) -> int:
    """Replace the FP8-eligible linears of ``model`` (:func:`fp8_linear_names`) by the FP8
    linears of ``backend`` (``"te"`` or ``"torch"``; None: this machine's, :func:`fp8_backend`)
    with the same parameter names; returns how many were replaced. On ``meta`` only the module
    classes change (module docstring). Raises :class:`ConfigError` where the backend cannot
    be used (None: FP8 cannot run here; ``"te"``: transformer-engine not usable)."""
    if backend is None:
        backend, reason = _fp8_select()
        if backend is None:
            raise ConfigError(f"train.fp8: cannot convert linears to FP8: {reason}")
    if backend == "te":
        return to_te_linears(model)
    if backend == "torch":
        from vfm_core.models.fp8_torch import to_torch_fp8_linears

        return to_torch_fp8_linears(model, fp8_linear_names(model))
    raise ConfigError(f"train.fp8: unknown FP8 backend {backend!r} (te | torch)")


FP8_STATE_SUFFIX = "._extra_state"


def drop_fp8_state(state: dict) -> dict:
    """A model state dict without TE's ``_extra_state`` entries (FP8 scaling history, which TE may
    serialise with pickle): checkpoints hold plain tensors only, the same keys as the torch model;
    after a resume the amax history starts afresh."""
    return {k: v for k, v in state.items() if not k.endswith(FP8_STATE_SUFFIX)}


@contextlib.contextmanager
def fp8_autocast(enabled: bool) -> Iterator[None]:
    """TE's FP8 autocast (delayed scaling, e4m3 forward / e5m2 gradients) when ``enabled`` and
    the backend is transformer-engine; a no-op context otherwise (the torch backend's linears
    scale every call themselves)."""
    if not enabled or fp8_backend() == "torch":
        yield
        return
    import transformer_engine.pytorch as te
    from transformer_engine.common.recipe import DelayedScaling, Format

    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    with te.fp8_autocast(enabled=True, fp8_recipe=recipe):
        yield
