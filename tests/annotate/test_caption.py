import json

import numpy as np
import pytest

from vfm_core.annotate.caption import (
    Caption,
    Captioner,
    ChainCaptioner,
    SidecarCaptioner,
    VLMCaptioner,
)

FRAMES = np.random.default_rng(0).integers(0, 255, (6, 36, 64, 3), dtype=np.uint8)


def _cap(c: Captioner, uri: str, a: float = 0.0, b: float = 2.0) -> Caption | None:
    return c.caption(source_uri=uri, start_s=a, end_s=b, frames=FRAMES)


def test_sidecar_txt_and_json(tmp_path):
    (tmp_path / "a.txt").write_text("  a red circle\n")
    (tmp_path / "b.json").write_text(
        json.dumps(
            {
                "caption": "whole video",
                "segments": [
                    {"start_s": 0, "end_s": 5, "caption": "first shot"},
                    {"start_s": 5, "end_s": 9, "caption": "second shot"},
                ],
            }
        )
    )
    (tmp_path / "c.json").write_text("[1, 2]")
    (tmp_path / "d.json").write_text("{not json")
    s = SidecarCaptioner()
    assert isinstance(s, Captioner)
    assert _cap(s, str(tmp_path / "a.mp4")) == Caption(text="a red circle", source="sidecar")
    assert _cap(s, str(tmp_path / "b.mp4"), 4.0, 8.0).text == "second shot"
    assert _cap(s, str(tmp_path / "b.mp4"), 20.0, 22.0).text == "whole video"
    assert _cap(s, str(tmp_path / "none.mp4")) is None
    with pytest.raises(ValueError, match=r"c\.json: expected a JSON object"):
        _cap(s, str(tmp_path / "c.mp4"))
    with pytest.raises(ValueError, match=r"d\.json: invalid JSON"):
        _cap(s, str(tmp_path / "d.mp4"))


def test_vlm_captioner_tiny_random_model(tiny_vlm, tmp_path):
    vlm = VLMCaptioner(tiny_vlm, max_new_tokens=6)
    vlm.setup()
    a = _cap(vlm, "x.mp4")
    b = _cap(vlm, "x.mp4")
    assert a is not None and a.source == "vlm" and a.text
    assert a == b  # greedy decoding is deterministic
    # every generated word comes from the tiny vocabulary
    from tests.annotate.conftest import WORDS

    assert set(a.text.split()) <= set(WORDS) | {"[UNK]"}
    (tmp_path / "v.txt").write_text("from the sidecar")
    chain = ChainCaptioner(SidecarCaptioner(), vlm)
    assert _cap(chain, str(tmp_path / "v.mp4")).source == "sidecar"
    assert _cap(chain, str(tmp_path / "w.mp4")).source == "vlm"


def test_vlm_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="VLMCaptioner: model directory"):
        VLMCaptioner(tmp_path / "nope")
