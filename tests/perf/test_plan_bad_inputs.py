"""``vfm plan`` bad input: every bad flag or --calibrate record is one line naming the input
(the file, the record and the field), exit 2; no traceback, no hang, nothing silently ignored."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from vfm_core.cli import main
from vfm_core.config import ConfigError
from vfm_core.perf.calibrate import calibrate
from vfm_core.perf.planner import MAX_SEQ_LEN, plan
from vfm_core.recipes import get_recipe

PLAN = ["plan", "--recipe", "dit-tiny", "--seq", "64", "--gpus", "8"]
BASE = {"recipe": "dit-tiny", "seq": 64, "tokens_per_s_per_gpu": 1000}


def _error(capsys, argv: list[str]) -> str:
    """The one stderr line of a refused ``vfm`` command (exit 2, nothing on stdout)."""
    try:
        code = main(argv)
    except SystemExit as e:  # refused by the parser
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vfm plan: error: "), err
    assert "Traceback" not in err and out == ""
    return lines[0]


# --------------------------------------------------------------------------- --calibrate FILE
@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('"tokens_per_s_per_gpu": "abc"', "tokens_per_s_per_gpu"),
        ('"tokens_per_s_per_gpu": Infinity', "tokens_per_s_per_gpu"),
        ('"tokens_per_s_per_gpu": NaN', "tokens_per_s_per_gpu"),  # was accepted: fit error nan
        ('"tokens_per_s_per_gpu": true', "tokens_per_s_per_gpu"),
        ('"tokens_per_s_per_gpu": -5', "tokens_per_s_per_gpu"),
        ('"grid": 5', "grid"),
        ('"grid": [2, 4, 4]', "grid"),  # 32 tokens, seq is 64
        ('"text_len": "x"', "text_len"),
        ('"text_len": -1', "text_len"),
        ('"layout": 5', "layout"),
        ('"layout": {"tp": "x"}', "tp"),
        ('"layout": {"tp": 2.5}', "tp"),
        ('"layout": {"bogus": 1}', "bogus"),
        ('"tp": 3', "tp=3"),  # 3 does not divide heads=4: was accepted
        ('"tp": 2, "layout": {"tp": 4}', "tp"),
        ('"hardware": "tpu"', "hardware"),
        ('"seq": 10000000000', "seq"),
        ('"seq": "64"', "seq"),
    ],
)
def test_calibrate_bad_field_is_named_with_file_and_record(tmp_path, capsys, text, named):
    path = tmp_path / "cal.json"
    base = json.dumps(BASE)[1:-1]
    path.write_text(f"[{{{base}}}, {{{base}, {text}}}]")  # the later key wins in JSON
    err = _error(capsys, [*PLAN, "--calibrate", str(path)])
    assert f"--calibrate {path}: record 2 of 2: " in err and named in err
    assert "--fixed" not in err  # a layout value of the file is not a --fixed flag


@pytest.mark.parametrize(
    ("record", "named"),
    [
        ({"seq": 64, "tokens_per_s": 1000, "gpus": 0, "recipe": "dit-tiny"}, "gpus"),
        ({"seq": 64, "tokens_per_s_per_gpu": 1000, "model": {"depth": "x"}}, "model.depth"),
        ({"seq": 64, "tokens_per_s_per_gpu": 1000, "model": {"depth": 0}}, "model.depth"),
        ({"seq": 64, "tokens_per_s_per_gpu": 1000, "model": 5}, "model"),
        ({"seq": 64, "tokens_per_s_per_gpu": 1000, "recipe": 7}, "recipe"),
        ({"seq": 64, "tokens_per_s_per_gpu": 1000}, "recipe"),
        ({"recipe": "dit-tiny", "seq": 64}, "tokens_per_s"),
        ({"recipe": "dit-tiny", "seq": 64, "seq_len": 32, "tokens_per_s_per_gpu": 1}, "seq_len"),
    ],
)
def test_calibrate_bad_record(tmp_path, capsys, record, named):
    path = tmp_path / "cal.jsonl"
    path.write_text(json.dumps(record) + "\n")
    err = _error(capsys, [*PLAN, "--calibrate", str(path)])
    assert f"--calibrate {path}: record 1 of 1: " in err and named in err


def test_calibrate_records_from_python_name_the_record():
    bad = {**BASE, "tokens_per_s_per_gpu": float("nan")}
    with pytest.raises(ConfigError, match=r"record 2 of 2: tokens_per_s_per_gpu"):
        calibrate([BASE, bad])


def test_calibrate_good_record_still_fits(tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"runs": [{**BASE, "model": {"depth": 4}, "grid": [4, 4, 4]}]}))
    assert main([*PLAN, "--top", "1", "--calibrate", str(path)]) == 0
    assert "calibrated on 1 run(s)" in capsys.readouterr().err


def test_calibrate_file_not_utf8(tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_bytes(b'\xff\xfe{"recipe": "dit-tiny"}')
    err = _error(capsys, [*PLAN, "--calibrate", str(path)])
    assert str(path) in err and "UTF-8" in err


def test_calibrate_fifo_is_refused_without_opening(tmp_path, capsys):
    fifo = tmp_path / "runs.json"
    os.mkfifo(fifo)

    def hung(*_):
        raise AssertionError("--calibrate FIFO: opened and blocked")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        err = _error(capsys, [*PLAN, "--calibrate", str(fifo)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert str(fifo) in err and "named pipe" in err


def test_bad_hardware_is_the_flag_not_a_record(tmp_path, capsys):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(BASE))  # no "hardware": the record defaults to --hardware
    err = _error(capsys, [*PLAN, "--hardware", "tpu", "--calibrate", str(path)])
    assert "error: --hardware: unknown hardware 'tpu'" in err and "record" not in err


def test_calibrate_directory_and_missing_file(tmp_path, capsys):
    assert str(tmp_path) in _error(capsys, [*PLAN, "--calibrate", str(tmp_path)])
    missing = tmp_path / "missing.json"
    assert "not found" in _error(capsys, [*PLAN, "--calibrate", str(missing)])


# ------------------------------------------------------------------------------------- --seq
@pytest.mark.parametrize("seq", [10**15, 10**9, MAX_SEQ_LEN + 1])
def test_seq_is_capped_and_refused_at_once(capsys, seq):
    t0 = time.perf_counter()
    err = _error(capsys, ["plan", "--recipe", "dit-tiny", "--seq", str(seq), "--gpus", "8"])
    assert time.perf_counter() - t0 < 5  # was minutes (10**15) and 28 s (10**9)
    assert "--seq" in err and "2**24" in err and str(seq) in err


def test_seq_cap_in_the_planner_and_the_help(capsys):
    with pytest.raises(ConfigError, match=r"--seq must be at most 2\*\*24"):
        plan(get_recipe("dit-tiny").model, seq_len=MAX_SEQ_LEN + 1, gpus=8)
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "2**24" in capsys.readouterr().out


# ----------------------------------------------------------------------------------- --fixed
def test_repeated_fixed_flags_add_up(capsys):
    assert main([*PLAN, "--fixed", "tp=2", "--fixed", "cp=2", "--json", "--top", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and all((r["tp"], r["cp"]) == (2, 2) for r in rows)


@pytest.mark.parametrize(
    "flags", [["--fixed", "tp=2,tp=4"], ["--fixed", "tp=2", "--fixed", "tp=4"]]
)
def test_one_key_fixed_twice_names_both(capsys, flags):
    err = _error(capsys, [*PLAN, *flags])
    assert "tp=2" in err and "tp=4" in err


def test_fixed_empty_entry(capsys):
    assert "empty entry" in _error(capsys, [*PLAN, "--fixed", "tp=2,,cp=2"])


# ----------------------------------------------------------------------------- --global-batch
@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("0", "--global-batch must be >= 1, got 0"),
        ("-8", "--global-batch must be >= 1, got -8"),
        ("x", "--global-batch must be an integer, got 'x'"),
        ("2.5", "--global-batch must be an integer, got '2.5'"),
        ("1e3", "--global-batch must be an integer, got '1e3'"),
        (str(2**31), f"--global-batch must be at most 2**30 = {2**30} samples, got {2**31}"),
    ],
)
def test_global_batch_that_is_no_number_of_samples(capsys, value, named):
    assert named in _error(capsys, [*PLAN, "--global-batch", value])


@pytest.mark.parametrize("check", [[], ["--check"]])
def test_global_batch_the_layout_cannot_split(capsys, check):
    """dit-tiny pinned to plain data parallelism on 8 GPUs (dp = 8 replicas) cannot train 12
    samples per step: one line naming the batch and why, exit 2, nothing printed or built."""
    err = _error(capsys, [*PLAN, *check, "--global-batch", "12", "--fixed", "tp=1,cp=1,pp=1"])
    assert "--global-batch 12: no layout of 8 GPU(s)" in err
    assert "12 samples per step do not split over dp=8" in err
    # a pipeline needs a micro-batch per stage: 4 samples over dp=4 leave 1 for 2 stages
    err = _error(capsys, [*PLAN, "--global-batch", "4", "--fixed", "tp=1,cp=1,pp=2"])
    assert "--global-batch 4" in err and "fewer than pp=2 micro-batches" in err


def test_global_batch_is_the_batch_of_every_layout(capsys):
    assert main([*PLAN, "--global-batch", "24", "--top", "0", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {r["global_batch"] for r in rows} == {24}


# ------------------------------------------------------------------------ --set and --check
def test_set_of_a_layout_field_points_to_fixed(capsys):
    err = _error(capsys, [*PLAN, "--set", "parallel.tp=2"])
    assert "--set parallel.tp=2" in err and "--fixed tp=2" in err
    err = _error(capsys, [*PLAN, "--set", "data.batch_size=4"])  # the global batch: one flag
    assert "--set data.batch_size=4" in err and "--global-batch 4" in err


def test_set_outside_the_model_needs_check(capsys):
    err = _error(capsys, [*PLAN, "--set", "train.ema_decay=0"])
    assert "train.ema_decay" in err and "--check" in err
    assert main([*PLAN, "--set", "model.depth=8", "--top", "1", "--json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("flags", "named"),
    [(["--top", "3"], "--top"), (["--explain"], "--explain"), (["--top", "0"], "--top")],
)
def test_check_refuses_flags_it_would_ignore(capsys, flags, named):
    assert named in _error(capsys, [*PLAN, "--check", *flags])


def test_check_honours_hardware():
    """In its own process: ``--check`` builds the layout on a fake process group of its own,
    which an earlier test's group in this process would refuse."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *PLAN, "--check", "--hardware", "h200", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["hardware"] == "H200"
