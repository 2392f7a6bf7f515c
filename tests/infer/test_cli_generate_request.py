"""Issue #25: ``vfm generate`` is a thin wrapper over the library's ``generate_request``, which the
Prefect generation task calls too; ``nproc`` N ranks go through the one launcher
(``vfm_core.launch.launcher``) and their result is read from the ``OUT.result.json`` rank 0 writes,
never parsed from stdout."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from tests.infer.conftest import PROMPT
from vfm_core.cli import main as vfm_main
from vfm_core.errors import UserError
from vfm_core.infer.args import add_generate_args, request_from_args
from vfm_core.infer.budget import GenerateBounds
from vfm_core.infer.generate import GenerateRequest, read_result, result_path
from vfm_core.infer.run import generate_request, rank_args
from vfm_core.infer.shapes import GenerateError
from vfm_core.launch import launcher as launch
from vfm_core.launch.launcher import LaunchError, run_launch

pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer:UserWarning")


def _req(**kw) -> GenerateRequest:
    return GenerateRequest(**{"prompt": PROMPT, "frames": 5, "steps": 1, "progress": False, **kw})


def test_rank_args_parse_back_to_the_same_request(tmp_path):
    req = GenerateRequest(
        prompt="a cat",
        frames=9,
        height=32,
        width=48,
        seed=3,
        steps=5,
        guidance=2.5,
        fps=12,
        gif=False,
        temperature=0.7,
        top_k=5,
        top_p=0.9,
        prompt_tokens="p.tokens.npy",
        prompt_frames=2,
        bounds=GenerateBounds(max_memory_gib=3.0, max_minutes=2.5, force=True, device_tflops=0.5),
    )
    ap = argparse.ArgumentParser()
    add_generate_args(ap)
    ap.add_argument("--text-emb")
    out = tmp_path / "o.mp4"
    args = ap.parse_args(rank_args("RUN", req, out, text_emb="e.npy", tokenizer="TOK"))
    assert request_from_args(args) == req
    assert (args.checkpoint, args.out, args.tokenizer, args.text_emb) == (
        "RUN",
        str(out),
        "TOK",
        "e.npy",
    )
    plain = ap.parse_args(rank_args("RUN", GenerateRequest(prompt="x"), out, text_emb="e.npy"))
    assert request_from_args(plain) == GenerateRequest(prompt="x") and plain.tokenizer is None


def test_run_launch_reads_the_result_file_not_stdout(tmp_path):
    res = tmp_path / "v.result.json"
    write = f"import pathlib; pathlib.Path({str(res)!r}).write_text('{{\"file\": 1}}')"
    res.write_text('{"stale": 1}')
    lines: list[str] = []
    got = run_launch(
        [sys.executable, "-c", f"print('{{\"stdout\": 1}}'); {write}"],
        result=res,
        on_line=lines.append,
    )
    assert got.returncode == 0 and got.summary == {"file": 1} and lines == ['{"stdout": 1}\n']
    res.write_text('{"stale": 1}')  # a run that writes none: an earlier one is never taken
    got = run_launch([sys.executable, "-c", "print('{}')"], result=res, on_line=lambda _: None)
    assert got.summary is None and not res.exists()
    fail = "import sys; print('error: --prompt bad', file=sys.stderr); sys.exit(2)"
    got = run_launch([sys.executable, "-c", fail], result=res, on_line=lambda _: None)
    assert got.returncode == 2 and got.error_line() == "error: --prompt bad"
    assert str(LaunchError("2 ranks", 2, got.error_line())) == (
        "2 ranks failed (exit 2): error: --prompt bad"
    )


def test_one_rank_runs_in_this_process_and_writes_its_result(tiny_run, tmp_path, monkeypatch):
    def boom(*_a, **_k):
        raise AssertionError("started ranks for nproc 1")

    monkeypatch.setattr(launch, "run_launch", boom)
    res = generate_request(tiny_run, _req(), tmp_path / "v.mp4")
    assert res.ranks == 1 and Path(res.mp4).stat().st_size > 0
    assert read_result(result_path(res.mp4)) == res  # OUT.result.json: what N ranks report


def test_ranks_report_through_the_result_file(tiny_run, tmp_path, monkeypatch):
    """The launcher's path for nproc 2, with the rank entry point started as one process
    instead of torchrun (the 2-rank run itself: test_cp_generate, slow): the result comes from
    OUT.result.json; a rank's one-line error names the failure."""
    started = []

    def one_process(_launch, **_k):
        started.append(_launch.nproc)
        return [sys.executable]

    monkeypatch.setattr(launch, "torchrun_prefix", one_process)
    res = generate_request(tiny_run, _req(seed=4), tmp_path / "r.mp4", nproc=2)
    assert started == [2] and res.seed == 4 and res.frames == 5
    assert res == read_result(tmp_path / "r.result.json")
    with pytest.raises(LaunchError, match=r"^2 ranks failed \(exit 2\): error: --tokenizer "):
        generate_request(
            tiny_run,
            _req(),
            tmp_path / "t.mp4",
            tokenizer=str(tmp_path / "no-tokenizer"),
            nproc=2,
            on_line=lambda _: None,
        )


