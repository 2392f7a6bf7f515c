"""The flags of a training run, declared once: ``vfm train`` (:mod:`vfm_core.cli_parser`) and the
one entry point ``python -m vfm_core.train.main`` both add theirs from :class:`TrainArgs`
(:func:`vfm_core.config_fields.add_flags`), with the launch flags of
:class:`~vfm_core.launch.launcher.Launch` and the degrees of
:class:`~vfm_core.config.ParallelDegrees`. Torch-free: the ``vfm`` parser imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vfm_core.config_fields import bounds


@dataclass(kw_only=True, slots=True)
class TrainArgs:
    """A training run's own flags (the layout's and the launch's are declared with them)."""

    recipe: str | None = None
    """preset (`vfm recipes` lists them; default: the --config file's recipe, else dit-tiny)"""
    config: str | None = None
    """YAML config applied on top of the recipe (the entry point: the whole run config, as
    Config.to_dict writes it)"""
    steps: int = field(metadata=bounds(ge=0))
    """total steps"""
    out: str
    """output dir (metrics.jsonl, checkpoints; rank 0 writes)"""
    seed: int | None = field(default=None, metadata=bounds(ge=0))
    """seed for init, sigma and noise"""
    resume: bool = False
    """continue from the newest intact checkpoint"""
    resume_from: str | None = field(default=None, metadata={"metavar": "CKPT_DIR"})
    """continue from this checkpoint folder (implies --resume)"""
    init: str | None = field(default=None, metadata={"metavar": "SRC"})
    """start a new run from a trained model's weights and EMA (train.init): a run dir, a step_*
    checkpoint or models:/NAME@ALIAS|VERSION; new optimizer, schedule and step 0"""
    debug: bool = False
    """show the traceback behind an error"""
    set: list[str] = field(default_factory=list, metadata={"metavar": "SECTION.FIELD=VALUE"})
    """override a config field (repeatable)"""
    no_mlflow: bool = False
    """do not log to MLflow"""
    no_progress: bool = False
    """no progress bar"""


ENTRY_FLAGS = ("config", "out", "resume", "resume_from", "debug", "no_progress")
"""The entry point's flags (``vfm train`` has all the others too, less ``no_progress``)."""
