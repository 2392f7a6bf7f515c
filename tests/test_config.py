from __future__ import annotations

import pytest

from vfm_core.config import (
    Config,
    ConfigError,
    apply_overrides,
    load_yaml,
    save_yaml,
    validate,
)
from vfm_core.recipes import RECIPES, get_recipe


def test_overrides_apply_and_coerce():
    cfg = apply_overrides(
        Config(),
        [
            "model.hidden=512",
            "optim.lr=1e-3",
            "model.patch=[1,4,4]",
            "model.kv_heads=2",
            "train.dtype=bfloat16",
            "optim.lr=2",
        ],
    )
    assert cfg.model.hidden == 512
    assert cfg.model.patch == (1, 4, 4)
    assert cfg.model.kv_heads == 2
    assert cfg.optim.lr == 2.0 and isinstance(cfg.optim.lr, float)
    assert cfg.train.dtype == "bfloat16"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.hiden=3", "model.hiden: unknown key"),
        ("modle.hidden=3", "modle: unknown key"),
        ("model.hidden=abc", "model.hidden: expected an integer"),
        ("model.hidden=1.5", "model.hidden: expected an integer"),
        ("model.qk_norm=3", "model.qk_norm: expected true/false"),
        ("model.adaln=full", "model.adaln: expected one of 'zero', 'lora'"),
        ("model.patch=[1,2]", "model.patch: expected a list of 3"),
        ("hidden=3", "key must be section.field"),
        ("model.hidden", "expected section.field=value"),
    ],
)
def test_bad_overrides_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[")):
        apply_overrides(Config(), [override])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("model.heads=3", "model.heads"),
        (
            "data.latent_height=15",
            "data.latent_height: 15 is not a positive multiple of the patch 2",
        ),
        ("train.steps=-1", "train.steps"),
        ("model.kv_heads=3", "model.kv_heads"),
        ("model.abs_pos=8", "model.abs_pos: must be a multiple of 6"),
    ],
)
def test_validate_names_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle):
        validate(apply_overrides(get_recipe("dit-tiny"), [override]))


def test_yaml_round_trip_and_errors(tmp_path):
    cfg = apply_overrides(get_recipe("llama-dit-tiny"), ["train.steps=7"])
    path = tmp_path / "c.yaml"
    save_yaml(cfg, path)
    assert load_yaml(path) == cfg
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  depht: 3\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: model.depht: unknown key"):
        load_yaml(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_yaml(tmp_path / "missing.yaml")


def test_unknown_recipe_lists_known():
    with pytest.raises(ConfigError, match="unknown recipe 'dit-huge'.*dit-tiny"):
        get_recipe("dit-huge")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_validates(name):
    validate(get_recipe(name))


def test_flat_params():
    flat = get_recipe("dit-tiny").flat()
    assert flat["model.hidden"] == 256 and flat["recipe"] == "dit-tiny"
