"""Issue #25: flow forms map their fields to the typed run config through one function
(``flows.forms.form_config``: dotted keys with typed values through the config builder, validated
like a YAML file), never through ``section.field=value`` strings; the pipeline takes the tokenizer
geometry from the tokenizer's own saved config. No Prefect API needed."""

from __future__ import annotations

import json
import typing

import pytest
from pydantic import ValidationError

from flows.curate import CurateParams
from flows.forms import form_config, nested
from flows.pipeline import (
    PipelineParams,
    pixel_shape,
    remove_earlier_run,
    train_settings,
)
from flows.scaling import ScalingParams
from flows.shard import ShardParams
from flows.train import Family, TrainParams
from tasks.pipeline import tokenizer_geometry
from vfm_core.config import ConfigError, apply_overrides, to_dict, validate
from vfm_core.recipes import FAMILIES, get_recipe
from vfm_core.tokenizer.config import TokenizerConfig, TokenizerConfigError
from vfm_core.tokenizer.run_settings import MAX_TEXT_LEN


def test_form_config_is_the_override_config_with_typed_values():
    got = form_config(
        "dit-tiny",
        {"data.source": "shards", "data.shards": "s3://b/x", "data.latent_frames": 5},
        ["data.latent_frames=3", "model.depth=2"],  # a power user's free-form overrides
        {"train.steps": 7, "diffusion.sigma_data": 1},  # an int where a float goes: coerced
    )
    want = apply_overrides(
        get_recipe("dit-tiny"),
        [
            "data.source=shards",
            "data.shards=s3://b/x",
            "data.latent_frames=3",
            "model.depth=2",
            "train.steps=7",
            "diffusion.sigma_data=1.0",
        ],
    )
    assert to_dict(got) == to_dict(validate(want))
    assert got.diffusion.sigma_data == 1.0 and isinstance(got.diffusion.sigma_data, float)
    # a string that YAML would read as a number stays the string it is
    shards = form_config("dit-tiny", {"data.source": "shards", "data.shards": "1e3"}).data.shards
    assert shards == "1e3"


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"model.hiden": 3}, "model.hiden: unknown key"),
        ({"train.steps": "7"}, "train.steps: expected an integer, got '7'"),
        ({"data.source": "nope"}, "data.source: expected one of"),
        ({"train": 7}, "train: expected section.field"),
        ({"model.heads": 5}, "model.heads: 5 does not divide model.hidden"),  # validate()
    ],
)
def test_form_config_names_the_bad_key(values, needle):
    with pytest.raises(ConfigError, match=needle):
        form_config("dit-tiny", values)


def test_nested_groups_dotted_keys_by_section():
    assert nested({"data.shards": "s", "train.steps": 2, "data.seed": 1}) == {
        "data": {"shards": "s", "seed": 1},
        "train": {"steps": 2},
    }


def test_train_form_fields_map_to_the_config(tmp_path):
    params = TrainParams(
        recipe="dit-tiny",
        steps=3,
        seed=4,
        out_dir=str(tmp_path),
        experiment="e",
        tp=2,
        settings={"data.batch_size": 2, "train.steps": 3},  # the same as the field: fine
        overrides=["model.depth=2"],
    )
    cfg = params.to_config()
    assert (cfg.train.steps, cfg.train.seed, cfg.train.out_dir) == (3, 4, str(tmp_path))
    assert (cfg.tracking.experiment, cfg.parallel.tp, cfg.parallel.dp_shard) == ("e", 2, -1)
    assert (cfg.data.batch_size, cfg.model.depth) == (2, 2)
    with pytest.raises(ValidationError, match="train: expected section.field"):
        TrainParams(settings={"train": 1})
    assert "settings" in TrainParams.model_json_schema()["properties"]
    json.dumps(params.model_dump())  # a Prefect parameter: JSON


