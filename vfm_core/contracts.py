"""pandera (polars backend) schemas for every manifest that crosses a task boundary.

Manifests are polars DataFrames, stored as Parquet. The curation hand-overs, in order:

    VideoManifest   one row per readable input video (discover + probe)
    ClipSpans       one row per clip candidate (split + stitch)
    ClipManifest    one row per written H.264 clip (transcode)
    AnnotatedClips  ClipManifest + caption + filter scores (annotate/filter): `DST/clips.parquet`,
                    the hand-over to the shard writer
    Rejects         one row per input / span that was dropped, with the stage and a reason:
                    `DST/rejects.parquet`

Schemas are not strict: extra columns (e.g. a clip `embedding`) pass through. `validate(df, schema,
what=...)` raises `ContractError`, whose message names the manifest, the failing columns and checks,
and the failing row numbers (0-based), e.g.
``clips.parquet violates AnnotatedClips: table check 'end_s_gt_start_s' fails at rows [3]; ...``.
"""

from __future__ import annotations

from pathlib import Path

import pandera.errors
import pandera.polars as pa
import polars as pl

from vfm_core.errors import UserError
from vfm_core.video.choices import CLIP_AUDIO

STAGES = ("read", "probe", "split", "transcode", "annotate", "filter", "semdedup")
"""Stages that can reject an input (the `stage` column of `Rejects`)."""


class ContractError(UserError, ValueError):
    """A manifest that violates its schema: names the manifest, columns, checks and rows."""

    def __init__(self, what: str, schema: str, problems: list[str]) -> None:
        self.what, self.schema, self.problems = what, schema, problems
        super().__init__(f"{what} violates {schema}: " + "; ".join(problems))


class _Base(pa.DataFrameModel):
    class Config:
        strict = False  # extra columns are allowed (and kept)
        coerce = True  # parquet round trips may narrow ints / floats


class VideoManifest(_Base):
    """One row per input video that was read and probed."""

    video_id: str = pa.Field(unique=True, str_length={"min_value": 1})
    source_uri: str = pa.Field(unique=True, str_length={"min_value": 1})
    size_bytes: int = pa.Field(gt=0)
    duration_s: float = pa.Field(ge=0)
    fps: float = pa.Field(gt=0)
    vfr: bool
    width: int = pa.Field(gt=0)
    height: int = pa.Field(gt=0)
    codec: str
    pix_fmt: str
    rotation: int = pa.Field(isin=[0, 90, 180, 270])
    n_frames: int = pa.Field(ge=1)


