"""Training from a weighted blend of shard datasets (``data.blend``): each step comes from the
dataset drawn from (seed, step), in proportion to the weights; a blend is the per-dataset streams
interleaved by that draw (a blend of one dataset is ``data.shards``); its state restores the same
batches (also on another data-parallel size) and refuses another blend; bad blends are one line
naming the key; a real training run logs cumulative samples per dataset."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.config import ConfigError, apply_overrides, parse_blend, validate
from vfm_core.data.blend import POSITION_STRIDE
from vfm_core.data.loader import LoaderStateError
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=16",
    "train.device=cpu",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
    "data.batch_size=2",
    "data.source=shards",
    "tracking.mlflow=false",
]
UNPACKED = ["data.latent_frames=1", "data.latent_height=4", "data.latent_width=4"]
"""One latent frame of 4 x 4: every mixed sample (images and videos) fits the bucket."""
PACKED = ["data.max_tokens=32"]
MODES = pytest.mark.parametrize("mode", [UNPACKED, PACKED], ids=["unpacked", "packed"])
NAMES = ["shards", "shards_2"]
"""Both fixture datasets are ``<root>/shards``: the second name is made unique."""


@pytest.fixture(scope="module")
def two(tmp_path_factory, mixed_shards) -> tuple[Path, Path]:
    """Two datasets of the same 12 keys with different latents (seeds 0 and 1)."""
    root = tmp_path_factory.mktemp("blend")
    return mixed_shards.write(root / "a"), mixed_shards.write(root / "b", seed=1)


def _cfg(*extra: str):
    return validate(apply_overrides(get_recipe("dit-tiny"), [*SMALL, *extra]))


def _blend(*weighted: tuple[Path, float]) -> str:
    return "data.blend=" + ",".join(f"{d}:{w}" for d, w in weighted)


def _source(*extra: str, **kw) -> ShardLatentSource:
    cfg = _cfg(*extra)
    return ShardLatentSource(cfg.data, cfg.model, **kw)


def _content(batch) -> list[tuple]:
    """(key, draw key or None, latent bytes) of every sample of a step, in order."""
    values = [z.numpy().tobytes() for z in batch.sample_values()]
    positions = batch.positions if batch.packed else [None] * batch.n_samples
    return list(zip(batch.keys, positions, values, strict=True))


def _n(batch) -> int:
    return batch.n_samples


def _one_line(exc: pytest.ExceptionInfo) -> None:
    assert "\n" not in str(exc.value), str(exc.value)


def test_bad_blends_are_one_line_errors_naming_the_key(two, tmp_path):
    a, b = two
    assert parse_blend("s3://bucket/web:0.7, /data/film:0.3") == [
        ("s3://bucket/web", 0.7),
        ("/data/film", 0.3),
    ]
    bad = [
        ([_blend((a, 0), (b, 1))], rf"data.blend: weight of {a} must be a finite .* got 0"),
        ([_blend((a, -1))], r"data.blend: weight of .* must be a finite number > 0, got -1"),
        ([f"data.blend={a}:lots"], r"data.blend: entry '.*:lots' is not DIR:WEIGHT"),
        (["data.blend=s3://bucket/x"], r"data.blend: entry 's3://bucket/x' is not DIR:WEIGHT"),
        ([_blend((a, 1), (a, 2))], rf"data.blend: {a} is listed twice"),
        ([_blend((a, 1)), f"data.shards={a}"], r"data.blend and data.shards are both set"),
        ([_blend((a, 1)), "data.source=synthetic"], r"data.blend: needs data.source='shards'"),
    ]
    for extra, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            _cfg(*extra)
        _one_line(e)

    # datasets are checked against the model when the source opens them, each one named
    def variant(name: str, edit) -> Path:
        out = tmp_path / name / "shards"
        shutil.copytree(b, out)
        doc = json.loads((out / "index.json").read_text())
        edit(doc)
        (out / "index.json").write_text(json.dumps(doc))
        return out

    wide = variant("wide", lambda d: d.update(embedding_dim=32))
    deep = variant("deep", lambda d: d["samples"][0]["latent_shape"].__setitem__(0, 8))
    other = {"model": "other-encoder", "mode": "tokens", "null": [[0.0] * 16]}
    text = variant("text", lambda d: d["meta"].update(text=other))
    (tmp_path / "empty").mkdir()
    bad = [
        (tmp_path / "missing", rf"data.blend: {tmp_path}/missing/index.json: cannot read"),
        (tmp_path / "empty", rf"data.blend: {tmp_path}/empty/index.json: cannot read"),
        (wide, rf"model.text_dim=16 but .* are 32-d \(data.blend dataset {wide}\)"),
        (
            deep,
            rf"data.blend dataset {deep}: stored latents have \[4, 8\] channels, the model "
            r"takes 4",
        ),
        (text, rf"data.blend: {text} holds captions of text encoder .*other-encoder"),
    ]
    for d, msg in bad:
        with pytest.raises(ConfigError, match=msg) as e:
            _source(*UNPACKED, _blend((a, 0.7), (d, 0.3)))
        _one_line(e)
    with pytest.raises(
        ConfigError,
        match=rf"data.max_tokens=17 is smaller .* of data.blend "
        rf"dataset {a}",
    ):
        _source("data.max_tokens=17", _blend((a, 0.7), (b, 0.3)))


def test_steps_come_from_the_datasets_in_proportion_to_the_weights(two):
    a, b = two
    src = _source(*UNPACKED, _blend((a, 0.7), (b, 0.3)))
    assert src.names == NAMES
    steps = 400
    for _ in range(steps):
        src.next_batch()
    counts = src.dataset_samples
    assert sum(counts.values()) == 2 * steps  # every step is one dataset's 2 samples
    share = counts["shards"] / (2 * steps)  # one Bernoulli(0.7) draw per step
    assert abs(share - 0.7) < 4 * math.sqrt(0.7 * 0.3 / steps), counts
    first = sum(src.blend.choice(s) == 0 for s in range(20_000)) / 20_000  # the rule alone
    assert abs(first - 0.7) < 4 * math.sqrt(0.7 * 0.3 / 20_000)


@MODES
def test_a_blend_is_the_datasets_interleaved_by_the_draw(two, mode):
    """Step s of a blend is the next step of dataset choice(s) read alone (``data.shards``), its
    packed draw keys offset by dataset; a blend of one dataset of weight 1 is ``data.shards``."""
    a, b = two
    blend = _source(*mode, _blend((a, 0.5), (b, 0.5)))
    alone = [_source(*mode, f"data.shards={d}") for d in (a, b)]
    picked = []
    for s in range(10):
        d = blend.blend.choice(s)
        picked.append(d)
        got, want = _content(blend.next_batch()), _content(alone[d].next_batch())
        if mode == PACKED:  # the same samples, draw keys of dataset d
            want = [(k, pos + d * POSITION_STRIDE, z) for k, pos, z in want]
        assert got == want, s
    assert set(picked) == {0, 1}
    one = _source(*mode, _blend((a, 1)))
    plain = _source(*mode, f"data.shards={a}")
    seen = 0
    for _ in range(6):
        batch = one.next_batch()
        seen += _n(batch)
        assert _content(batch) == _content(plain.next_batch())
    assert one.dataset_samples == {"shards": seen}


@MODES
def test_blend_state_restores_the_same_batches_and_refuses_another_blend(two, mode):
    a, b = two
    src = _source(*mode, _blend((a, 0.7), (b, 0.3)))
    for _ in range(7):
        src.next_batch()
    state = json.loads(json.dumps(src.state_dict()))  # JSON, small
    assert state["kind"] == "blend" and len(json.dumps(state)) < 4000
    counts = dict(src.dataset_samples)
    want = [_content(src.next_batch()) for _ in range(8)]
    again = _source(*mode, _blend((a, 0.7), (b, 0.3)))
    again.load_state_dict(state)
    assert again.dataset_samples == counts
    assert [_content(again.next_batch()) for _ in range(8)] == want
    assert again.dataset_samples == src.dataset_samples

    refused = [
        (
            _blend((a, 0.5), (b, 0.5)),
            r"loader state belongs to another blend \(seed/weights "
            r"0/shards:0.7,shards_2:0.3; this run seed/weights "
            r"0/shards:0.5,shards_2:0.5",
        ),
        (_blend((b, 0.7), (a, 0.3)), r"another blend .*datasets compared by content"),
        (_blend((a, 0.7), (b, 0.2), (b.parent.parent / "c", 0.1)), r"another blend"),
        (
            f"data.shards={a}",
            r"loader state is a blend of 2 datasets \(data.blend\); this run "
            r"reads one \(data.shards\)",
        ),
    ]
    shutil.copytree(a, b.parent.parent / "c", dirs_exist_ok=True)
    for other, msg in refused:
        with pytest.raises(LoaderStateError, match=msg) as e:
            _source(*mode, other).load_state_dict(state)
        _one_line(e)
    single = _source(*mode, f"data.shards={a}").state_dict()
    with pytest.raises(LoaderStateError, match=r"kind='shard_loader' is not a blend") as e:
        again.load_state_dict(single)
    _one_line(e)


def test_blend_state_restores_on_another_data_parallel_size(two):
    """Every rank draws the same dataset at a step: two ranks of 1 sample continue a one-rank run
    of 2 exactly (rank 0 then rank 1)."""
    a, b = two
    src = _source(*UNPACKED, _blend((a, 0.7), (b, 0.3)))
    for _ in range(3):
        src.next_batch()
    state = json.loads(json.dumps(src.state_dict()))
    want = [_content(src.next_batch()) for _ in range(5)]
    ranks = [
        _source(*UNPACKED, "data.batch_size=1", _blend((a, 0.7), (b, 0.3)), dp_rank=r, dp_size=2)
        for r in range(2)
    ]
    for r in ranks:
        r.load_state_dict(state)
    assert [
        _content(ranks[0].next_batch()) + _content(ranks[1].next_batch()) for _ in range(5)
    ] == want
    assert ranks[0].dataset_samples == ranks[1].dataset_samples == src.dataset_samples


@MODES
def test_training_from_a_blend_logs_samples_per_dataset_and_resumes(two, tmp_path, mode):
    """A real run (metrics.jsonl; MLflow in the packed case): cumulative samples per dataset
    sum to the samples trained on; a resume from the middle checkpoint logs the same rows."""
    a, b = two
    packed = mode == PACKED
    steps = 6
    mlflow = f"tracking.mlflow={str(packed).lower()}"
    cfg = _cfg(
        *mode,
        _blend((a, 0.6), (b, 0.4)),
        f"train.steps={steps}",
        "train.ckpt_every=3",
        mlflow,
        "tracking.experiment=test-blend",
    )
    out = tmp_path / "run"
    summary = run_training(cfg, out_dir=out, progress=False)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    replica, seen = ShardLatentSource(cfg.data, cfg.model), 0
    for row in rows:
        seen += _n(replica.next_batch())  # what the trainer trained on at this step
        counts = {k: v for k, v in row.items() if k.startswith("data/samples/")}
        assert set(counts) == {f"data/samples/{n}" for n in NAMES}
        assert sum(counts.values()) == seen and math.isfinite(row["loss"])
    assert min(counts.values()) > 0  # both datasets trained on
    if packed:
        import mlflow

        client = mlflow.MlflowClient()
        for name in NAMES:
            hist = client.get_metric_history(summary["mlflow_run_id"], f"data/samples/{name}")
            assert [m.value for m in sorted(hist, key=lambda m: m.step)] == [
                r[f"data/samples/{name}"] for r in rows
            ]
    # save -> continue -> restore: resumed at step 3, the data and the loss are the same
    middle = [c for c in CheckpointManager(out).candidates() if c.name == "step_00000003"]
    again = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, mlflow=False))
    run_training(again, out_dir=out, resume_from=middle[0], progress=False)
    resumed = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    keys = ["loss", *(f"data/samples/{n}" for n in NAMES)]
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in rows]
