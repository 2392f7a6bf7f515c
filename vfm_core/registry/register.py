"""A trained checkpoint -> a version of the registered model ``vfm-<recipe>``.

:func:`register_checkpoint` verifies the checkpoint (its manifest, as ``--resume`` does), stages
it with its tokenizer (:func:`stage_artifacts`), logs the pyfunc model from code
(:data:`MODEL_CODE`: :class:`vfm_core.infer.pyfunc.VideoModel`) in the training run (the
version's source run, at the checkpoint's step) and registers it. The logged model carries:

* its **signature** and a one-row **input example** (:mod:`vfm_core.checkpoints.serving`: a
  required ``prompt``, optional ``frames``, ``size``, ``seed``, ``steps``, ``guidance``). MLflow
  would check the example by loading the model and generating a video in this process; that
  check is off (:data:`PYFUNC`), the signature is checked against the example all the same;
* the ``vfm_core`` package and pinned pip requirements (:mod:`vfm_core.registry.environment`):
  it loads and serves in an environment with those packages and without this repository;
* the **evaluation metrics** as MLflow metrics of the logged model, ``eval/<metric>`` at the
  checkpoint's step, in the evaluation run when one is given (a value that run already holds,
  as ``generate`` logs it, is linked to the model, not logged again), else in the source run.

The version's tags:

========================== ==========================================================
``eval.<metric>``          each evaluation metric (``eval.frechet_distance``, ...): what
                           :mod:`vfm_core.registry.promotion` compares
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
tags updated, a changed metric logged on its model): a retried task never makes a duplicate.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
import types
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vfm_core.checkpoints.serving import INPUT_EXAMPLE, signature
from vfm_core.checkpoints.uri import RegistryError
from vfm_core.config import Config, TrackingConfig
from vfm_core.registry.environment import code_paths, pip_requirements
from vfm_core.registry.promotion import METRIC_TAG
from vfm_core.tracking import STAGE_TAG, create_run, ensure_experiment

__all__ = [
    "METRIC_KEY",
    "MODEL_CODE",
    "RegisteredVersion",
    "lineage_tags",
    "log_model_metrics",
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
METRIC_KEY = "eval/"
"""Prefix of the logged model's evaluation metrics: the keys ``generate`` logs in the evaluation
run (``eval/frechet_distance``)."""


def _save_pyfunc(*, validate_serving_input: bool = True, **kwargs):
    # Model.log reads validate_serving_input and hands every keyword on to the flavor's
    # save_model, which for mlflow.pyfunc refuses one it does not know
    import mlflow.pyfunc

    return mlflow.pyfunc.save_model(**kwargs)


PYFUNC = types.SimpleNamespace(__name__="mlflow.pyfunc", save_model=_save_pyfunc)
"""``mlflow.pyfunc`` as the flavor module of :meth:`mlflow.models.Model.log`, which takes
``validate_serving_input=False`` (what ``mlflow.pyfunc.log_model`` cannot pass): MLflow's check of
the input example loads the model and generates a video in the registering process (MLflow's
transformers flavor turns it off the same way, for checkpoints too large to load twice)."""


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
    ``tracking.experiment``). ``metrics``: the checkpoint's evaluation, as ``eval.*`` tags and as
    the logged model's ``eval/*`` metrics (in ``eval_run_id``, the evaluation run, when given);
    ``tokenizer``: the decoder to ship (default the run's ``data.tokenizer``)."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from vfm_core.checkpoints.load import resolve_checkpoint
    from vfm_core.config import ConfigError, load_yaml, validate

    tracking = tracking or TrackingConfig()
    run_dir, ckpt = resolve_checkpoint(checkpoint)  # verified against its manifest
    try:
        cfg = validate(load_yaml(run_dir / "config.yaml"))
    except ConfigError as e:
        raise RegistryError(f"cannot register {run_dir}: {e}") from None
    name = name or model_name(cfg.recipe)
    step = int(ckpt.name.removeprefix("step_"))
    tok = str(tokenizer or cfg.data.tokenizer or "") or None
    if tok and not Path(tok).is_dir():
        raise RegistryError(
            f"cannot register {ckpt}: its tokenizer {tok} is not a local folder (pass tokenizer=)"
        )
    ensure_experiment(tracking)  # the store (one-line errors), the experiment for a new run
    uri = mlflow.get_tracking_uri()
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    if eval_run_id:
        try:
            client.get_run(eval_run_id)
        except MlflowException as e:
            raise RegistryError(
                f"cannot register {ckpt}: evaluation run {eval_run_id!r}: {e.message}"
            ) from None
    if run_id is None:
        run_id = create_run(tracking, tags={STAGE_TAG: "register"}, name=f"register {name}")
        client.set_terminated(run_id)
    tags = {
        "vfm.source_run": run_id,
        "vfm.checkpoint": str(ckpt.resolve()),
        "vfm.checkpoint_step": str(step),
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
            info = _log_model(client, run_id, name, artifacts, step=step)
        version, model_id = str(info.registered_model_version), info.model_id
    if metrics and model_id:
        log_model_metrics(
            client, model_id, run_id=eval_run_id or run_id, metrics=metrics, step=step
        )
    for k, v in tags.items():
        client.set_model_version_tag(name, version, k, v)
    return RegisteredVersion(
        name=name,
        version=int(version),
        model_uri=f"models:/{name}/{version}",
        run_id=run_id,
        model_id=model_id,
    )


def log_model_metrics(
    client, model_id: str, *, run_id: str, metrics: dict[str, float], step: int
) -> None:
    """Each of ``metrics`` as ``eval/<name>`` (:data:`METRIC_KEY`) on the logged model
    ``model_id``, in run ``run_id`` at ``step``. A value the run already holds at that step (the
    evaluation run's own record) is linked to the model with its timestamp, so the run's history
    keeps one point; a value the model already has is skipped (a retry adds nothing)."""
    from mlflow.entities import Metric

    have = {(m.key, m.step, m.value) for m in client.get_logged_model(model_id).metrics or []}
    now = int(time.time() * 1000)
    batch = []
    for metric, value in metrics.items():
        key, value = f"{METRIC_KEY}{metric}", float(value)
        if (key, step, value) in have:
            continue
        held = [
            m for m in client.get_metric_history(run_id, key) if (m.step, m.value) == (step, value)
        ]
        batch.append(
            Metric(
                key=key,
                value=value,
                timestamp=held[0].timestamp if held else now,
                step=step,
                model_id=model_id,
                run_id=run_id,
            )
        )
    if batch:
        client.log_batch(run_id, metrics=batch)


def _existing_version(client, name: str, run_id: str, ckpt: str) -> tuple[str, str | None] | None:
    """(version, model id) of ``name`` already registered from ``ckpt`` by ``run_id``."""
    for mv in client.search_model_versions(f"name='{name}'"):
        if mv.run_id == run_id and (mv.tags or {}).get("vfm.checkpoint") == ckpt:
            # the sqlite registry leaves model_id empty; the source names the logged model
            source = mv.source or ""
            logged = source.removeprefix("models:/") if source.startswith("models:/m-") else None
            return mv.version, getattr(mv, "model_id", None) or logged
    return None


def _log_model(client, run_id: str, name: str, artifacts: dict[str, str], *, step: int):
    """Log the pyfunc model from code into the existing run ``run_id`` (and its experiment) as
    produced at ``step`` (MLflow links the run's metrics at that step to the model), and register
    it as ``name``; the run keeps the status it had (a running run stays running)."""
    import mlflow
    from mlflow.models import Model

    before = client.get_run(run_id).info.status
    active = mlflow.active_run()
    own = active is None or active.info.run_id != run_id
    if own:  # the active run names the logged model's experiment
        mlflow.start_run(run_id=run_id)
    try:
        with warnings.catch_warnings():  # predict takes tables, dicts or records: no hints
            warnings.filterwarnings("ignore", message=".*type hints.*", category=UserWarning)
            return Model.log(
                artifact_path=None,  # deprecated for name, still positional in Model.log
                name="model",
                flavor=PYFUNC,
                run_id=run_id,
                step=step,
                registered_model_name=name,
                python_model=str(MODEL_CODE),
                artifacts=artifacts,
                code_paths=code_paths(),
                signature=signature(),
                input_example=INPUT_EXAMPLE,
                pip_requirements=pip_requirements(),
                validate_serving_input=False,
            )
    finally:
        if own:
            mlflow.end_run(status=before if before != "RUNNING" else "FINISHED")
            if before == "RUNNING":
                client.update_run(run_id, status="RUNNING")