class ClipSpans(_Base):
    """One row per clip candidate: frames [start_frame, end_frame) = seconds [start_s, end_s)."""

    video_id: str = pa.Field(str_length={"min_value": 1})
    source_uri: str = pa.Field(str_length={"min_value": 1})
    span_index: int = pa.Field(ge=0)
    start_frame: int = pa.Field(ge=0)
    end_frame: int = pa.Field(ge=1)
    start_s: float = pa.Field(ge=0)
    end_s: float = pa.Field(gt=0)

    # check names are the method names: pandera 0.35 loses `name=` on subclassed models
    @pa.dataframe_check
    def end_frame_gt_start_frame(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("end_frame") > pl.col("start_frame"))

    @pa.dataframe_check
    def end_s_gt_start_s(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(pl.col("end_s") > pl.col("start_s"))

    @pa.dataframe_check
    def video_id_span_index_unique(cls, data) -> pl.LazyFrame:
        return data.lazyframe.select(~pl.struct("video_id", "span_index").is_duplicated())


class ClipManifest(ClipSpans):
    """One row per written clip (H.264 MP4 at `uri`)."""

    clip_id: str = pa.Field(unique=True, str_length={"min_value": 1})
    uri: str = pa.Field(unique=True, str_length={"min_value": 1})
    width: int = pa.Field(gt=0)
    height: int = pa.Field(gt=0)
    fps: float = pa.Field(gt=0)
    n_frames: int = pa.Field(ge=1)
    duration_s: float = pa.Field(gt=0)
    audio: str | None = pa.Field(isin=list(CLIP_AUDIO), nullable=True)
    """Its sound (`vfm_core.video.choices.ClipAudio`): kept (the source's, AAC), none (the source
    has no audio stream) or dropped (``--audio drop``). Optional: manifests written before it was
    recorded lack the column (or hold null), and their clips have no sound."""


class AnnotatedClips(ClipManifest):
    """Accepted clips with caption and filter scores (`clips.parquet`, read by the shard writer)."""

    caption: str = pa.Field(nullable=False)
    """Empty exactly when ``caption_source`` is ``none``."""
    caption_source: str = pa.Field(isin=["segment", "sidecar", "vlm", "none"])
    """Where the caption came from: a sidecar segment covering > 50 % of the clip, the sidecar's
    whole-video caption, the VLM, or nothing (`vfm_core.annotate.caption`)."""
    motion: float = pa.Field(ge=0)
    static_frac: float = pa.Field(ge=0, le=1)
    black_frac: float = pa.Field(ge=0, le=1)
    blank_frac: float = pa.Field(ge=0, le=1)

    @pa.dataframe_check
    def caption_empty_iff_source_none(cls, data) -> pl.LazyFrame:
        none = pl.col("caption_source") == "none"
        return data.lazyframe.select(none == (pl.col("caption").str.strip_chars() == ""))


class Rejects(_Base):
    """One row per dropped input video or clip candidate, with the stage and a reason."""

    source_uri: str = pa.Field(str_length={"min_value": 1})
    video_id: str = pa.Field(nullable=True)
    stage: str = pa.Field(isin=list(STAGES))
    reason: str = pa.Field(str_length={"min_value": 1})
    start_s: float = pa.Field(nullable=True)
    end_s: float = pa.Field(nullable=True)


SCHEMAS: dict[str, type[_Base]] = {
    s.__name__: s for s in (VideoManifest, ClipSpans, ClipManifest, AnnotatedClips, Rejects)
}

_MAX_ROWS_SHOWN = 10


def _short(v: object, n: int = 80) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _describe(fc: pl.DataFrame, columns: set[str]) -> list[str]:
    """One line per (column, check) from pandera's failure cases, with the failing row numbers."""
    checks = fc["check"].cast(pl.String).fill_null("")
    if checks.str.starts_with("dtype(").any():  # wrong dtypes: report those alone (fix them first)
        fc = fc.filter(checks.str.starts_with("dtype("))
    out = []
    for (column, check), group in fc.group_by(["column", "check"], maintain_order=True):
        if check == "column_in_dataframe":
            out.append(f"column '{group['failure_case'][0]}' is missing")
            continue
        if check is not None and str(check).startswith("dtype("):
            out.append(f"column '{column}' has dtype {group['failure_case'][0]}, expected {check}")
            continue
        rows = sorted({int(i) for i in group["index"].to_list() if i is not None})
        shown = ", ".join(map(str, rows[:_MAX_ROWS_SHOWN]))
        more = f", ... ({len(rows)} rows)" if len(rows) > _MAX_ROWS_SHOWN else ""
        values = [_short(v) for v in group["failure_case"].to_list()[:3]]
        where = f"at rows [{shown}{more}]" if rows else "(no row index)"
        label = f"column '{column}'" if column in columns else "table"
        out.append(f"{label} check '{check}' fails {where}; values {values}")
    return out


def validate(df: pl.DataFrame, schema: type[_Base] | str, *, what: str) -> pl.DataFrame:
    """Validate `df` against `schema` (class or name); return the (coerced) frame.

    Raises `ContractError` naming `what` (e.g. "clips.parquet"), every failing column / check and
    the failing row numbers. A non-DataFrame input raises `ContractError` too.
    """
    model = SCHEMAS[schema] if isinstance(schema, str) else schema
    name = model.__name__
    if not isinstance(df, pl.DataFrame):
        raise ContractError(what, name, [f"expected a polars DataFrame, got {type(df).__name__}"])
    columns = model.to_schema().columns
    missing = [c for c, col in columns.items() if col.required and c not in df.columns]
    if missing:
        raise ContractError(what, name, [f"column '{c}' is missing" for c in missing])
    try:
        return model.validate(df, lazy=True)
    except pandera.errors.SchemaErrors as e:
        raise ContractError(what, name, _describe(e.failure_cases, set(df.columns))) from None
    except pandera.errors.SchemaError as e:
        raise ContractError(what, name, [str(e).splitlines()[0]]) from None


def empty(schema: type[_Base] | str) -> pl.DataFrame:
    """An empty frame with the schema's columns and dtypes (for manifests with no rows)."""
    model = SCHEMAS[schema] if isinstance(schema, str) else schema
    s = model.to_schema()
    return pl.DataFrame(schema={c: col.dtype.type for c, col in s.columns.items()})


def read_manifest(url: str | Path, schema: type[_Base] | str) -> pl.DataFrame:
    """Read a Parquet manifest (local path or fsspec URL) and validate it."""
    from vfm_core import storage

    with storage.open_url(str(url), "rb") as f:
        df = pl.read_parquet(f)
    return validate(df, schema, what=str(url))


def write_manifest(df: pl.DataFrame, url: str | Path, schema: type[_Base] | str) -> str:
    """Validate `df` and write it as Parquet to `url` atomically; returns the URL."""
    import io

    from vfm_core import storage

    df = validate(df, schema, what=str(url))
    buf = io.BytesIO()
    df.write_parquet(buf)
    return storage.write_bytes(str(url), buf.getvalue())
