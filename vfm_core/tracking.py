"""MLflow plumbing shared by the trainer and the Prefect layer (no torch import here).

Default store: sqlite under the project data dir (``$VFM_DATA_DIR`` or ``./data``), artifacts beside
it — the MLflow 3.17 file store is in maintenance mode and refuses by default. Any other URI a user
sets works or fails in one line (:func:`open_store`): a file store (``file:./mlruns`` or a plain
path) is opted into with ``MLFLOW_ALLOW_FILE_STORE=true`` and a one-line note; a server that does
not answer, an unknown scheme or a missing database driver is a :class:`TrackingStoreError`.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path

from vfm_core.config import ConfigError, TrackingConfig
from vfm_core.errors import UserError

STUDY_TAG = "vfm.study"
"""MLflow tag naming the scaling study a run belongs to."""
LAYOUT_TAG = "vfm.layout"
"""MLflow tag with a run's parallel layout label (e.g. ``tp2``)."""
STAGE_TAG = "vfm.stage"
"""MLflow tag naming the pipeline stage a run records (pipeline, train, evaluate, generate)."""
CHECKPOINT_TAG = "vfm.checkpoint"
"""MLflow tag with the URI of a training run's latest checkpoint."""
PREVIOUS_RUN_TAG = "vfm.previous_run_id"
"""MLflow tag of a resumed training run whose checkpoint named a run the current tracking store
does not hold (started against another store): that run's id."""
PARENT_TAG = "mlflow.parentRunId"
"""MLflow's own tag nesting a run under a parent (the UI shows the children under it)."""
COMMIT_TAG = "mlflow.source.git.commit"
"""MLflow's own tag for the code version (shown on the run page)."""
KIND_TAG = "mlflow.experimentKind"
"""Experiment tag the MLflow 3 UI reads: ``custom_model_development`` files the runs as training
runs (without it MLflow 3 may show them as GenAI "Evaluation runs")."""
_ROOT = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """Project data dir (MLflow store, runs): $VFM_DATA_DIR or ./data."""
    return Path(os.environ.get("VFM_DATA_DIR", "data")).resolve()


def tracking_uri(cfg: TrackingConfig | None = None) -> str:
    """Explicit URI, else $MLFLOW_TRACKING_URI, else the sqlite store under the data dir."""
    return tracking_uri_from(cfg.tracking_uri if cfg is not None else None, "")[0]


def tracking_uri_from(
    explicit: str | None, setting: str, *, create: bool = True
) -> tuple[str, str]:
    """(tracking URI, where it was set) for an error message to name: ``explicit`` (set by
    ``setting``, e.g. ``--tracking-uri``), else $MLFLOW_TRACKING_URI, else the sqlite store under
    the data dir (its folder made, unless ``create`` is False: a reader of runs)."""
    if explicit:
        return explicit, setting
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "MLFLOW_TRACKING_URI"
    return default_store_uri(create=create), DEFAULT_SOURCE


def default_store_uri(*, create: bool = False) -> str:
    """The sqlite store under the data dir (its folder made when ``create``), whatever
    $MLFLOW_TRACKING_URI says: the store of runs made without a server."""
    root = data_dir() / "mlflow"
    if create:
        root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


DEFAULT_SOURCE = "the default store under VFM_DATA_DIR"
"""Where :func:`tracking_uri_from` says a URI was set when nothing set it."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URI (``sqlite:////abs.db``: absolute); None for
    other URIs and in-memory databases."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri.removeprefix("sqlite:///").split("?")[0]
    return Path(path) if path and path != ":memory:" else None


class TrackingStoreError(UserError, RuntimeError):
    """The MLflow tracking URI names a store this process cannot use: a server that does not
    answer, an unknown scheme, a database driver that is not installed."""


class TrackingServerDown(TrackingStoreError):
    """No server answers at an ``http(s)`` tracking URI: may pass (a retried task retries it)."""


FILE_STORE_OPT_IN = "MLFLOW_ALLOW_FILE_STORE"
"""MLflow 3's opt-in to its file store (in maintenance mode: refused without it)."""
_OPENED: set[str] = set()
"""URIs :func:`open_store` checked in this process (checked, and noted, once)."""


