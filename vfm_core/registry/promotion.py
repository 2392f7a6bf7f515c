"""When a registered version becomes the ``champion``: a stated rule, its reason recorded.

:func:`decide` compares a candidate's evaluation metrics with the champion's (both the
``eval.*`` tags :func:`vfm_core.registry.register_checkpoint` writes); :func:`promote` moves the
alias when the rule holds and writes the decision on the candidate version either way:

* no champion yet: the candidate becomes it ("first version");
* else every metric of ``higher_is_better`` must be ``>= champion * (1 - tolerance)`` and every
  metric of ``lower_is_better`` ``<= champion * (1 + tolerance)`` (a relative slack; 0 = no worse);
  a metric the champion lacks is not compared (named in the reason), one the candidate lacks
  while the champion has it fails the rule.

Tags on the candidate: ``vfm.promotion`` (``promoted`` / ``rejected``), ``vfm.promotion_reason``,
``vfm.promotion_vs`` (the champion version compared with); a promoted version's description is
the reason, and ``vfm.previous_champion`` names the version it replaced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vfm_core.config import TrackingConfig
from vfm_core.tracking import open_tracking_store

__all__ = ["METRIC_TAG", "PromotionRule", "Decision", "decide", "promote", "version_metrics"]

METRIC_TAG = "eval."
"""Prefix of a version's evaluation-metric tags (``eval.frechet_distance``)."""


@dataclass(kw_only=True, slots=True)
class PromotionRule:
    """What a candidate must show to replace the champion."""

    alias: str = "champion"
    """The alias that marks the version to serve."""
    higher_is_better: tuple[str, ...] = ("prompt_colour_acc", "prompt_direction_acc")
    """Metrics that must not drop (prompt following: colour and direction accuracy)."""
    lower_is_better: tuple[str, ...] = ("frechet_distance", "heldout_loss")
    """Metrics that must not rise: Fréchet distance to held-out clips, and the held-out loss
    (a diverged model's is thousands of times the champion's, while the Fréchet distance of a
    few samples can happen to be lower)."""
    tolerance: float = 0.0
    """Relative slack on every comparison (0.05: up to 5% worse still passes)."""

    def __post_init__(self) -> None:
        from vfm_core.checkpoints.uri import RegistryError

        self.higher_is_better = tuple(self.higher_is_better)
        self.lower_is_better = tuple(self.lower_is_better)
        if not 0 <= self.tolerance < 1:
            raise RegistryError(f"promotion tolerance {self.tolerance}: expected 0 <= t < 1")
        if not self.alias or not self.alias.replace("-", "").replace("_", "").isalnum():
            raise RegistryError(f"promotion alias {self.alias!r}: letters, digits, - and _ only")

    @classmethod
    def from_dict(cls, fields: dict[str, Any] | None) -> PromotionRule:
        """A rule from a form / task parameter; unknown keys are a one-line error."""
        from dataclasses import fields as dc_fields

        from vfm_core.checkpoints.uri import RegistryError

        known = {f.name for f in dc_fields(cls)}
        unknown = sorted(set(fields or {}) - known)
        if unknown:
            raise RegistryError(f"promotion rule: unknown keys {unknown} (known: {sorted(known)})")
        return cls(**(fields or {}))


@dataclass(kw_only=True, slots=True)
class Decision:
    """The outcome of :func:`decide`."""

    promote: bool
    reason: str
    compared: dict[str, tuple[float, float]] = field(default_factory=dict)
    """metric -> (candidate, champion) for every metric compared."""


def decide(
    candidate: dict[str, float], champion: dict[str, float] | None, rule: PromotionRule
) -> Decision:
    """Whether ``candidate`` (metrics) replaces ``champion`` (its metrics; None: no champion)."""
    if champion is None:
        return Decision(promote=True, reason=f"first version: no @{rule.alias} yet")
    t = rule.tolerance
    worse, better, skipped, compared = [], [], [], {}
    for key, higher in [(k, True) for k in rule.higher_is_better] + [
        (k, False) for k in rule.lower_is_better
    ]:
        if key not in champion:
            skipped.append(key)
            continue
        c = champion[key]
        if key not in candidate:
            worse.append(f"{key} missing (champion {c:.4g})")
            continue
        v = candidate[key]
        compared[key] = (v, c)
        limit = c - t * abs(c) if higher else c + t * abs(c)
        ok = v >= limit if higher else v <= limit
        (better if ok else worse).append(f"{key} {v:.4g} vs {c:.4g}")
    note = f"; not compared (champion lacks them): {', '.join(skipped)}" if skipped else ""
    slack = f" (tolerance {t:g})" if t else ""
    if worse:
        return Decision(
            promote=False,
            reason=f"worse than @{rule.alias}{slack}: {'; '.join(worse)}{note}",
            compared=compared,
        )
    shown = "; ".join(better) or "no metric in common"
    return Decision(
        promote=True, reason=f"no worse than @{rule.alias}{slack}: {shown}{note}", compared=compared
    )


def version_metrics(mv: Any) -> dict[str, float]:
    """The ``eval.*`` tags of a model version as floats (unparseable ones dropped)."""
    out = {}
    for k, v in (mv.tags or {}).items():
        if k.startswith(METRIC_TAG):
            try:
                out[k.removeprefix(METRIC_TAG)] = float(v)
            except ValueError:
                continue
    return out


def promote(
    name: str,
    version: int | str,
    *,
    rule: PromotionRule | None = None,
    tracking: TrackingConfig | None = None,
) -> dict[str, Any]:
    """Apply ``rule`` to version ``version`` of ``name`` against the current champion; move the
    alias when it holds; record the decision on the version (module docstring). ``tracking``:
    the store (default: $MLFLOW_TRACKING_URI, else the sqlite store under the data dir). Returns
    a small dict: name, version, promoted, reason, champion (the alias's version afterwards),
    previous."""
    import mlflow
    from mlflow.exceptions import MlflowException

    rule = rule or PromotionRule()
    uri = open_tracking_store(tracking or TrackingConfig())
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    version = str(version)
    mv = client.get_model_version(name, version)
    try:
        current = client.get_model_version_by_alias(name, rule.alias)
    except MlflowException:
        current = None
    if current is not None and str(current.version) == version:
        return {
            "name": name,
            "version": int(version),
            "promoted": True,
            "reason": f"already @{rule.alias}",
            "champion": int(version),
            "previous": int(version),
        }
    d = decide(version_metrics(mv), version_metrics(current) if current else None, rule)
    tags = {"vfm.promotion": "promoted" if d.promote else "rejected"}
    tags["vfm.promotion_reason"] = d.reason[:4900]
    if current is not None:
        tags["vfm.promotion_vs"] = str(current.version)
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    if d.promote:
        if current is not None:
            client.set_model_version_tag(
                name, version, "vfm.previous_champion", str(current.version)
            )
        client.set_registered_model_alias(name, rule.alias, version)
        client.update_model_version(name, version, description=f"@{rule.alias}: {d.reason}")
    return {
        "name": name,
        "version": int(version),
        "promoted": d.promote,
        "reason": d.reason,
        "champion": int(version) if d.promote else (int(current.version) if current else None),
        "previous": int(current.version) if current else None,
    }
