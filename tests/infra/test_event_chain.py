"""The nightly chain of ``deployments/prefect.yaml`` (docs/registry-and-deployments.md):
curate-nightly -> shard-nightly -> train-nightly -> promote-nightly -> generate-nightly, each link
a deployment trigger on the ``vfm.STAGE.completed`` event the upstream flow emits as its last step
(tasks/events.py), with the downstream parameters rendered from the event's payload;
generate-nightly follows a promotion only (the event's ``vfm.promoted`` label).

Fast: every link names the upstream deployment and the event its flow emits, and the trigger's
parameters, rendered with such a payload, are a valid form of the downstream flow. Slow, on real
servers (``prefect server start``, MLflow, a process worker, as ``make up``): the chain's
deployments (the repository's triggers, tiny parameters) run one curation of one sample video to a
registered champion and its generated video, every downstream run created by an automation; a
worse model trained after it is registered, not promoted, and not served; a curation whose only
video is broken ends Failed with the count as its state message, and no shard or training run
follows.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.load import api as _api
from infra.load import deploy
from infra.load import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CHAIN = ["curate-nightly", "shard-nightly", "train-nightly", "promote-nightly", "generate-nightly"]
STAGE = {
    "curate-nightly": "curate",
    "shard-nightly": "shard",
    "train-nightly": "train",
    "promote-nightly": "promote",
}
FLOW = {**STAGE, "promote-nightly": "evaluate-and-promote", "generate-nightly": "generate"}
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
PAYLOAD = {  # what each flow's emit_stage_completed sends (tasks/events.py)
    "curate": {"dst": "/d/curated", "clips": "/d/curated/clips.parquet", "n_clips": 3},
    "shard": {"shards_dir": "/d/shards", "index": "/d/shards/index.json", "clips_dir": "/d/c"},
    "train": {"out_dir": "/d/runs/x", "recipe": "dit-tiny", "step": 2, "mlflow_run_id": "r"},
    "promote": {
        "name": "vfm-dit-tiny",
        "version": 3,
        "model_uri": "models:/vfm-dit-tiny/3",
        "champion_uri": "models:/vfm-dit-tiny@champion",
        "promoted": True,
        "reason": "first version",
    },
}


def chain_deployments() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    found = {d["name"]: d for d in spec["deployments"] if d["name"] in CHAIN}
    assert sorted(found) == sorted(CHAIN)
    return found


def render(value: Any, event: dict[str, Any]) -> Any:
    """The trigger's parameters with every ``{{ ... }}`` rendered against ``event``."""
    import jinja2

    if isinstance(value, dict):
        return {k: render(v, event) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, event) for v in value]
    if isinstance(value, str) and "{{" in value:
        return jinja2.Template(value).render(event=event)
    return value


