"""The MLflow Model Registry for trained DiTs: a checkpoint becomes a version of ``vfm-<recipe>``,
the ``champion`` alias moves by a stated rule, and ``models:/NAME@ALIAS`` or ``models:/NAME/N``
work wherever a checkpoint directory does.

Stage order of a registration (:func:`register_checkpoint`, then :func:`promote`):

1. **stage** the checkpoint as a self-contained folder (``config.yaml``, ``text.json``, the one
   verified ``checkpoints/step_*``) and the tokenizer the run decodes with
   (:func:`~vfm_core.registry.register.stage_artifacts`);
2. **log** a pyfunc model (:class:`~vfm_core.infer.pyfunc.VideoModel`, from code: nothing
   pickled) with those folders as its artifacts in the training run, and **register** it as a
   version of ``vfm-<recipe>``; the version's tags hold the evaluation metrics (``eval.*``), the
   source and evaluation runs, the dataset lineage (shard index path and sha256) and the
   checkpoint URI (:mod:`vfm_core.registry.register`);
3. **promote**: the version becomes the ``champion`` when the :class:`PromotionRule` holds against
   the current champion's ``eval.*`` tags (the first version always does); the decision and its
   reason are tags of the version either way (:mod:`vfm_core.registry.promotion`).

``vfm models copy`` (:mod:`vfm_core.registry.copy`) moves versions, their runs and lineage from
one store to another (the sqlite store of ``make demo`` to the server of ``make up``).

Consumers resolve a ``models:/`` URI to a local folder
(:func:`vfm_core.checkpoints.uri.resolve_model_uri`: downloaded once into a cache keyed by store,
name and version) and load it like any run directory.
"""

from vfm_core.registry.promotion import PromotionRule, decide, promote
from vfm_core.registry.register import RegisteredVersion, model_name, register_checkpoint

__all__ = [
    "PromotionRule",
    "RegisteredVersion",
    "decide",
    "model_name",
    "promote",
    "register_checkpoint",
]