def test_a_field_left_at_its_default_yields_and_a_filled_one_must_agree(tmp_path):
    """The named fields at their defaults (steps 200, seed 0, tp 1) replaced what settings and
    overrides said, silently; now those win, and a field filled in with another value than a
    setting or override of the same key is one error naming both."""
    out = str(tmp_path)
    cfg = TrainParams(
        out_dir=out,
        settings={"train.steps": 7, "tracking.experiment": "mine"},
        overrides=["train.seed=5", "parallel.tp=2"],
    ).to_config()
    assert (cfg.train.steps, cfg.train.seed, cfg.parallel.tp) == (7, 5, 2)
    assert cfg.tracking.experiment == "mine"
    assert TrainParams(settings={"train.out_dir": out}).to_config().train.out_dir == out
    with pytest.raises(ConfigError, match=r"train.steps: the form's field says 3 but settings"):
        TrainParams(out_dir=out, steps=3, settings={"train.steps": 99}).to_config()
    with pytest.raises(ConfigError, match=r"parallel.tp: .* 4 but overrides 'parallel.tp=2'"):
        TrainParams(out_dir=out, tp=4, overrides=["parallel.tp=2"]).to_config()


@pytest.mark.parametrize(
    ("form", "values", "message"),
    [
        (TrainParams, {"stpes": 3}, "stpes\n  Extra inputs are not permitted"),
        (CurateParams, {"src": "a", "dst": "b", "min_len": 1}, "min_len\n  Extra inputs"),
        (CurateParams, {"src": "a", "dst": "b", "out_fps": float("inf")}, "out_fps\n  Input "),
        (ShardParams, {"clips_dir": "a", "shards_dir": "b", "target_shard_mb": float("nan")}, ""),
        (ShardParams, {"clips_dir": "a", "shards_dir": "b", "query_top": 5}, "give a query too"),
        (TrainParams, {"steps": 0}, "steps\n  Input should be greater than or equal to 1"),
    ],
)
def test_forms_refuse_unknown_keys_and_numbers_that_are_not_finite(form, values, message):
    """A misspelt key trained with the default (200 steps); ``inf`` passed ``gt=0`` and failed
    deep in a task, after retries."""
    with pytest.raises(ValidationError, match=message or "target_shard_mb"):
        form(**values)


def test_pipeline_train_settings_are_typed_and_user_overrides_win(tmp_path):
    p = PipelineParams(latent_grid=(2, 4, 4), overrides=["train.ckpt_every=10"])
    geometry = {"temporal_factor": 2, "spatial_factor": 16, "latent_channels": 8}
    settings = train_settings(p, latents="L", tokenizer="T", geometry=geometry)
    assert settings["data.latent_frames"] == 2 and settings["diffusion.sigma_data"] == 1.0
    assert not any(isinstance(k, str) and "=" in k for k in settings)
    cfg = TrainParams(
        recipe=p.recipe, out_dir=str(tmp_path), settings=settings, overrides=p.overrides
    ).to_config()
    d, m = cfg.data, cfg.model
    assert (d.source, d.shards, d.tokenizer) == ("shards", "L", "T")
    assert (d.latent_frames, d.latent_height, d.latent_width) == (2, 4, 4)
    assert m.in_channels == 8  # the tokenizer's latent channels
    assert cfg.train.ckpt_every == 10  # p.overrides over the pipeline's settings
    assert "model.text_len" not in settings  # shards that say nothing about their captions
    sized = train_settings(p, latents="L", tokenizer="T", geometry=geometry, caption_tokens=11)
    assert sized["model.text_len"] == 11  # the longest caption of the data: nothing cut
    huge = train_settings(p, latents="L", tokenizer="T", geometry=geometry, caption_tokens=5000)
    assert huge["model.text_len"] == MAX_TEXT_LEN
    ar = PipelineParams(family="autoregressive", top_k=16)
    assert (ar.discrete, ar.tokenizer_preset(), p.discrete) == (True, "tok-tiny-discrete", False)
    with pytest.raises(ValueError, match="top_k=16: the k likeliest tokens of autoregressive"):
        PipelineParams(top_k=16)  # a diffusion run's generation would refuse it after training
    with pytest.raises(ValueError, match="max_len_s=1.0 .* is below min_len_s=3.0"):
        PipelineParams(min_len_s=3, max_len_s=1)  # curation would reject every clip
    ar_settings = train_settings(ar, latents="L", tokenizer="T", geometry=geometry)
    assert "model.in_channels" not in ar_settings
    assert "model.vocab_size" not in ar_settings  # a continuous tokenizer: the recipe's
    discrete = {**geometry, "vocab_size": 256}
    assert (
        train_settings(ar, latents="L", tokenizer="T", geometry=discrete)["model.vocab_size"] == 256
    )  # the causal model predicts the tokenizer's ids
    assert "model.vocab_size" not in train_settings(
        p, latents="L", tokenizer="T", geometry=discrete
    )


