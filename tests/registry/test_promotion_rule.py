"""The promotion rule alone (no store): first version, no worse, worse, tolerance, missing
metrics, and a bad rule named."""

from __future__ import annotations

import pytest

from vfm_core.checkpoints.uri import RegistryError
from vfm_core.registry import PromotionRule, decide

CHAMP = {"prompt_colour_acc": 0.5, "prompt_direction_acc": 0.4, "frechet_distance": 10.0}


def test_first_version_is_promoted():
    d = decide(CHAMP, None, PromotionRule())
    assert d.promote and "first version" in d.reason


def test_no_worse_on_every_metric_is_promoted():
    cand = {"prompt_colour_acc": 0.5, "prompt_direction_acc": 0.6, "frechet_distance": 9.0}
    d = decide(cand, CHAMP, PromotionRule())
    assert d.promote
    assert d.compared["frechet_distance"] == (9.0, 10.0)


@pytest.mark.parametrize(
    "change, named",
    [
        ({"prompt_colour_acc": 0.49}, "prompt_colour_acc 0.49 vs 0.5"),
        ({"prompt_direction_acc": 0.1}, "prompt_direction_acc 0.1 vs 0.4"),
        ({"frechet_distance": 10.5}, "frechet_distance 10.5 vs 10"),
    ],
)
def test_worse_on_one_metric_is_rejected_and_named(change, named):
    d = decide({**CHAMP, **change}, CHAMP, PromotionRule())
    assert not d.promote
    assert named in d.reason and "worse than @champion" in d.reason


def test_tolerance_is_relative_slack():
    cand = {**CHAMP, "frechet_distance": 10.4}
    assert not decide(cand, CHAMP, PromotionRule()).promote
    assert decide(cand, CHAMP, PromotionRule(tolerance=0.05)).promote
    assert not decide(
        {**CHAMP, "frechet_distance": 10.6}, CHAMP, PromotionRule(tolerance=0.05)
    ).promote


def test_missing_metrics():
    # the candidate lacks one the champion has: rejected
    cand = {k: v for k, v in CHAMP.items() if k != "prompt_colour_acc"}
    d = decide(cand, CHAMP, PromotionRule())
    assert not d.promote and "prompt_colour_acc missing" in d.reason
    # the champion lacks one: not compared, said so
    champ = {"frechet_distance": 10.0}
    d = decide(CHAMP, champ, PromotionRule())
    assert d.promote and "not compared" in d.reason and "prompt_colour_acc" in d.reason


def test_configurable_metrics():
    rule = PromotionRule(higher_is_better=(), lower_is_better=("heldout_loss",))
    assert decide({"heldout_loss": 0.5}, {"heldout_loss": 0.6}, rule).promote
    assert not decide({"heldout_loss": 0.7}, {"heldout_loss": 0.6}, rule).promote


def test_bad_rule_is_one_line():
    with pytest.raises(RegistryError, match="unknown keys \\['fd'\\]"):
        PromotionRule.from_dict({"fd": 1})
    with pytest.raises(RegistryError, match="tolerance"):
        PromotionRule(tolerance=2)
    assert PromotionRule.from_dict(None) == PromotionRule()