def _run_params(dep: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """What a triggered run of ``dep`` works with: the trigger's parameters rendered against
    ``event``, the deployment's own filling the rest (flows.forms.with_deployment_defaults)."""
    from flows.forms import merged_params

    given = render(dep["triggers"][0]["parameters"], event)["params"]
    return merged_params(dep["parameters"]["params"], given)


def test_each_link_triggers_on_the_upstream_deployments_event():
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    from flows.generate import GenerateParams
    from flows.promote import PromoteParams
    from flows.shard import ShardParams
    from flows.train import TrainParams
    from tasks.events import event_name

    forms = {"shard-nightly": ShardParams, "train-nightly": TrainParams}
    forms.update({"promote-nightly": PromoteParams, "generate-nightly": GenerateParams})
    deps = chain_deployments()
    assert "triggers" not in deps["curate-nightly"] and deps["curate-nightly"]["schedules"]
    runs = {}
    for upstream, downstream in zip(CHAIN, CHAIN[1:], strict=False):
        (spec,) = deps[downstream]["triggers"]
        trigger = DeploymentEventTrigger.model_validate(spec)
        assert trigger.expect == {event_name(STAGE[upstream])}, downstream
        assert trigger.after == set()  # only completion events: a failed run sends none
        # the upstream *deployment*: the same flow run as a subflow of the pipeline, or by
        # hand without a deployment, starts nothing
        role = {"prefect.resource.role": "deployment", "prefect.resource.name": upstream}
        assert spec["match_related"] == role, downstream
        # a trigger passes only what the event decides: every value it names is a template
        given = spec["parameters"]["params"]
        leaves = [v for v in given.values() if not isinstance(v, dict)]
        leaves += [v for d in given.values() if isinstance(d, dict) for v in d.values()]
        assert all(str(v).startswith("{{ event.payload.") for v in leaves), given
        # what the automation creates the run with is a valid form alone (the server checks
        # it against the flow's schema), and with the deployment's settings merged in
        event = {"payload": PAYLOAD[STAGE[upstream]]}
        forms[downstream].model_validate(render(spec["parameters"], event)["params"])
        params = _run_params(deps[downstream], event)
        form = forms[downstream].model_validate(params)
        if downstream == "train-nightly":
            form.to_config()  # every setting a known, typed config value
        runs[downstream] = params
        # the deployment's own defaults (a run by hand) are a valid form too
        forms[downstream].model_validate(deps[downstream]["parameters"]["params"])
    shard, train = runs["shard-nightly"], runs["train-nightly"]
    assert (shard["clips_dir"], shard["shards_dir"]) == ("/d/curated", "data/shards/nightly")
    assert train["settings"]["data.shards"] == "/d/shards"
    assert train["steps"] == 200 and train["settings"]["data.source"] == "shards"  # deployment's
    promote, gen = runs["promote-nightly"], runs["generate-nightly"]
    assert (promote["checkpoint"], promote["train_run_id"]) == ("/d/runs/x", "r")
    # videos of the new champion, only after a promotion (the event's label), not evaluated again
    assert gen["checkpoint"] == "models:/vfm-dit-tiny@champion" and gen["evaluate"] is False
    assert deps["generate-nightly"]["triggers"][0]["match"] == {"vfm.promoted": "true"}


def test_a_triggered_run_takes_the_rest_from_its_deployment():
    from flows.forms import merged_params

    dep = {"steps": 200, "settings": {"data.source": "shards", "data.shards": "a"}, "seed": 1}
    given = {"settings": {"data.shards": "b"}, "seed": 2}
    assert merged_params(dep, given) == {
        "steps": 200,
        "settings": {"data.source": "shards", "data.shards": "b"},
        "seed": 2,
    }


# ---------------------------------------------------------------------------------------------
# real servers


def _tiny_chain(tmp: Path, pool: str, tokenizer: Path) -> str:
    """prefect.yaml of the chain's deployments from the repository's file (its triggers
    untouched) with tiny sizes, paths in ``tmp``, no schedule."""
    deps = copy.deepcopy(chain_deployments())
    for d in deps.values():
        d["work_pool"] = {"name": pool, "work_queue_name": "default"}
        d.pop("schedules", None)
    deps["curate-nightly"]["parameters"]["params"].update(
        src=str(tmp / "raw"), dst=str(tmp / "curated"), min_len_s=1.0
    )
    # tiny sizes in the deployments' own parameters: the triggered runs take them from there
    own = {name: deps[name]["parameters"]["params"] for name in CHAIN}
    own["shard-nightly"]["shards_dir"] = str(tmp / "shards")
    own["train-nightly"].update(steps=2, experiment="vfm-chain-e2e")
    own["train-nightly"]["settings"].update(
        {
            "data.tokenizer": str(tokenizer),
            "data.latent_frames": 2,  # 5 frames of 64x64
            "data.batch_size": 2,
            "diffusion.num_steps": 2,
        }
    )
    own["promote-nightly"].update(eval_samples=2, eval_prompts=0, experiment="vfm-chain-e2e")
    own["generate-nightly"].update(
        prompts=["a red circle moving right"], frames=5, steps=2, experiment="vfm-chain-e2e"
    )
    spec = {
        "name": "vfm-chain-e2e",
        "prefect-version": "3.8.8",
        "pull": [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}},
        ],
        "deployments": [deps[name] for name in CHAIN],
    }
    return yaml.safe_dump(spec, sort_keys=False)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Prefect server, MLflow server and a process worker (infra/services.py, free loopback
    ports, everything under a temporary directory), the chain deployed; yields (Prefect API,
    root folder, MLflow URI)."""
    sys.path[:0] = [str(REPO), str(REPO / "tests" / "infra")]

    from infra.services import Settings, down, up

    root = tmp_path_factory.mktemp("chain")
    saved = dict(os.environ)
    os.environ.update(
        VFM_DATA_DIR=str(root / "data"),  # the worker's flow runs: train's run directories
        PREFECT_WORKER_QUERY_SECONDS="2",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        HF_HUB_OFFLINE="1",
    )
    s = Settings(
        run_dir=root / "infra",
        prefect_port=_free_port(),
        mlflow_port=_free_port(),
        pool="vfm-chain-e2e",
    )
    os.environ["PREFECT_API_AUTH_STRING"] = s.secrets().prefect_auth  # infra.load.api's
    try:
        up(s, ["prefect", "mlflow", "worker"], timeout=180)
        env = dict(os.environ, **s.client_env(), PREFECT_HOME=str(root / "client-prefect"))

        import torch

        from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

        torch.manual_seed(0)  # an untrained tok-tiny: the chain, not the quality, is tested
        save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config("tok-tiny")), root / "tok")
        prefect_yaml = root / "prefect.yaml"
        prefect_yaml.write_text(_tiny_chain(root, s.pool, root / "tok"))
        deploy(prefect_yaml, env)
        code, autos = _api("POST", f"{s.prefect_api}/automations/filter", {}, timeout=120)
        assert code == 200, autos
        names = {a["name"] for a in autos}
        assert {"curate-nightly -> shard-nightly", "promote-nightly -> generate-nightly"} <= names
        yield s.prefect_api, root, s.mlflow_uri
    finally:
        _quiesce(s.prefect_api, s.pool)
        down(s)
        os.environ.clear()
        os.environ.update(saved)


def _quiesce(api: str, pool: str) -> None:
    from test_schedule_e2e import quiesce

    quiesce(api, pool)


def _dep_id(api: str, name: str) -> str:

    code, dep = _api("GET", f"{api}/deployments/name/{FLOW[name]}/{name}", None, 120)
    assert code == 200, dep
    return dep["id"]


def _runs(api: str, name: str) -> list[dict]:

    body = {"deployments": {"id": {"any_": [_dep_id(api, name)]}}, "sort": "START_TIME_ASC"}
    code, runs = _api("POST", f"{api}/flow_runs/filter", body, timeout=120)
    assert code == 200, runs
    return runs


def _wait_for(api: str, name: str, n: int, root: Path, timeout: float = 420) -> dict:
    """The ``n``-th flow run of deployment ``name`` once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _runs(api, name)
        if len(runs) >= n and runs[n - 1]["state"]["type"] in FINAL:
            return runs[n - 1]
        time.sleep(2)
    log = (root / "infra" / "worker.log").read_text(errors="replace")[-4000:]
    raise AssertionError(f"no ended run #{n} of {name} after {timeout:.0f} s\n{log}")


