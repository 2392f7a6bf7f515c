"""Prefect task around the MLflow Model Registry: a trained, evaluated checkpoint becomes a version
of ``vfm-<recipe>`` and, when the promotion rule holds, its ``champion``
(:mod:`vfm_core.registry`)."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.logs import task_logger
from tasks.retry import unless_input_error
from vfm_core.config import TrackingConfig
from vfm_core.errors import UserError


# retries: a store that does not answer is transient; registering again finds the version made
# by the failed try (same checkpoint, same run), so a retry never duplicates one
@task(
    name="register-and-promote",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=unless_input_error,
)
def register_and_promote(
    checkpoint: str,
    tracking: TrackingConfig,
    *,
    train_run_id: str | None,
    metrics: dict[str, float] | None = None,
    eval_run_id: str | None = None,
    name: str | None = None,
    tokenizer: str | None = None,
    rule: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Register ``checkpoint`` (run dir or step folder) as a model version logged in the training
    run ``train_run_id`` with its evaluation ``metrics`` (and ``eval_run_id``), then apply the
    promotion ``rule`` (the fields of :class:`vfm_core.registry.PromotionRule`; None: prompt
    following and Fréchet distance no worse than the champion's). Returns the version and the
    decision: ``{name, version, model_uri, run_id, model_id, promoted, reason, champion,
    previous, champion_uri}``."""
    from vfm_core.registry import PromotionRule, promote, register_checkpoint

    logger = task_logger()
    try:
        promotion = PromotionRule.from_dict(rule)
        reg = register_checkpoint(
            checkpoint,
            run_id=train_run_id,
            tracking=tracking,
            metrics=metrics,
            eval_run_id=eval_run_id,
            name=name,
            tokenizer=tokenizer,
        )
        decision = promote(reg.name, reg.version, rule=promotion, tracking=tracking)
    except UserError as e:
        logger.error("register: error: %s", e)
        raise e.with_traceback(None) from None
    verb = "promoted to" if decision["promoted"] else "not promoted to"
    logger.info(
        "%s version %d %s @%s: %s", reg.name, reg.version, verb, promotion.alias, decision["reason"]
    )
    return {
        **reg.to_dict(),
        **decision,
        "champion_uri": f"models:/{reg.name}@{promotion.alias}",
    }
