"""A registered version as MLflow users expect it, registered once for the module (2-step
dit-tiny, an evaluation run already holding one metric as ``generate`` logs it): the evaluation as
metrics of the logged model, a signature and an input example, the ``vfm_core`` package and pinned
requirements in the model folder (that it serves from them, with this repository out of reach,
and answers bad requests 400 in one line: ``test_serving.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow
import pytest
from registry_support import training_run, use_store

from vfm_core.registry import register_checkpoint
from vfm_core.registry.environment import INFERENCE_PACKAGES
from vfm_core.registry.register import RegisteredVersion

METRICS = {"prompt_colour_acc": 0.5, "frechet_distance": 10.0, "heldout_loss": 0.7}


@dataclass(kw_only=True)
class Registered:
    reg: RegisteredVersion
    eval_run: str
    loads: int
    """``VideoModel.load_context`` calls while registering (MLflow's example check makes one)."""


@pytest.fixture(scope="module")
def registered(trained_run, tmp_path_factory):
    from vfm_core.infer.pyfunc import VideoModel

    with pytest.MonkeyPatch.context() as mp:
        store = use_store(mp, tmp_path_factory.mktemp("version"))
        eval_run = training_run(store, "evaluate")
        # generate's log_evaluation: eval/<metric> at the checkpoint's step in the evaluation run
        mlflow.MlflowClient().log_metric(eval_run, "eval/frechet_distance", 10.0, step=2)
        loads, load_context = [], VideoModel.load_context

        def counted(self, context):  # MLflow passes context= by name
            loads.append(1)
            return load_context(self, context)

        mp.setattr(VideoModel, "load_context", counted)
        reg = register_checkpoint(
            trained_run,
            run_id=training_run(store),
            tracking=store,
            metrics=METRICS,
            eval_run_id=eval_run,
        )
        mp.setattr(VideoModel, "load_context", load_context)
        yield Registered(reg=reg, eval_run=eval_run, loads=len(loads))


def test_the_evaluation_is_metrics_of_the_logged_model(registered, trained_run):
    client = mlflow.MlflowClient()
    reg, eval_run = registered.reg, registered.eval_run
    model = client.get_logged_model(reg.model_id)
    assert model.experiment_id == client.get_run(reg.run_id).info.experiment_id
    got = {m.key: (m.value, m.step, m.run_id) for m in model.metrics}
    assert got == {f"eval/{k}": (v, 2, eval_run) for k, v in METRICS.items()}
    # the value the evaluation run held is linked, not logged again; the others are logged there
    for name, value in METRICS.items():
        history = client.get_metric_history(eval_run, f"eval/{name}")
        assert [(m.value, m.step) for m in history] == [(value, 2)]
    # the tags promotion compares are kept; registering again (a retried task) adds nothing
    tags = client.get_model_version(reg.name, str(reg.version)).tags
    assert {k: float(tags[f"eval.{k}"]) for k in METRICS} == METRICS
    again = register_checkpoint(
        trained_run, run_id=reg.run_id, metrics=METRICS, eval_run_id=eval_run
    )
    assert again.version == reg.version
    assert len(client.get_logged_model(reg.model_id).metrics) == len(METRICS)


def test_a_version_has_a_signature_an_example_its_code_and_requirements(registered):
    from mlflow.models import Model
    from mlflow.types.schema import AnyType

    info = mlflow.models.get_model_info(registered.reg.model_uri)
    inputs = {c.name: (c.type, c.required) for c in info.signature.inputs.inputs}
    assert list(inputs) == ["prompt", "frames", "size", "seed", "steps", "guidance"]
    assert inputs["prompt"][1] and not any(req for _, req in list(inputs.values())[1:])
    assert isinstance(inputs["steps"][0], AnyType)
    assert "mp4_base64" in info.signature.outputs.input_names()
    assert registered.loads == 0  # nothing loaded (nor generated) to check the example
    local = Path(mlflow.artifacts.download_artifacts(registered.reg.model_uri))
    example = Model.load(local).load_input_example(local)
    assert example == {
        "prompt": "a red circle moving right",
        "frames": 5,
        "size": "32x32",
        "seed": 0,
    }
    assert (local / "code" / "vfm_core" / "infer" / "pyfunc.py").is_file()
    assert not list(local.rglob("__pycache__"))
    reqs = (local / "requirements.txt").read_text().split()
    assert {r.split("==")[0] for r in reqs} == set(INFERENCE_PACKAGES)
    assert "torch==2.13.0" in reqs and f"mlflow=={mlflow.__version__}" in reqs
