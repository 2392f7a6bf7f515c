"""The Prefect UI renders form descriptions as HTML: an angle bracket such as <recipe> vanishes.
Every field description of every flow's parameter model is free of them."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from flows.curate import CurateParams
from flows.generate import GenerateParams
from flows.pipeline import PipelineParams
from flows.scaling import LayoutSpec, ScalingParams
from flows.shard import ShardParams
from flows.train import TrainParams


@pytest.mark.parametrize(
    "model",
    [
        CurateParams,
        GenerateParams,
        PipelineParams,
        ScalingParams,
        LayoutSpec,
        ShardParams,
        TrainParams,
    ],
)
def test_no_angle_brackets_in_form_descriptions(model: type[BaseModel]):
    for name, field in model.model_fields.items():
        text = (field.description or "") + (model.__doc__ or "")
        assert "<" not in text, (model.__name__, name, text)