def test_pipeline_video_shape_comes_from_the_tokenizer_config(tmp_path):
    for cfg in (
        TokenizerConfig(),
        TokenizerConfig(temporal_factor=2, spatial_factor=16, channel_mult=(1, 2, 2)),
    ):
        (tmp_path / "tok").mkdir(exist_ok=True)
        (tmp_path / "tok" / "config.json").write_text(json.dumps(cfg.to_dict()))
        geometry = tokenizer_geometry.fn(str(tmp_path / "tok"))
        t, s = cfg.temporal_factor, cfg.spatial_factor
        assert geometry == {
            "temporal_factor": t,
            "spatial_factor": s,
            "latent_channels": 4,
            "vocab_size": 0,  # continuous
        }
        assert pixel_shape((5, 8, 6), geometry) == (1 + 4 * t, f"{8 * s}x{6 * s}")
    fsq = TokenizerConfig(fsq_levels=(4, 4, 4, 4), regulariser="l2")
    (tmp_path / "tok" / "config.json").write_text(json.dumps(fsq.to_dict()))
    assert tokenizer_geometry.fn(str(tmp_path / "tok"))["vocab_size"] == 256  # 4^4 FSQ ids
    with pytest.raises(TokenizerConfigError, match="no readable config"):
        tokenizer_geometry.fn(str(tmp_path / "missing"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"overrides": ["train.steps=5"]}, "'train.steps=5': train.steps is set from the form's"),
        ({"overrides": ["data.latent_frames=2"]}, "is set from the form's latent_grid"),
        ({"latent_grid": (0, 8, 8)}, "latent_grid / overrides: data.latent_frames"),
        ({"overrides": ["model.hiddn=3"]}, "latent_grid / overrides: model.hiddn: unknown key"),
        ({"prompts": ["a red circle", " "]}, r"prompts \[1\] are empty"),
        ({"name": ".."}, "'..' is not a folder name of its own"),
        ({"src": "raw", "sample_videos": 9}, "sample_videos: not used when src is given"),
        ({"tokenizer": "tok", "tokenizer_steps": 9}, "tokenizer_steps: not used when tokenizer"),
    ],
)
def test_the_pipeline_form_refuses_what_a_later_stage_would(values, message):
    """Checked before any stage runs (they failed at train or generate, after curate, shard,
    tokenizer and encode had run; a bad override after the earlier run was removed)."""
    with pytest.raises(ValidationError, match=message):
        PipelineParams(**values)


def test_the_train_stage_removes_an_earlier_run_and_nothing_else(tmp_path):
    run = tmp_path / "train"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    remove_earlier_run(run)  # an earlier run's folder: starting over
    assert not run.exists()
    run.mkdir()
    (run / "important.txt").write_text("notes")
    with pytest.raises(ValueError, match=r"holds files that are not a training run's"):
        remove_earlier_run(run)
    assert (run / "important.txt").read_text() == "notes"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"layouts": [{"nproc": 1}, {"nproc": 1, "tp": 3}]}, r"layouts\[1\] \(tp3, nproc 1\)"),
        ({"overrides": ["train.steps=5"]}, "train.steps is set from the form's steps"),
        ({"study": "."}, "'.' is not a folder name"),
        ({"steps": 2}, "greater than or equal to 3"),
    ],
)
def test_the_scaling_form_checks_every_layout_before_the_first_trains(values, message):
    with pytest.raises(ValidationError, match=message):
        ScalingParams(**values)
    assert ScalingParams(layouts=[{"nproc": 2, "dp_replicate": 2}]).layouts[0].degrees() == {
        "dp_replicate": 2
    }


def test_the_forms_offer_the_families_of_the_config_table():
    assert typing.get_args(Family) == FAMILIES  # vfm_core.config.FAMILY_TRAITS, in its order