def _start_curation(api: str, root: Path, src: Path, dst: Path, ends: str = "COMPLETED") -> dict:
    from test_deployment_e2e import run_deployment

    env = {"PREFECT_API_URL": api}
    params = {"params": {"src": str(src), "dst": str(dst), "min_len_s": 1.0}}
    state, run = run_deployment(env, _dep_id(api, "curate-nightly"), params)
    assert state == ends, run["state"]
    return run


@pytest.mark.slow
def test_a_completed_curation_ends_in_a_served_champion_and_a_worse_model_is_not(chain):
    import mlflow
    from test_deployment_e2e import run_deployment

    from vfm_core.video.sample_set import write_sample_videos

    api, root, mlflow_uri = chain
    write_sample_videos(root / "raw", n=1)
    _start_curation(api, root, root / "raw", root / "curated")

    shard = _wait_for(api, "shard-nightly", 1, root)
    train = _wait_for(api, "train-nightly", 1, root)
    promote = _wait_for(api, "promote-nightly", 1, root)
    gen = _wait_for(api, "generate-nightly", 1, root)
    for run in (shard, train, promote, gen):  # created by the deployment triggers' automations
        assert run["state"]["type"] == "COMPLETED", (run["name"], run["state"])
        assert run["created_by"]["type"] == "AUTOMATION", run["created_by"]
    # each stage's parameters came from the upstream run's event
    assert shard["parameters"]["params"]["clips_dir"] == str(root / "curated")
    settings = train["parameters"]["params"]["settings"]
    assert settings["data.shards"] == str(root / "shards")
    out_dir = root / "data" / "runs" / "dit-tiny" / train["name"]  # train's own run directory
    assert promote["parameters"]["params"]["checkpoint"] == str(out_dir)
    assert (out_dir / "checkpoints").is_dir()
    # the first version is the champion, and generate-nightly served it from the registry
    client = mlflow.MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    champion = client.get_model_version_by_alias("vfm-dit-tiny", "champion")
    assert champion.version == "1" and champion.tags["vfm.promotion"] == "promoted"
    assert champion.run_id == promote["parameters"]["params"]["train_run_id"]  # lineage
    assert gen["parameters"]["params"]["checkpoint"] == "models:/vfm-dit-tiny@champion"
    videos = sorted((root / "data" / "generated" / "vfm-dit-tiny@champion").glob("*/*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0

    # a worse model (the same training, diverged by a huge learning rate), started by hand: its
    # training's event still evaluates and registers it, but it is not promoted nor served
    # (by hand, a run names only what differs: the deployment's parameters fill the rest)
    worse = {"params": {"settings": {"optim.lr": 1.0, "optim.warmup_steps": 0}}}
    worse["params"]["settings"]["data.shards"] = str(root / "shards")
    state, run = run_deployment({"PREFECT_API_URL": api}, _dep_id(api, "train-nightly"), worse)
    assert state == "COMPLETED", run["state"]
    second = _wait_for(api, "promote-nightly", 2, root)
    assert second["state"]["type"] == "COMPLETED", second["state"]
    v2 = client.get_model_version("vfm-dit-tiny", "2")
    assert v2.tags["vfm.promotion"] == "rejected", v2.tags  # its held-out loss: far higher
    assert "heldout_loss" in v2.tags["vfm.promotion_reason"], v2.tags
    assert client.get_model_version_by_alias("vfm-dit-tiny", "champion").version == "1"
    time.sleep(10)  # time enough for an automation to act (the first one's took seconds)
    assert len(_runs(api, "generate-nightly")) == 1


@pytest.mark.slow
def test_a_curation_that_rejects_every_video_fails_and_stops_the_chain(chain):
    api, root, _ = chain
    n_shard, n_train = len(_runs(api, "shard-nightly")), len(_runs(api, "train-nightly"))
    (root / "broken").mkdir()
    (root / "broken" / "broken.mp4").write_bytes(os.urandom(4096))
    # its only video is a reject: the manifests are written, and the run ends Failed with the count
    run = _start_curation(api, root, root / "broken", root / "curated-broken", ends="FAILED")
    assert "curation of 1 videos produced no clip" in run["state"]["message"]  # the UI's line
    assert (root / "curated-broken" / "rejects.parquet").is_file()
    time.sleep(20)  # time enough for an automation to act (the good chain's took seconds)
    assert len(_runs(api, "shard-nightly")) == n_shard  # a failed run emits no event
    assert len(_runs(api, "train-nightly")) == n_train
