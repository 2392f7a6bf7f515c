"""``models:/NAME@ALIAS`` and ``models:/NAME/VERSION`` -> a local run directory.

A registered version's model folder holds ``artifacts/checkpoint`` (a run directory with one
checkpoint, :func:`vfm_core.registry.register.stage_artifacts`) and, when the run decodes with one,
``artifacts/tokenizer``. :func:`resolve_model_uri` asks the registry (the tracking URI of
:func:`vfm_core.tracking.tracking_uri`: sqlite, file or an http server) which version the URI
names, downloads that version's ``artifacts/`` once (not the ``vfm_core`` code and environment
files beside them, which only MLflow's own loader reads) into ``CACHE/NAME/VERSION-KEY``
(``KEY``: a hash of the store and the version's source, so two stores never share a folder;
written to a temporary folder, renamed into place when complete) and points the copy's
``config.yaml`` at the copied tokenizer, so the folder loads like any ``vfm train`` run
directory. An alias that moves resolves to the new version; the old version's folder stays
valid.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from vfm_core.errors import UserError
from vfm_core.tracking import data_dir, open_store, sqlite_path, tracking_uri, tracking_uri_from

__all__ = [
    "CACHE_ENV",
    "RegistryError",
    "ResolvedModel",
    "is_model_uri",
    "local_checkpoint",
    "parse_model_uri",
    "resolve_model_uri",
]

CACHE_ENV = "VFM_MODEL_CACHE"
"""Where resolved model versions are downloaded (default ``DATA_DIR/model_cache``)."""
_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/]+)|/(?P<version>\d+))/?$")
_DONE = ".complete"


class RegistryError(UserError, LookupError):
    """A ``models:/`` URI that names no registered version, or a checkpoint that cannot be
    registered."""


@dataclass(kw_only=True, slots=True)
class ResolvedModel:
    """A registered version downloaded to this machine."""

    name: str
    """Registered model name (``vfm-dit-tiny``)."""
    version: int
    """The version the URI named (an alias resolved)."""
    uri: str
    """The URI as given."""
    root: Path
    """The local copy of the version's model folder: its ``artifacts/``."""
    checkpoint: Path
    """``root/artifacts/checkpoint``: a run directory with one checkpoint."""
    tokenizer: Path | None
    """``root/artifacts/tokenizer`` when the version carries one."""


def is_model_uri(path: object) -> bool:
    """Whether ``path`` is a registry URI (``models:/...``) rather than a folder."""
    return isinstance(path, str | os.PathLike) and os.fspath(path).startswith("models:/")


def parse_model_uri(uri: str, *, flag: str = "--checkpoint") -> tuple[str, str | None, int | None]:
    """``models:/NAME@ALIAS`` -> (NAME, ALIAS, None); ``models:/NAME/N`` -> (NAME, None, N)."""
    m = _URI.match(uri)
    if m is None:
        raise RegistryError(
            f"{flag} {uri}: expected models:/NAME@ALIAS or models:/NAME/VERSION "
            "(e.g. models:/vfm-dit-tiny@champion)"
        )
    version = m["version"]
    return m["name"], m["alias"], int(version) if version else None


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or data_dir() / "model_cache").resolve()


