"""A trained checkpoint -> a version of the registered model ``vfm-<recipe>``.

:func:`register_checkpoint` verifies the checkpoint (its manifest, as ``--resume`` does), stages
it with its tokenizer (:func:`stage_artifacts`), logs the pyfunc model from code
(:data:`MODEL_CODE`: :class:`vfm_core.infer.pyfunc.VideoModel`) in the training run (the
version's source run) and registers it. The version's tags:

========================== ==========================================================
``eval.<metric>``          each evaluation metric (``eval.frechet_distance``, ...)
``vfm.source_run``         the training run (also the version's own ``run_id``)
``vfm.eval_run``           the evaluation run, when given
``vfm.checkpoint``         the checkpoint folder registered (absolute path / URI)
``vfm.checkpoint_step``    its training step
``vfm.recipe``             the preset the run started from
``vfm.data_source``        ``synthetic`` or ``shards``
``vfm.shards_index[.i]``   each dataset's ``index.json`` (blends: ``.1``, ``.2``, ...)
``vfm.shards_index_sha256`` sha256 of that index's bytes (what was trained on, exactly)
``vfm.clips_manifest``     the curation manifest, copied from the training run's tags
``vfm.tokenizer``          the tokenizer folder the version carries (its original path)
========================== ==========================================================

Registering the same checkpoint from the same run again returns the existing version (its metric
tags updated): a retried task never makes a duplicate.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vfm_core.checkpoints.uri import RegistryError
from vfm_core.config import Config, TrackingConfig
from vfm_core.registry.promotion import METRIC_TAG
from vfm_core.tracking import STAGE_TAG, create_run, ensure_experiment

__all__ = [
    "MODEL_CODE",
    "RegisteredVersion",
    "lineage_tags",
    "model_name",
    "register_checkpoint",
    "stage_artifacts",
]

PARENT_TAGS = ("vfm.parent_run", "vfm.parent_checkpoint")
"""Training-run tags of a run started from another model that a registered version keeps
(``vfm.parent_model`` comes from the run's config)."""
MODEL_PREFIX = "vfm-"
"""Registered model names are ``vfm-<recipe>``."""
MODEL_CODE = Path(__file__).resolve().parents[1] / "infer" / "model_code.py"
"""The models-from-code file logged as ``python_model`` (:mod:`vfm_core.infer.model_code`: the
generation pyfunc, :class:`vfm_core.infer.pyfunc.VideoModel`), named by its path: MLflow copies
the file into the model folder and runs it at load time, and the registry never imports the
inference package."""


@dataclass(kw_only=True, slots=True)
class RegisteredVersion:
    """A registered version (small and serialisable: what a Prefect task returns)."""

    name: str
    version: int
    model_uri: str
    """``models:/NAME/VERSION``."""
    run_id: str
    """The run the model was logged in (the training run)."""
    model_id: str | None = None
    """MLflow 3's logged-model id."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_name(recipe: str) -> str:
    """``dit-tiny`` -> ``vfm-dit-tiny``."""
    return recipe if recipe.startswith(MODEL_PREFIX) else MODEL_PREFIX + recipe


def lineage_tags(cfg: Config) -> dict[str, str]:
    """Where the run came from: the model it started from (``train.init``), the data source
    and, for shards, each dataset's index path and the sha256 of its bytes (an index that
    cannot be read is named with ``unreadable``)."""
    from vfm_core.storage import join, read_bytes

    tags = {"vfm.data_source": cfg.data.source}
    if cfg.train.init:  # the model it was started from (vfm train --init)
        tags["vfm.parent_model"] = cfg.train.init
    if cfg.data.source != "shards":
        return tags
    sets = cfg.data.datasets()
    for i, (folder, _) in enumerate(sets, start=1):
        suffix = f".{i}" if len(sets) > 1 else ""
        index = join(folder, "index.json")
        tags[f"vfm.shards_index{suffix}"] = index
        try:
            digest = hashlib.sha256(read_bytes(index)).hexdigest()
        except (OSError, ValueError) as e:
            digest = f"unreadable ({type(e).__name__})"
        tags[f"vfm.shards_index_sha256{suffix}"] = digest
    return tags


def stage_artifacts(run_dir: Path, ckpt: Path, dst: Path, *, tokenizer: str | None) -> dict:
    """Copy the parts of a run a registered version needs into ``dst``: ``dst/checkpoint`` (the
    run's ``config.yaml``, ``text.json`` and ``checkpoints/<ckpt.name>``) and ``dst/tokenizer``;
    returns the pyfunc ``artifacts`` mapping."""
    from vfm_core.annotate.text_encoder import TEXT_RECORD

    out = dst / "checkpoint"
    (out / "checkpoints").mkdir(parents=True)
    shutil.copy2(run_dir / "config.yaml", out / "config.yaml")
    if (run_dir / TEXT_RECORD).is_file():
        shutil.copy2(run_dir / TEXT_RECORD, out / TEXT_RECORD)
    shutil.copytree(ckpt, out / "checkpoints" / ckpt.name)
    artifacts = {"checkpoint": str(out)}
    if tokenizer:
        shutil.copytree(tokenizer, dst / "tokenizer")
        artifacts["tokenizer"] = str(dst / "tokenizer")
    return artifacts


def register_checkpoint(
    checkpoint: str | Path,
    *,
    run_id: str | None,
    tracking: TrackingConfig | None = None,
    metrics: dict[str, float] | None = None,
    eval_run_id: str | None = None,
    name: str | None = None,
    tokenizer: str | Path | None = None,
) -> RegisteredVersion:
    """Register the checkpoint at ``checkpoint`` (a run directory: its newest intact checkpoint;
    or one ``step_*`` folder) as a version of ``name`` (default ``vfm-<recipe>``), the pyfunc
    model logged in ``run_id`` (the training run; None: a new run ``register NAME`` in
    ``tracking.experiment``). ``metrics``: the checkpoint's evaluation, as ``eval.*`` tags;
    ``tokenizer``: the decoder to ship (default the run's ``data.tokenizer``)."""
    import mlflow

    from vfm_core.checkpoints.load import resolve_checkpoint
    from vfm_core.config import ConfigError, load_yaml, validate

    tracking = tracking or TrackingConfig()
    run_dir, ckpt = resolve_checkpoint(checkpoint)  # verified against its manifest
    try:
        cfg = validate(load_yaml(run_dir / "config.yaml"))
    except ConfigError as e:
        raise RegistryError(f"cannot register {run_dir}: {e}") from None
    name = name or model_name(cfg.recipe)
    tok = str(tokenizer or cfg.data.tokenizer or "") or None
    if tok and not Path(tok).is_dir():
        raise RegistryError(
            f"cannot register {ckpt}: its tokenizer {tok} is not a local folder (pass tokenizer=)"
        )
    ensure_experiment(tracking)  # the store (one-line errors), the experiment for a new run
    uri = mlflow.get_tracking_uri()
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    if run_id is None:
        run_id = create_run(tracking, tags={STAGE_TAG: "register"}, name=f"register {name}")
        client.set_terminated(run_id)
    tags = {
        "vfm.source_run": run_id,
        "vfm.checkpoint": str(ckpt.resolve()),
        "vfm.checkpoint_step": str(int(ckpt.name.removeprefix("step_"))),
        "vfm.recipe": cfg.recipe,
        **lineage_tags(cfg),
        **{f"{METRIC_TAG}{k}": repr(float(v)) for k, v in (metrics or {}).items()},
    }
    run_tags = client.get_run(run_id).data.tags
    for key in ("vfm.clips_manifest", "vfm.shards_index", *PARENT_TAGS):
        if key in run_tags:
            tags.setdefault(key, run_tags[key])
    if tok:
        tags["vfm.tokenizer"] = str(Path(tok).resolve())
    if eval_run_id:
        tags["vfm.eval_run"] = eval_run_id

    existing = _existing_version(client, name, run_id, tags["vfm.checkpoint"])
    if existing is not None:
        version, model_id = existing
    else:
        with tempfile.TemporaryDirectory(prefix="vfm-register-") as tmp:
            artifacts = stage_artifacts(run_dir, ckpt, Path(tmp), tokenizer=tok)
            info = _log_in_run(client, run_id, name, artifacts)
        version, model_id = str(info.registered_model_version), info.model_id
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    return RegisteredVersion(
        name=name,
        version=int(version),
        model_uri=f"models:/{name}/{version}",
        run_id=run_id,
        model_id=model_id,
    )


def _existing_version(client, name: str, run_id: str, ckpt: str) -> tuple[str, str | None] | None:
    """(version, model id) of ``name`` already registered from ``ckpt`` by ``run_id``."""
    for mv in client.search_model_versions(f"name='{name}'"):
        if mv.run_id == run_id and (mv.tags or {}).get("vfm.checkpoint") == ckpt:
            return mv.version, getattr(mv, "model_id", None)
    return None


def _log_in_run(client, run_id: str, name: str, artifacts: dict[str, str]):
    """``mlflow.pyfunc.log_model`` into the existing run ``run_id`` and register it as ``name``;
    the run keeps the status it had (a running run stays running)."""
    import mlflow
    import torch

    before = client.get_run(run_id).info.status
    active = mlflow.active_run()
    own = active is None or active.info.run_id != run_id
    if own:
        mlflow.start_run(run_id=run_id)
    try:
        with warnings.catch_warnings():  # predict takes tables, dicts or records: no hints
            warnings.filterwarnings("ignore", message=".*type hints.*", category=UserWarning)
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=str(MODEL_CODE),
                artifacts=artifacts,
                registered_model_name=name,
                pip_requirements=[f"mlflow=={mlflow.__version__}", f"torch=={torch.__version__}"],
            )
    finally:
        if own:
            mlflow.end_run(status=before if before != "RUNNING" else "FINISHED")
            if before == "RUNNING":
                client.update_run(run_id, status="RUNNING")
    return info
