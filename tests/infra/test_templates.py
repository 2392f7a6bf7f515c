"""The cluster templates and the deployment file are checked without a cluster: syntax, dry-run
rendering, and that everything they name exists in this repository."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"


def _train_main_flags() -> set[str]:
    out = subprocess.run(
        [sys.executable, "-m", "vfm_core.train.main", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return set(re.findall(r"--[a-z][a-z-]*", out.stdout))


def _check_train_command(argv: list[str], flags: set[str]) -> None:
    assert argv[0] == "torchrun"
    i = argv.index("-m")
    assert argv[i + 1] == "vfm_core.train.main"
    used = {a for a in argv[i + 2 :] if a.startswith("--")}
    assert used <= flags, f"flags the trainer does not accept: {used - flags}"


def test_sbatch_syntax_and_dry_run():
    script = INFRA / "slurm" / "train.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = dict(
        os.environ,
        VFM_DRY_RUN="1",
        SLURM_NNODES="4",
        SLURM_JOB_NODELIST="gpu-a,gpu-b",
        SLURM_JOB_ID="77",
        GPUS_PER_NODE="8",
        CONFIG="/cfg/run.yaml",
        OUT="/runs/x",
        PATH="/usr/bin:/bin",
    )  # no scontrol: the template falls back to the list's head
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout.strip())
    assert argv[argv.index("--nnodes") + 1] == "4"
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    assert argv[argv.index("--rdzv-endpoint") + 1] == "gpu-a:29500"
    assert argv[argv.index("--config") + 1] == "/cfg/run.yaml"
    _check_train_command(argv, _train_main_flags())
    directives = re.findall(r"^#SBATCH (--[a-z-]+)", script.read_text(), flags=re.M)
    assert {"--nodes", "--gpus-per-node", "--ntasks-per-node"} <= set(directives)


def test_pytorchjob_renders():
    job = yaml.safe_load((INFRA / "k8s" / "pytorchjob.yaml").read_text())
    assert job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] >= 1
    assert specs["Master"]["template"] == specs["Worker"]["template"]
    (container,) = specs["Master"]["template"]["spec"]["containers"]
    gpus = container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == job["spec"]["elasticPolicy"]["nProcPerNode"]
    _check_train_command(container["command"], _train_main_flags())


def test_gpu_dockerfile_copies_existing_paths_and_keeps_image_torch():
    text = (INFRA / "docker" / "Dockerfile.gpu").read_text()
    assert re.search(r"^FROM nvcr\.io/nvidia/pytorch:\S+", text, flags=re.M)
    for src in re.findall(r"^COPY (.+) \S+$", text, flags=re.M):
        for path in src.split():
            assert (REPO / path).exists(), f"Dockerfile copies a missing path: {path}"
    # the requirements snippet drops the CPU torch pin and keeps the rest
    snippet = re.search(r'python -c "(.*?)" \\\n', text, flags=re.S).group(1)
    code = snippet.replace("\\\n", "\n").replace("\\\\n", "\\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    reqs = out.stdout.split()
    assert not any(r.startswith("torch") for r in reqs)
    assert any(r.startswith("prefect") for r in reqs) and any("s3fs" in r for r in reqs)


def _flow_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if getattr(target, "id", None) == "flow":
                    names.add(node.name)
    return names


def test_prefect_yaml_names_real_flows_pools_and_schedules():
    sys.path.insert(0, str(REPO))
    from infra.services import GPU_POOL, POOL

    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    assert spec["pull"][0]["prefect.deployments.steps.set_working_directory"]["directory"]
    names = [d["name"] for d in spec["deployments"]]
    assert len(names) == len(set(names))
    for dep in spec["deployments"]:
        file, func = dep["entrypoint"].split(":")
        assert func in _flow_functions(REPO / file), dep["entrypoint"]
        assert dep["work_pool"]["name"] in (POOL, GPU_POOL)
        for sched in dep.get("schedules") or []:
            assert len(sched["cron"].split()) == 5


def test_prefect_cli_validates_deploy_flags():
    out = subprocess.run(
        [str(Path(sys.executable).parent / "prefect"), "deploy", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for flag in ("--all", "--prefect-file"):
        assert flag in out.stdout
