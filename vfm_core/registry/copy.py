"""``vfm models copy``: registered versions and their runs from one MLflow store to another.

After ``make demo`` the runs and ``vfm-dit-tiny`` live in the sqlite store under the data dir;
after ``make up`` the server is the store every command uses, and it holds neither.
:func:`copy_models` brings them over, for each model (all ``vfm-*``, or the named ones) and each
version in order:

1. **runs**: the version's source run (the training run) and the evaluation run its tag
   ``vfm.eval_run`` names, each with its parents (:class:`~vfm_core.registry.copy_runs.RunCopier`);
2. **model**: the version's model folder (downloaded from the source) logged as a new MLflow 3
   logged model of the copied training run, its ``MLmodel`` naming the new run and model id;
3. **version**: registered from it with the source version's description and tags, ``vfm.*``
   run ids rewritten to the copies, ``vfm.copied_from`` = ``<source uri>#<name>/<version>``;
   then the aliases the source gives that version (``champion``).

A version whose ``vfm.copied_from`` the target already holds is not copied again (its aliases
follow the source's); a run is found by its own ``vfm.copied_from`` tag.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfm_core.checkpoints.uri import RegistryError
from vfm_core.registry.copy_runs import COPIED_TAG, RunCopier
from vfm_core.registry.register import MODEL_PREFIX
from vfm_core.tracking import (
    DEFAULT_SOURCE,
    TrackingStoreError,
    default_store_uri,
    open_store,
    refuse_missing_store,
    sqlite_path,
    tracking_uri_from,
)

__all__ = ["CopiedVersion", "CopyReport", "copy_models"]

RUN_TAGS = ("vfm.source_run", "vfm.eval_run")
"""Version tags naming a run of the source store: rewritten to its copy."""
MODEL_VERSIONS_TAG = "mlflow.modelVersions"
"""MLflow's logged-model tag listing the versions registered from it."""
VERSION_TAGS = ("vfm.promotion_vs", "vfm.previous_champion")
"""Version tags naming another version of the model: rewritten to its number in the target."""


@dataclass(kw_only=True, slots=True)
class CopiedVersion:
    """One version copied (or, with ``dry_run``, to be copied)."""

    name: str
    version: int
    """Its number in the source."""
    target_version: int | None
    """Its number in the target (None: a dry run)."""
    runs: int
    """Runs created in the target for it (its training and evaluation runs, their parents)."""
    aliases: list[str] = field(default_factory=list)


@dataclass(kw_only=True, slots=True)
class CopyReport:
    """What :func:`copy_models` did."""

    source: str
    target: str
    copied: list[CopiedVersion] = field(default_factory=list)
    present: int = 0
    """Versions the target already held (copied before)."""
    models: list[str] = field(default_factory=list)


def resolve_stores(source: str | None, target: str | None) -> tuple[str, str, str]:
    """(source URI, target URI, where the target was set), the source opened: ``source``
    default the sqlite store under the data dir (never created), ``target`` default the tracking
    URI in effect; the same store twice or a missing source is one line."""
    src, src_from = (source, "--from") if source else (default_store_uri(), DEFAULT_SOURCE)
    dst, dst_from = tracking_uri_from(target, "--to", create=False)
    if _same_store(src, dst):
        raise TrackingStoreError(
            f"vfm models copy: --from and --to are both {src} ({src_from}, {dst_from}); start "
            "the server (make up) or pass --to URI"
        )
    refuse_missing_store(src, src_from, "vfm models copy only reads it")
    open_store(src, source=src_from, existing=True)
    if (db := sqlite_path(src)) is not None:  # one spelling in the lineage tags: no second copy
        src = f"sqlite:///{db.resolve()}"
    return src, dst, dst_from


def _open_target(dst: str, dst_from: str) -> None:
    """The target opened (made, when it is a new sqlite store); one that does not answer is one
    line."""
    if (db := sqlite_path(dst)) is not None:
        db.parent.mkdir(parents=True, exist_ok=True)
    open_store(dst, source=dst_from)


def _same_store(a: str, b: str) -> bool:
    da, db = sqlite_path(a), sqlite_path(b)
    if da is not None and db is not None:
        return da.resolve() == db.resolve()
    return a.rstrip("/") == b.rstrip("/")