def is_file_store(uri: str) -> bool:
    """``file:...`` or a plain path: MLflow's file store."""
    if uri in ("databricks", "databricks-uc", "uc"):  # MLflow's scheme-less names
        return False
    return urllib.parse.urlparse(uri).scheme in ("", "file")


def refuse_missing_store(uri: str, source: str, why: str) -> None:
    """A :class:`~vfm_core.tracking.TrackingStoreError` naming ``uri`` (set by ``source``) when it
    is a local store that does not exist (a sqlite database, a file store folder), so that MLflow
    does not create one at a mistyped path; ``why``: why this command does not create one."""
    db = sqlite_path(uri)
    if db is not None and not db.is_file():
        kind = "a folder" if db.is_dir() else "nothing"
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): no database at {db} ({kind} there; {why}, "
            "so it creates none); check the path"
        )
    if db is not None or not is_file_store(uri):
        return
    parsed = urllib.parse.urlparse(uri)
    folder = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme else uri)
    if not folder.exists():
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): no file store at {folder} ({why}, so it "
            "creates none); check the path"
        )
    if not folder.is_dir():
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): {folder} is a file, not a file store (a "
            f"folder); for a sqlite database write sqlite:///{folder.resolve()}"
        )


def open_store(uri: str, *, source: str = "MLFLOW_TRACKING_URI", existing: bool = False) -> None:
    """Make the tracking store at ``uri`` usable before MLflow touches it, or raise a one-line
    :class:`TrackingStoreError` naming ``uri`` (set by ``source``) and the fix: a file store is
    opted into (``MLFLOW_ALLOW_FILE_STORE=true``, unless the user set it; one note line), an
    http(s) server must answer (a short probe instead of MLflow's minutes of retries), MLflow
    must know the scheme and have its driver, and a sqlite file must be a database.
    ``existing``: a command that only reads runs; a sqlite database the user named must exist
    (MLflow would create it, and its folders, at a mistyped path)."""
    if uri in _OPENED:
        return
    scheme = urllib.parse.urlparse(uri).scheme
    if is_file_store(uri) and FILE_STORE_OPT_IN not in os.environ:
        os.environ[FILE_STORE_OPT_IN] = "true"  # before MLflow builds the store; ranks inherit it
        print(
            f"note: MLflow tracking URI {uri} is MLflow's file store, which MLflow 3 keeps in "
            f"maintenance mode: set {FILE_STORE_OPT_IN}=true for it (a sqlite:///PATH.db URI "
            "needs no opt-in)",
            file=sys.stderr,
        )
    fix = (
        f"point {source} at a running server (http://HOST:PORT), a sqlite:///PATH.db or "
        "file:PATH store, or unset it for the sqlite store under the data dir"
    )
    db = sqlite_path(uri)
    if existing and db is not None and source != DEFAULT_SOURCE and not db.is_file():
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): no database at {db} (this command only reads "
            f"runs, so it does not create one); check the path, or {fix}"
        )
    if scheme in ("http", "https"):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=10).close()
        except urllib.error.HTTPError:
            pass  # a server answered (a proxy or an auth wall may refuse /health)
        except (urllib.error.URLError, OSError, ValueError) as e:
            why = getattr(e, "reason", e)
            raise TrackingServerDown(
                f"MLflow tracking URI {uri} ({source}): no server answers ({why}); start one "
                f"({tool_command('mlflow')} server --host 127.0.0.1 --port PORT, or make up) or "
                f"{fix}"
            ) from None
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.tracking.registry import UnsupportedModelRegistryStoreURIException
    from sqlalchemy.exc import SQLAlchemyError

    try:
        mlflow.MlflowClient(uri)  # builds the store: the scheme, the driver, the file store
    except UnsupportedModelRegistryStoreURIException:
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): MLflow has no store for the scheme "
            f"{scheme!r}; {fix}"
        ) from None
    except ImportError as e:
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): its store needs the Python package "
            f"{e.name!r}, which is not installed (pip install it, or {fix})"
        ) from None
    except MlflowException as e:
        first = str(e.message).strip().split(". ")[0][:300]
        if is_file_store(uri):  # the user's own MLFLOW_ALLOW_FILE_STORE says no
            first = (
                f"{FILE_STORE_OPT_IN}={os.environ.get(FILE_STORE_OPT_IN)} refuses the file store"
            )
            fix = f"set {FILE_STORE_OPT_IN}=true, or {fix}"
        raise TrackingStoreError(f"MLflow tracking URI {uri} ({source}): {first}; {fix}") from None
    except SQLAlchemyError as e:  # a file that is not a database, a folder it cannot write
        why = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise TrackingStoreError(
            f"MLflow tracking URI {uri} ({source}): its database cannot be used ({why}); {fix}"
        ) from None
    _OPENED.add(uri)