def resolve_model_uri(
    uri: str, *, cache_dir: str | Path | None = None, flag: str = "--checkpoint"
) -> ResolvedModel:
    """The local copy of the version ``uri`` names (downloaded on first use; see the module
    docstring). A name, alias or version the registry does not hold is a :class:`RegistryError`
    naming what it does hold."""
    import mlflow
    from mlflow.exceptions import MlflowException

    name, alias, version = parse_model_uri(uri, flag=flag)
    store, source = tracking_uri_from(None, "", create=False)  # a reader makes no folder
    db = sqlite_path(store)
    if db is not None and not db.is_file():  # nothing registered here: say so, create nothing
        raise RegistryError(
            f"{flag} {uri}: no registered model {name!r}: the tracking store {store} does not "
            "exist yet (`make demo` registers vfm-dit-tiny there; a model registered elsewhere, "
            "e.g. on `make up`'s server: set MLFLOW_TRACKING_URI to that store)"
        )
    open_store(store, source=source, existing=True)  # one line, not minutes or a new store
    client = mlflow.MlflowClient(tracking_uri=store, registry_uri=store)
    try:
        mv = (
            client.get_model_version_by_alias(name, alias)
            if alias
            else client.get_model_version(name, str(version))
        )
    except MlflowException as e:
        raise RegistryError(f"{flag} {uri}: {_why(client, name, alias, e)}") from None
    key = hashlib.sha256(f"{store}\n{mv.source}".encode()).hexdigest()[:10]
    root = Path(cache_dir or cache_root()) / name / f"{mv.version}-{key}"
    if not (root / _DONE).is_file():
        _download(f"models:/{name}/{mv.version}", root, store)
    ckpt = root / "artifacts" / "checkpoint"
    if not (ckpt / "config.yaml").is_file():
        raise RegistryError(
            f"{flag} {uri}: version {mv.version} of {name} holds no vfm checkpoint "
            "(no artifacts/checkpoint/config.yaml): register it with vfm_core.registry"
        )
    tok = root / "artifacts" / "tokenizer"
    return ResolvedModel(
        name=name,
        version=int(mv.version),
        uri=uri,
        root=root,
        checkpoint=ckpt,
        tokenizer=tok if tok.is_dir() else None,
    )


def local_checkpoint(path: str | Path, *, flag: str = "--checkpoint") -> str | Path:
    """``path`` itself for a folder, the resolved run directory for a ``models:/`` URI (errors
    name ``flag``)."""
    if not is_model_uri(path):
        return path
    return resolve_model_uri(os.fspath(path), flag=flag).checkpoint


def _why(client, name: str, alias: str | None, e: Exception) -> str:
    """One line: what the registry holds instead of what was asked for."""
    from mlflow.exceptions import MlflowException

    try:
        model = client.get_registered_model(name)
    except MlflowException:
        return f"no registered model {name!r} in this tracking store ({tracking_uri()})"
    versions = sorted(int(v.version) for v in client.search_model_versions(f"name='{name}'"))
    aliases = ", ".join(f"@{a}" for a in sorted(model.aliases)) or "none"
    what = f"alias @{alias}" if alias else "that version"
    return f"{name} has no {what} (versions {versions}, aliases {aliases}): {e.message[:200]}"


def _download(version_uri: str, root: Path, store: str) -> None:
    """The version's ``artifacts/`` into ``root/artifacts``: a temporary sibling first, renamed
    when whole; then ``config.yaml`` pointed at the copied tokenizer."""
    import mlflow
    from mlflow.exceptions import MlflowException

    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        try:
            mlflow.artifacts.download_artifacts(
                artifact_uri=f"{version_uri}/artifacts",
                dst_path=str(tmp),
                tracking_uri=store,
                registry_uri=store,
            )
        except MlflowException as e:  # no artifacts/ folder, or the store did not answer
            raise RegistryError(
                f"{version_uri}: its artifacts/ could not be downloaded: {e.message[:300]}"
            ) from None
        cfg_path, tok = tmp / "artifacts" / "checkpoint" / "config.yaml", root / "artifacts"
        if cfg_path.is_file() and (tmp / "artifacts" / "tokenizer").is_dir():
            doc = yaml.safe_load(cfg_path.read_text()) or {}
            doc.setdefault("data", {})["tokenizer"] = str(tok / "tokenizer")  # its final place
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        (tmp / _DONE).write_text(version_uri + "\n")
        if root.exists():  # an incomplete earlier attempt
            shutil.rmtree(root)
        try:
            os.replace(tmp, root)
        except OSError:  # another process finished first: keep its copy
            if not (root / _DONE).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
