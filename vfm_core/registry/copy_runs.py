"""One MLflow run copied from one store to another, with what it holds and where it hangs.

:class:`RunCopier` copies a run into the experiment of the same name in the target (made if
missing, as :func:`vfm_core.tracking.ensure_experiment` makes one): its name, tags, params, every
metric's full history (values, steps, timestamps), its artifacts, its status and times. A run
nested under another (``mlflow.parentRunId``) is nested under the parent's copy, the parent
copied first. Each copy carries the tag ``vfm.copied_from`` = ``<source uri>#runs/<run id>``, by
which a later copy finds it instead of making a second one.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from typing import Any

from vfm_core.tracking import PARENT_TAG

COPIED_TAG = "vfm.copied_from"
"""Tag of a copied run (``<source uri>#runs/<id>``) or version (``<source uri>#<name>/<v>``)."""
DROPPED_TAGS = frozenset({PARENT_TAG, "mlflow.runName", "mlflow.log-model.history", COPIED_TAG})
"""Source-run tags not copied as they are: the parent (re-pointed at its copy), the name (set as
the run's name), MLflow's legacy list of models logged (ids of the source store)."""
_BATCH = 100
"""Params or tags per ``log_batch`` call (MLflow's limit; metrics: 1000)."""


@dataclass(kw_only=True, slots=True)
class RunCopier:
    """Copies runs from ``source`` to ``target`` (two ``MlflowClient``), each once."""

    source: Any
    """Client of the source store."""
    target: Any
    """Client of the target store."""
    source_uri: str
    """The source store's URI, as the lineage tags name it."""
    target_uri: str
    """The target store's URI (for its experiments' artifact location)."""
    copied: dict[str, str] = field(default_factory=dict)
    """Source run id -> its copy's id (found or made by this copier)."""
    made: int = 0
    """Runs this copier created."""

    def copy(self, run_id: str) -> str:
        """The id of ``run_id``'s copy in the target: found by its lineage tag, else made."""
        if run_id in self.copied:
            return self.copied[run_id]
        run = self.source.get_run(run_id)
        exp_name = self.source.get_experiment(run.info.experiment_id).name
        exp_id = self.experiment(exp_name)
        lineage = f"{self.source_uri}#runs/{run_id}"
        found = self.target.search_runs(
            [exp_id], filter_string=f"tags.`{COPIED_TAG}` = '{lineage}'", max_results=1
        )
        if found:
            self.copied[run_id] = found[0].info.run_id
            return found[0].info.run_id
        tags = {k: v for k, v in run.data.tags.items() if k not in DROPPED_TAGS}
        tags[COPIED_TAG] = lineage
        if parent := run.data.tags.get(PARENT_TAG):
            tags[PARENT_TAG] = self.copy(parent)
        new = self.target.create_run(
            exp_id, start_time=run.info.start_time, tags=tags, run_name=run.info.run_name
        ).info.run_id
        self._log_data(run_id, new, run.data)
        self._log_artifacts(run_id, new)
        if run.info.status != "RUNNING":  # a run that never ended stays as the source shows it
            self.target.set_terminated(new, status=run.info.status, end_time=run.info.end_time)
        self.copied[run_id] = new
        self.made += 1
        return new

    def experiment(self, name: str) -> str:
        """The id of the target's experiment ``name`` (made, with MLflow 3's training kind)."""
        from vfm_core.config import TrackingConfig
        from vfm_core.tracking import ensure_experiment

        return ensure_experiment(TrackingConfig(tracking_uri=self.target_uri, experiment=name))

    def _log_data(self, src_id: str, dst_id: str, data: Any) -> None:
        """Params, then each metric's history in order (steps and timestamps kept)."""
        from mlflow.entities import Metric, Param

        params = [Param(k, v) for k, v in data.params.items()]
        for i in range(0, len(params), _BATCH):
            self.target.log_batch(dst_id, params=params[i : i + _BATCH])
        for key in data.metrics:
            history = [
                Metric(m.key, m.value, m.timestamp, m.step)  # not the source's model/dataset ids
                for m in self.source.get_metric_history(src_id, key)
            ]
            for i in range(0, len(history), 10 * _BATCH):
                self.target.log_batch(dst_id, metrics=history[i : i + 10 * _BATCH])

    def _log_artifacts(self, src_id: str, dst_id: str) -> None:
        """The run's artifact tree, downloaded and logged as it is (none: nothing)."""
        import mlflow

        if not self.source.list_artifacts(src_id):
            return
        with tempfile.TemporaryDirectory(prefix="vfm-copy-run-") as tmp:
            local = mlflow.artifacts.download_artifacts(
                run_id=src_id, artifact_path="", dst_path=tmp, tracking_uri=self.source_uri
            )
            self.target.log_artifacts(dst_id, local)