def copy_models(
    *,
    source: str | None = None,
    target: str | None = None,
    names: list[str] | None = None,
    dry_run: bool = False,
    on_version: Callable[[CopiedVersion], None] | None = None,
) -> CopyReport:
    """Copy the registered models ``names`` (default every ``vfm-*``) from ``source`` to
    ``target`` (module docstring); ``on_version`` is called after each version copied."""
    with _quiet_mlflow():
        return _copy_models(source, target, names, dry_run, on_version)


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """Without MLflow's progress bars and "View run" lines (the copy prints its own), unless the
    user set those switches."""
    quiet = {"MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}
    quiet["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    set_here = [k for k in quiet if k not in os.environ]
    os.environ.update({k: quiet[k] for k in set_here})
    try:
        yield
    finally:
        for k in set_here:
            os.environ.pop(k, None)


def _copy_models(
    source: str | None,
    target: str | None,
    names: list[str] | None,
    dry_run: bool,
    on_version: Callable[[CopiedVersion], None] | None,
) -> CopyReport:
    import mlflow

    src_uri, dst_uri, dst_from = resolve_stores(source, target)
    src = mlflow.MlflowClient(tracking_uri=src_uri, registry_uri=src_uri)
    report = CopyReport(source=src_uri, target=dst_uri, models=_model_names(src, src_uri, names))
    _open_target(dst_uri, dst_from)
    # MLflow's sqlite registry finds a version's logged model through the global tracking URI
    mlflow.set_tracking_uri(dst_uri)
    dst = mlflow.MlflowClient(tracking_uri=dst_uri, registry_uri=dst_uri)
    runs = RunCopier(source=src, target=dst, source_uri=src_uri, target_uri=dst_uri)
    for name in report.models:
        for done in _copy_model(name, runs, report, dry_run=dry_run):
            report.copied.append(done)
            if on_version is not None:
                on_version(done)
    return report


def _copy_model(
    name: str, runs: RunCopier, report: CopyReport, *, dry_run: bool
) -> Iterator[CopiedVersion]:
    """Each version of ``name`` the target lacks, oldest first, copied (or, dry, named); the
    aliases of those it holds set as the source has them."""
    src, dst = runs.source, runs.target
    model = src.get_registered_model(name)
    aliases: dict[str, list[str]] = {}
    for alias, v in (model.aliases or {}).items():
        aliases.setdefault(str(v), []).append(alias)
    present = _present(dst, name, report.source)
    numbers = {v: int(mv.version) for v, mv in present.items()}  # source -> target version
    for mv in sorted(src.search_model_versions(f"name='{name}'"), key=lambda m: int(m.version)):
        v = str(mv.version)
        if v in present:
            report.present += 1
            if not dry_run:
                _set_aliases(dst, name, present[v].version, aliases.get(v, []))
            continue
        if dry_run:
            yield CopiedVersion(
                name=name, version=int(v), target_version=None, runs=0, aliases=aliases.get(v, [])
            )
            continue
        if not _has_model(dst, name):
            dst.create_registered_model(name, tags=model.tags, description=model.description)
        made = runs.made
        new = _copy_version(report.source, dst, runs, mv, numbers)
        numbers[v] = int(new.version)
        _set_aliases(dst, name, new.version, aliases.get(v, []))
        yield CopiedVersion(
            name=name,
            version=int(v),
            target_version=int(new.version),
            runs=runs.made - made,
            aliases=aliases.get(v, []),
        )


def _model_names(src: Any, src_uri: str, names: list[str] | None) -> list[str]:
    """The models to copy: ``names`` (each must exist) or every ``vfm-*`` in the source."""
    found = []
    token = None
    while True:  # every page
        page = src.search_registered_models(
            filter_string=f"name LIKE '{MODEL_PREFIX}%'", max_results=1000, page_token=token
        )
        found += [m.name for m in page]
        if not (token := page.token):
            break
    if not names:
        return sorted(found)
    for name in dict.fromkeys(names):
        if not _has_model(src, name):
            have = ", ".join(sorted(found)[:5]) or f"no {MODEL_PREFIX}* model"
            raise RegistryError(
                f"--name {name}: no registered model of that name in {src_uri} (it has: {have})"
            )
    return list(dict.fromkeys(names))


def _has_model(dst: Any, name: str) -> bool:
    return bool(dst.search_registered_models(filter_string=f"name='{name}'"))


def _present(dst: Any, name: str, src_uri: str) -> dict[str, Any]:
    """Source version -> the target's version copied from it (by ``vfm.copied_from``)."""
    if not _has_model(dst, name):
        return {}
    prefix = f"{src_uri}#{name}/"
    out = {}
    for mv in dst.search_model_versions(f"name='{name}'"):
        lineage = (mv.tags or {}).get(COPIED_TAG, "")
        if lineage.startswith(prefix):
            out[lineage.removeprefix(prefix)] = mv
    return out


def _set_aliases(dst: Any, name: str, version: str | int, aliases: list[str]) -> None:
    for alias in aliases:
        dst.set_registered_model_alias(name, alias, str(version))


def _copy_version(src_uri: str, dst: Any, runs: RunCopier, mv: Any, numbers: dict) -> Any:
    """Steps 1-3 of the module docstring for one source version; returns the new version."""
    tags = dict(mv.tags or {})
    train_run = runs.copy(mv.run_id) if mv.run_id else None
    for key in (k for k in RUN_TAGS if k in tags):
        same = train_run is not None and tags[key] == mv.run_id
        tags[key] = train_run if same else _copied_run(runs, tags[key])
    for key in VERSION_TAGS:
        if tags.get(key) in numbers:
            tags[key] = str(numbers[tags[key]])
    tags[COPIED_TAG] = f"{src_uri}#{mv.name}/{mv.version}"
    model_id = _copy_logged_model(src_uri, dst, runs, mv, train_run)
    new = dst.create_model_version(
        mv.name,
        source=f"models:/{model_id}",
        run_id=train_run,
        tags=tags,
        description=mv.description,
        model_id=model_id,
    )
    entry = [{"name": new.name, "version": new.version}]  # as mlflow.register_model links them
    dst.set_logged_model_tags(model_id, {MODEL_VERSIONS_TAG: json.dumps(entry)})
    return new


def _copied_run(runs: RunCopier, run_id: str) -> str:
    """The copy of ``run_id``; a run the source does not hold keeps its id (as the tag had)."""
    from mlflow.exceptions import MlflowException

    try:
        return runs.copy(run_id)
    except MlflowException as e:
        if e.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return run_id


def _copy_logged_model(
    src_uri: str, dst: Any, runs: RunCopier, mv: Any, train_run: str | None
) -> str:
    """The version's model folder as a new logged model of ``train_run`` in the target (in the
    run's experiment; no run: the model's name as the experiment); returns its model id."""
    import mlflow
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model

    source_model = None
    if model_id := logged_model_id(mv):
        source_model = runs.source.get_logged_model(model_id)
    exp_id = dst.get_run(train_run).info.experiment_id if train_run else runs.experiment(mv.name)
    model = dst.create_logged_model(
        exp_id,
        name=source_model.name if source_model else "model",
        source_run_id=train_run,
        tags={
            k: v
            for k, v in (source_model.tags if source_model else {}).items()
            if k != MODEL_VERSIONS_TAG  # the source's versions: set anew below
        },
        params=dict(source_model.params) if source_model else None,
        model_type=source_model.model_type if source_model else None,
    )
    with tempfile.TemporaryDirectory(prefix="vfm-copy-model-") as tmp:
        local = Path(
            mlflow.artifacts.download_artifacts(
                artifact_uri=runs.source.get_model_version_download_uri(mv.name, mv.version),
                dst_path=tmp,
                tracking_uri=src_uri,
            )
        )
        meta = Model.load(local / "MLmodel")  # the copy names its own run and model
        meta.run_id, meta.model_id = train_run, model.model_id
        meta.save(local / "MLmodel")
        dst.log_model_artifacts(model.model_id, str(local))
    dst.finalize_logged_model(model.model_id, "READY")
    if train_run:
        dst.log_outputs(train_run, [LoggedModelOutput(model.model_id, step=0)])
    return model.model_id


def logged_model_id(mv: Any) -> str | None:
    """The MLflow 3 logged model a version was registered from: its ``model_id`` (a server
    gives it) or its source ``models:/<model id>`` (a sqlite store gives only that)."""
    if getattr(mv, "model_id", None):
        return mv.model_id
    rest = (mv.source or "").removeprefix("models:/")
    return rest if rest != mv.source and rest.startswith("m-") and "/" not in rest else None