def test_bad_input_is_refused_before_any_rank_starts(tiny_run, tmp_path, monkeypatch, capsys):
    def boom(*_a, **_k):
        raise AssertionError("started ranks for a refused request")

    monkeypatch.setattr(launch, "run_launch", boom)
    with pytest.raises(GenerateError, match="--nproc: must be >= 1, got 0"):
        generate_request(tiny_run, _req(), tmp_path / "a.mp4", nproc=0)
    with pytest.raises(GenerateError, match="--guidance 31"):
        generate_request(tiny_run, _req(guidance=31.0), tmp_path / "a.mp4", nproc=2)
    with pytest.raises(GenerateError, match=r"--frames 13 --size 100000x100000: needs about"):
        generate_request(
            tiny_run, _req(frames=13, height=100000, width=100000), tmp_path / "b.mp4", nproc=2
        )
    # every number, named by its flag (--fps 0 was a traceback after sampling); the token
    # sampling settings of autoregressive runs are refused for a DiT run, not ignored
    for bad, msg in (
        ({"fps": 0}, "--fps 0: must be an integer >= 1"),
        ({"seed": -1}, "--seed -1: must be"),
        ({"top_p": 1.5}, r"--top-p 1.5: must be a number in \(0, 1\]"),
        ({"prompt_frames": 0}, "--prompt-frames: must be an integer >= 1, got 0"),
        ({"temperature": 0.0, "top_k": 5}, "--temperature / --top-k: token sampling settings"),
    ):
        with pytest.raises(GenerateError, match=msg):
            generate_request(tiny_run, _req(**bad), tmp_path / "a.mp4", nproc=2)
    with pytest.raises(UserError, match="--checkpoint s3://b/run: a run directory on this"):
        generate_request("s3://b/run", _req(), tmp_path / "a.mp4")  # was read as s3:/b/run
    (tmp_path / "c.result.json").mkdir()
    with pytest.raises(GenerateError, match=r"c\.result\.json is a directory"):
        generate_request(tiny_run, _req(), tmp_path / "c.mp4")
    # the CLI: the same checks, one line, exit 2
    argv = ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPT, "--nproc", "2"]
    code = vfm_main([*argv, "--size", "100000x100000", "--out", str(tmp_path / "d.mp4")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith("vfm generate: error: --frames 13 --size 100000x100000: needs about")


def test_cli_json_is_the_result(tiny_run, tmp_path, capsys):
    out = tmp_path / "j.mp4"
    argv = ["generate", "--checkpoint", str(tiny_run), "--prompt", PROMPT, "--frames", "5"]
    assert vfm_main([*argv, "--steps", "1", "--out", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc == json.loads(result_path(out).read_text())