def open_tracking_store(cfg: TrackingConfig) -> str:
    """:func:`open_store` on the configured URI (naming where it was set); returns the URI."""
    uri, source = tracking_uri_from(cfg.tracking_uri, "tracking.tracking_uri")
    open_store(uri, source=source)
    return uri


def ensure_experiment(cfg: TrackingConfig) -> str:
    """Point MLflow at the store and return the experiment id, creating the experiment with an
    explicit artifact location next to a sqlite store."""
    import mlflow

    if not cfg.experiment.strip():
        raise ConfigError(
            f"tracking.experiment: {cfg.experiment!r} is empty; name the MLflow experiment "
            "(the default is vfm)"
        )
    uri = open_tracking_store(cfg)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        if KIND_TAG not in exp.tags:
            mlflow.MlflowClient().set_experiment_tag(exp.experiment_id, KIND_TAG, TRAINING_KIND)
        return exp.experiment_id
    db = sqlite_path(uri)
    location = (db.resolve().parent / "artifacts").as_uri() if db is not None else None
    try:
        return mlflow.create_experiment(
            cfg.experiment, artifact_location=location, tags={KIND_TAG: TRAINING_KIND}
        )
    except mlflow.exceptions.MlflowException:
        # runs started at once race to create it: the losers use the winner's experiment
        exp = mlflow.get_experiment_by_name(cfg.experiment)
        if exp is None:
            raise
        return exp.experiment_id


TRAINING_KIND = "custom_model_development"


@functools.cache
def git_commit() -> str | None:
    """The commit of the checked-out code (None outside a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if out.returncode == 0 and len(sha) == 40 else None


def layout_label(degrees: dict[str, int], world: int = 1) -> str:
    """A layout as a short readable label: ``tp2-cp2``, ``dp_shard2``, ``1proc``."""
    parts = [f"{k}{v}" for k, v in degrees.items() if v is not None and v > 1]
    return "-".join(parts) or ("1proc" if world <= 1 else f"dp{world}")


def train_run_name(recipe: str, degrees: dict[str, int], steps: int, world: int = 1) -> str:
    """A training run's readable name: recipe, layout, steps (``dit-tiny tp2 200 steps``)."""
    return f"{recipe} {layout_label(degrees, world)} {steps} steps"


def create_run(
    cfg: TrackingConfig,
    *,
    tags: dict[str, str] | None = None,
    parent_run_id: str | None = None,
    name: str | None = None,
) -> str:
    """Create an MLflow run (status RUNNING) and return its id; workers attach via MLFLOW_RUN_ID.
    The run carries the code's commit, is nested under ``parent_run_id`` when given and is named
    ``cfg.run_name``, else ``name``."""
    import mlflow

    exp_id = ensure_experiment(cfg)
    all_tags = {COMMIT_TAG: commit} if (commit := git_commit()) else {}
    all_tags.update(tags or {})
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = mlflow.MlflowClient().create_run(
        exp_id, run_name=cfg.run_name or name or None, tags=all_tags
    )
    return run.info.run_id


