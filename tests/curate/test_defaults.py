"""One set of curation defaults (issue #27, case 20): `vfm curate`, the curation flow's form and
the pipeline flow take theirs from `CurateConfig`; `--help` shows them; the demo's short clips
are passed by name."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
from pydantic import ValidationError

from vfm_core.curate import CurateConfig
from vfm_core.curate import cli as curate_cli

D = CurateConfig()


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vfm")
    sub = ap.add_subparsers(dest="cmd")
    return curate_cli.add_parser(sub)


def test_cli_defaults_are_the_config_defaults():
    args = _parser().parse_args(["SRC", "DST"])
    assert {name: getattr(args, name) for name in curate_cli.FLAGS} == {
        name: getattr(D, name) for name in curate_cli.FLAGS
    }
    assert args.semdedup is None
    assert not _parser().parse_args(["SRC", "DST", "--no-stitch"]).stitch
    assert _parser().parse_args(["S", "D", "--min-len", "3"]).min_len_s == 3
    assert _parser().parse_args(["S", "D", "--max-len", "0"]).max_len_s is None  # 0: no limit


def test_building_the_parser_does_not_import_the_curation_config():
    import subprocess
    import sys

    code = (
        "import sys, vfm_core.cli as c; c.build_parser(); "
        "print('vfm_core.curate.config' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # `vfm --help` stays fast


def test_help_shows_the_defaults():
    text = " ".join(_parser().format_help().split())
    assert (
        f"a shorter shot is a reject row with its start, end and length (default: {D.min_len_s})"
        in text
    )
    assert f"(None: no limit) (0 = None; default: {D.max_len_s})" in text
    assert f"or TransNetV2 (default: {D.splitter})" in text
    assert f"(default: {D.encoder})" in text


def test_flows_use_the_same_defaults():
    from flows.curate import CurateParams
    from flows.pipeline import PipelineParams

    form = CurateParams(src="a", dst="b")
    assert form.config() == dataclasses.replace(D)  # every setting the form has: the defaults
    p = PipelineParams()
    assert (p.min_len_s, p.max_len_s) == (D.min_len_s, D.max_len_s)


def test_demo_passes_its_short_clip_lengths_by_name():
    from flows.demo import demo_params
    from vfm_core.video.sample_set import SAMPLE_MAX_LEN_S, SAMPLE_MIN_LEN_S

    for family in ("diffusion", "autoregressive"):
        p = demo_params(family)
        assert (p.min_len_s, p.max_len_s) == (SAMPLE_MIN_LEN_S, SAMPLE_MAX_LEN_S) == (1.0, 6.0)


def test_audio_is_one_setting_whose_bad_values_name_it(capsys):
    from flows.curate import CurateParams

    assert D.audio == "keep" and "--audio {keep,drop}" in _parser().format_usage()
    assert _parser().parse_args(["S", "D", "--audio", "drop"]).audio == "drop"
    with pytest.raises(SystemExit):
        _parser().parse_args(["S", "D", "--audio", "mute"])
    assert "argument --audio: invalid choice: 'mute'" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"audio='mute' \(--audio\): expected one of keep, drop"):
        CurateConfig(audio="mute")
    assert CurateParams(src="a", dst="b", audio="drop").config().audio == "drop"
    with pytest.raises(ValidationError, match="audio"):
        CurateParams(src="a", dst="b", audio="mute")
    # the encoder's speed and quality: flags, checked in the config and the flow's form
    args = _parser().parse_args(["S", "D", "--preset", "ultrafast", "--crf", "28"])
    assert (args.preset, args.crf, D.preset, D.crf) == ("ultrafast", 28, "veryfast", 23)
    with pytest.raises(ValueError, match=r"preset='fastest' \(--preset\): expected one of ultra"):
        CurateConfig(preset="fastest")
    with pytest.raises(ValueError, match=r"--crf: must be <= 51, got 52"):
        CurateConfig(crf=52)
    assert CurateParams(src="a", dst="b", preset="superfast").config().preset == "superfast"
    with pytest.raises(ValidationError, match="preset"):
        CurateParams(src="a", dst="b", preset="fastest")
