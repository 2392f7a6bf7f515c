import polars as pl
import pytest

from vfm_core.contracts import (
    AnnotatedClips,
    ClipManifest,
    ClipSpans,
    ContractError,
    Rejects,
    empty,
    read_manifest,
    validate,
    write_manifest,
)


def _spans() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "video_id": ["a", "a", "b"],
            "source_uri": ["/v/a.mp4", "/v/a.mp4", "/v/b.mp4"],
            "span_index": [0, 1, 0],
            "start_frame": [0, 10, 5],
            "end_frame": [10, 20, 9],
            "start_s": [0.0, 1.0, 0.5],
            "end_s": [1.0, 2.0, 0.9],
        }
    )


def test_valid_frame_passes_and_keeps_extra_columns():
    df = _spans().with_columns(pl.lit(1).alias("extra"))
    out = validate(df, ClipSpans, what="spans.parquet")
    assert out.columns == df.columns and out.height == 3


def test_violation_names_manifest_column_and_rows():
    df = _spans().with_columns(
        pl.Series("end_frame", [10, 5, 9]), pl.Series("start_s", [0.0, 1.0, -0.5])
    )
    with pytest.raises(ContractError) as e:
        validate(df, ClipSpans, what="spans.parquet")
    msg = str(e.value)
    assert msg.startswith("spans.parquet violates ClipSpans")
    assert "'end_frame_gt_start_frame' fails at rows [1]" in msg
    assert "column 'start_s'" in msg and "rows [2]" in msg


def test_missing_column_and_wrong_dtype():
    with pytest.raises(ContractError, match="column 'end_s' is missing"):
        validate(_spans().drop("end_s"), "ClipSpans", what="x")
    with pytest.raises(ContractError, match="column 'start_s' has dtype String"):
        validate(_spans().with_columns(pl.lit("q").alias("start_s")), "ClipSpans", what="x")
    with pytest.raises(ContractError, match="expected a polars DataFrame"):
        validate({"a": 1}, "ClipSpans", what="x")  # type: ignore[arg-type]


def test_duplicates_and_enums():
    dup = pl.concat([_spans(), _spans().head(1)])
    with pytest.raises(ContractError, match=r"'video_id_span_index_unique' fails at rows \[0, 3\]"):
        validate(dup, ClipSpans, what="x")
    rej = pl.DataFrame(
        {
            "source_uri": ["a", "b"],
            "video_id": [None, "v"],
            "stage": ["probe", "bogus"],
            "reason": ["empty file", ""],
            "start_s": [None, 1.0],
            "end_s": [None, 2.0],
        }
    )
    with pytest.raises(ContractError) as e:
        validate(rej, Rejects, what="rejects.parquet")
    assert "column 'stage'" in str(e.value) and "column 'reason'" in str(e.value)


def test_empty_and_parquet_roundtrip(tmp_path):
    assert empty(AnnotatedClips).height == 0
    validate(empty(AnnotatedClips), AnnotatedClips, what="empty")
    url = write_manifest(_spans(), tmp_path / "m" / "spans.parquet", ClipSpans)
    back = read_manifest(url, ClipSpans)
    assert back.equals(_spans())
    bad = tmp_path / "bad.parquet"
    _spans().drop("video_id").write_parquet(bad)
    with pytest.raises(ContractError, match=f"{bad} violates ClipSpans: column 'video_id'"):
        read_manifest(bad, ClipSpans)


def test_clip_audio_is_optional_and_checked():
    """Manifests from before clips recorded their sound load (no column, or nulls); a value
    outside kept / none / dropped is named."""
    clips = _spans().with_columns(
        clip_id=pl.Series(["c0", "c1", "c2"]),
        uri=pl.Series(["c0.mp4", "c1.mp4", "c2.mp4"]),
        width=pl.lit(64),
        height=pl.lit(48),
        fps=pl.lit(24.0),
        n_frames=pl.lit(24),
        duration_s=pl.lit(1.0),
    )
    validate(clips, ClipManifest, what="old")
    validate(clips.with_columns(audio=pl.Series(["kept", None, "none"])), ClipManifest, what="x")
    bad = clips.with_columns(audio=pl.Series(["kept", "dropped", "muted"]))
    with pytest.raises(ContractError, match=r"column 'audio' check 'isin.* fails at rows \[2\]"):
        validate(bad, ClipManifest, what="x")