def run_exists(run_id: str) -> bool:
    """Whether the current tracking store (:func:`ensure_experiment` set it) holds ``run_id``, not
    deleted; other errors (a server that does not answer) propagate."""
    import mlflow
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, ErrorCode

    try:
        run = mlflow.MlflowClient().get_run(run_id)
    except MlflowException as e:
        if e.error_code == ErrorCode.Name(RESOURCE_DOES_NOT_EXIST):
            return False
        raise
    return run.info.lifecycle_stage != "deleted"


def fail_run(run_id: str, error: BaseException | str) -> None:
    """End a run as FAILED with the error (its first line, 500 characters) as the tag
    ``vfm.error``, so a failed launch never leaves a run RUNNING forever."""
    import mlflow

    text = str(error).strip().splitlines()[0][:500] if str(error).strip() else type(error).__name__
    client = mlflow.MlflowClient()
    client.set_tag(run_id, "vfm.error", text)
    client.set_terminated(run_id, status="FAILED")


def ui_hint(cfg: TrackingConfig | None = None) -> str:
    """Where a person looks at the runs: the server's URL, or the command serving a local store."""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    opt_in = f"{FILE_STORE_OPT_IN}=true " if is_file_store(uri) else ""
    port = free_local_port(5000)
    return (
        f"{opt_in}{tool_command('mlflow')} ui --backend-store-uri {uri} --host 127.0.0.1 "
        f"--port {port}, then open http://127.0.0.1:{port}"
    )


def free_local_port(preferred: int, tries: int = 50) -> int:
    """``preferred`` or the next port after it that nothing on 127.0.0.1 listens on (a UI hint
    never names a port that ``make up``'s servers, or anything else, already hold)."""
    import socket

    for port in range(preferred, preferred + tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) != 0:
                return port
    return preferred


def tool_command(name: str) -> str:
    """How to call a console script of this environment as printed: its bare name when it is on
    the PATH, else its path in the venv (relative to the working directory when inside it)."""
    import shutil
    import sys

    if shutil.which(name):
        return name
    path = Path(sys.executable).parent / name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def log_lineage(
    run_id: str, *, experiment: str, clips: str, shards: str, tokenizer: str | None = None
) -> None:
    """Record where a training run's data came from: the curation manifest (``clips.parquet``)
    and the shard index as MLflow dataset inputs (with digests), plus ``vfm.*`` tags."""
    import mlflow
    import polars as pl
    from mlflow.entities import DatasetInput, InputTag

    ensure_experiment(TrackingConfig(experiment=experiment))
    client = mlflow.MlflowClient()
    inputs = []
    for name, source, frame in (
        ("clips", clips, pl.read_parquet(clips).to_pandas()),
        ("shards", shards, _index_frame(shards)),
    ):
        with warnings.catch_warnings():  # schema inference hints about integer columns
            warnings.simplefilter("ignore", UserWarning)
            entity = mlflow.data.from_pandas(frame, source=source, name=name)._to_mlflow_entity()
        inputs.append(DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")]))
    client.log_inputs(run_id, datasets=inputs)
    tags = {"vfm.clips_manifest": clips, "vfm.shards_index": shards}
    if tokenizer:
        tags["vfm.tokenizer"] = tokenizer
    for k, v in tags.items():
        client.set_tag(run_id, k, v)


def _index_frame(index_url: str):
    """The shard index as a table (one row per shard) for MLflow's dataset digest."""
    import json

    import pandas as pd

    from vfm_core.storage import read_bytes

    index = json.loads(read_bytes(index_url))
    shards = index.get("shards", [])
    return pd.DataFrame(shards) if shards else pd.DataFrame({"index": [index_url]})
