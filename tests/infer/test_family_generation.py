"""Issue #47 item 1: inference asks the family. Every family has one Generation, picked by
``generation_of``; no module of ``vfm_core/infer`` branches on the family's ``discrete``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vfm_core.config import FAMILY_TRAITS, ConfigError, apply_overrides
from vfm_core.families import AUTOREGRESSIVE, DIFFUSION, FAMILIES
from vfm_core.infer.diffusion_generation import DiffusionGeneration
from vfm_core.infer.family_generation import GENERATIONS, generation_of
from vfm_core.infer.token_generation import TokenGeneration
from vfm_core.recipes import get_recipe

INFER = Path(__file__).resolve().parents[2] / "vfm_core" / "infer"


def test_every_family_has_one_generation():
    assert set(GENERATIONS) == set(FAMILIES.values())
    assert all(g.family is f for f, g in GENERATIONS.items())
    assert isinstance(GENERATIONS[DIFFUSION], DiffusionGeneration)
    assert isinstance(GENERATIONS[AUTOREGRESSIVE], TokenGeneration)


def test_every_family_object_is_a_row_of_the_config_table():
    """The family objects take their archs and traits from the torch-free table by name."""
    assert list(FAMILIES) == list(FAMILY_TRAITS)
    for name, f in FAMILIES.items():
        t = FAMILY_TRAITS[name]
        assert (f.name, f.archs, f.discrete) == (t.name, t.archs, t.discrete)


@pytest.mark.parametrize(
    "recipe, cls", [("dit-tiny", DiffusionGeneration), ("ar-tiny", TokenGeneration)]
)
def test_generation_of_a_config(recipe, cls):
    assert isinstance(generation_of(get_recipe(recipe)), cls)


def test_an_unknown_arch_is_a_config_error():
    cfg = apply_overrides(get_recipe("dit-tiny"), [])
    cfg.model.arch = "nope"
    with pytest.raises(ConfigError, match="model.arch 'nope'"):
        generation_of(cfg)


def test_infer_never_reads_discrete():
    reads = [
        f"{p.name}:{node.lineno}"
        for p in sorted(INFER.glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "discrete"
    ]
    assert reads == [], f"ask the family's Generation instead: {reads}"
