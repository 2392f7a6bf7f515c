from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def vfm(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args],
        capture_output=True,
        text=True,
        env={**(os.environ if env is None else env), "OMP_NUM_THREADS": "1"},
        cwd=cwd,
    )


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["train", "--recipe", "dit-huge", "--steps", "1", "--out", "x"],
            "unknown recipe 'dit-huge'",
        ),
        (
            ["train", "--steps", "1", "--out", "x", "--set", "model.hiden=3"],
            "model.hiden: unknown key",
        ),
        (
            ["train", "--steps", "1", "--out", "x", "--set", "model.hidden=abc"],
            "model.hidden: expected an integer",
        ),
        (["train", "--steps", "-3", "--out", "x"], "--steps must be >= 0"),
        (
            ["train", "--steps", "1", "--out", "x", "--set", "data.latent_width=15"],
            "data.latent_width: 15 is not a positive multiple of the patch 2",
        ),
        (["train", "--steps", "1"], "the following arguments are required: --out"),
        (["train", "--steps", "1", "--out", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["flops", "--recipe", "dit-7b", "--seq", "zero"], "--seq must be an integer"),
        (["flops", "--recipe", "dit-7b", "--seq", str(10**15)], "--seq must be at most 2**24"),
        (
            ["flops", "--recipe", "dit-7b", "--seq", "64", "--set", "model.depth=0"],
            "model.depth: must be >= 1",
        ),
        # flags only as spelled in full: before, "--in" was read as "--index-format"
        (["shard", "--in", "x"], "unrecognized arguments: --in (--in: did you mean --index-"),
        # the unknown flag, not the required one it was meant to be
        (["train", "--step", "3", "--out", "x"], "--step (--step: did you mean --steps?)"),
        (  # was a traceback
            ["tokenizer", "train", "--shards", "x", "--out", "y", "--steps", "0"],
            "--steps must be >= 1, got 0",
        ),
    ],
)
def test_bad_input_is_one_clear_line(args, needle, tmp_path):
    r = vfm(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]


def test_tokenizer_out_is_checked_before_the_training(tmp_path, capsys):
    """``--out`` of `vfm tokenizer train`: ``s3://`` wrote a local folder named ``s3:``; an
    existing file failed after the training; a trained tokenizer was replaced silently; ''
    wrote into the cwd. Each is one line now, before any work; ``--force`` replaces."""
    from vfm_core.cli import main as vfm_main

    (tmp_path / "afile").write_text("x")
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.safetensors").write_bytes(b"")
    base = ["tokenizer", "train", "--shards", str(tmp_path / "none"), "--steps", "1"]
    for out, said in [
        ("s3://bucket/tok", "--out s3://bucket/tok: the tokenizer is written to a local folder"),
        (str(tmp_path / "afile"), "afile: is a file, not a folder"),
        (str(tmp_path / "tok"), "already holds a tokenizer (tokenizer.safetensors); pass --force"),
        ("", "--out is empty"),
    ]:
        assert vfm_main([*base, "--out", out]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], (out, err)
    assert vfm_main([*base, "--out", str(tmp_path / "tok"), "--force"]) == 2  # checked: shards
    assert "--out" not in capsys.readouterr().err


def test_flops_json():
    r = vfm("flops", "--recipe", "dit-7b", "--seq", "56320", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) >= {"params", "flops_per_token"}
    assert 6.8e9 < out["params"] < 7.6e9
    # >= 6 x params (matmul weights) plus attention at 56k tokens
    assert out["flops_per_token"] > 6 * 6.5e9


def test_recipes_lists_presets():
    r = vfm("recipes")
    assert r.returncode == 0 and "dit-28b" in r.stdout and "llama-dit-7b" in r.stdout


def test_a_reader_that_goes_away_is_no_traceback():
    """`vfm recipes | head -c 10`: the pipe closes before vfm writes; it ends as a tool killed
    by SIGPIPE would (141), with nothing on stderr."""
    p = subprocess.Popen(
        [sys.executable, "-m", "vfm_core.cli", "recipes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    p.stdout.close()  # long before the interpreter has started
    assert p.wait(timeout=60) == 141
    assert p.stderr.read() == b""


def test_a_remote_store_without_credentials_is_one_line_before_any_work(tmp_path):
    """`vfm shard` / `vfm curate` to s3:// without credentials: one line naming the URL and the
    settings, before any work (was botocore's traceback, after the captions were embedded)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {"HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true"}
    for argv in (["shard", str(tmp_path), "s3://bucket/shards"], ["curate", "raw", "s3://b/c"]):
        r = vfm(*argv, env=env, cwd=tmp_path)
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "s3://" in lines[0], r.stderr
        assert "no S3 credentials: set AWS_ACCESS_KEY_ID" in lines[0]


def test_the_config_files_recipe_is_the_base_unless_another_is_named(tmp_path):
    """``recipe:`` in a ``--config`` file picks the preset its sections go on top of; with a
    different ``--recipe`` it is one error (it relabelled a DiT run 'ar-tiny')."""
    from vfm_core.cli import run_config
    from vfm_core.cli_parser import build_parser
    from vfm_core.config import ConfigError

    path = tmp_path / "run.yaml"
    path.write_text("recipe: ar-tiny\nmodel: {depth: 1}\n")
    argv = ["train", "--config", str(path), "--steps", "1", "--out", str(tmp_path / "o")]
    cfg = run_config(build_parser().parse_args(argv))
    assert (cfg.recipe, cfg.model.arch, cfg.model.depth) == ("ar-tiny", "ar", 1)
    assert run_config(build_parser().parse_args([*argv, "--recipe", "ar-tiny"])) == cfg
    with pytest.raises(ConfigError, match="recipe: ar-tiny but --recipe dit-tiny"):
        run_config(build_parser().parse_args([*argv, "--recipe", "dit-tiny"]))
    with pytest.raises(ConfigError, match="--out is empty"):  # it trained into the cwd
        run_config(build_parser().parse_args(["train", "--steps", "1", "--out", ""]))


def test_a_flag_and_a_setting_of_the_same_field_must_agree(tmp_path):
    """``--tp 2 --set parallel.tp=4`` (or the config file's ``parallel.tp``) trained with the
    flag's value and said nothing; now one error names both. Equal values, or a flag over the
    recipe's default, are fine."""
    from vfm_core.cli import run_config
    from vfm_core.cli_parser import build_parser
    from vfm_core.config import ConfigError

    base = ["train", "--steps", "3", "--out", str(tmp_path / "o")]

    def config(*argv):
        return run_config(build_parser().parse_args([*base, *argv]))

    for argv, message in [
        (["--tp", "2", "--set", "parallel.tp=4"], "--tp 2 but --set parallel.tp=4: two values"),
        (["--seed", "1", "--set", "train.seed=2"], "--seed 1 but --set train.seed=2"),
        (["--set", "train.steps=5"], "--steps 3 but --set train.steps=5"),
        (["--set", "train.out_dir=elsewhere"], "--out .* but --set train.out_dir=elsewhere"),
        (["--no-mlflow", "--set", "tracking.mlflow=true"], "--no-mlflow but --set tracking"),
    ]:
        with pytest.raises(ConfigError, match=message):
            config(*argv)
    path = tmp_path / "run.yaml"
    path.write_text("parallel: {cp: 4}\n")
    with pytest.raises(ConfigError, match=f"--cp 2 but config file {path}: parallel.cp: 4"):
        config("--config", str(path), "--cp", "2")
    assert config("--seed", "7", "--set", "train.seed=7").train.seed == 7
    assert config("--no-mlflow", "--set", "tracking.mlflow=false").tracking.mlflow is False
