"""Where a Ray curation run puts its actors: per-stage events -> pool size and busy actors.

`RayExecutor(record_events=True)` has every stage actor report a `BatchEvent` for its setup and
one per call (batch), as JSON to a zero-CPU `EventLog` actor, and adds one "actor" event per
stage actor from Ray's actor table (alive, i.e. its constructor returned, to dead: the time it
could take tasks; an actor still starting is not counted); after the run the executor's `events`
holds them all. From the events alone (no Ray needed), per stage:

    busy(t)   = #{batch events e of the stage : e.start <= t < e.end}     actors computing at t
    pool(t)   = #{actor events a of the stage : a.start <= t < a.end}     actors in its pool
    busy_s    = sum of (e.end - e.start) over its batch events             actor-seconds of work
    share     = busy_s / sum of busy_s over the stages    (cpu_share: the same with CPU seconds)

Without actor events (Ray's table is a private API and may be missing), `pool` falls back to a
lower bound: each actor from its setup to the end of its last batch (an idle actor Ray keeps is
not seen). Intervals are half-open, so an actor that ends a batch at t and starts the next at t
counts once. Times are wall-clock seconds (`time.time()`; Ray's table in ms), relative to the
first event of the run.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

EventKind = Literal["actor", "setup", "batch"]


@dataclass(kw_only=True, slots=True, frozen=True)
class BatchEvent:
    """One stage actor's life in the pool, its setup, or one call on a batch."""

    stage: str
    """Stage name (probe, split, ...)."""
    actor: str
    """Id of the actor that ran it (unique within a run)."""
    kind: EventKind = "batch"
    """`actor`: its life in Ray's actor table; `setup`: its construction and `stage.setup()`;
    `batch`: one `process` call."""
    start: float
    """Wall-clock start, seconds since the epoch."""
    end: float
    """Wall-clock end, seconds since the epoch."""
    n_in: int = 0
    """Items in."""
    n_out: int = 0
    """Items out."""
    cpu_s: float = 0.0
    """CPU seconds of the actor's process during it, all threads (FFmpeg's too); with more busy
    actors than cores a batch's wall time grows, its CPU time does not."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> BatchEvent:
        return cls(**json.loads(text))


class EventLog:
    """The side channel: stage actors append JSON events, the driver reads them after the run.

    A plain class; `RayExecutor` makes it a zero-CPU Ray actor (`ray.remote(num_cpus=0)`)."""

    def __init__(self) -> None:
        self._rows: list[str] = []

    def record(self, row: str) -> None:
        self._rows.append(row)

    def rows(self) -> list[str]:
        return list(self._rows)


Timeline = list[tuple[float, int]]
"""(t, n) steps: n intervals cover [t, next t); the last step is back to 0."""


def step_counts(intervals: Iterable[tuple[float, float]], *, t0: float = 0.0) -> Timeline:
    """How many half-open intervals [start, end) cover each time, as steps relative to `t0`."""
    deltas: dict[float, int] = {}
    for start, end in intervals:
        if end <= start:
            continue  # empty interval (clock resolution): covers nothing
        deltas[start] = deltas.get(start, 0) + 1
        deltas[end] = deltas.get(end, 0) - 1
    out: Timeline = []
    n = 0
    for t in sorted(deltas):
        if deltas[t] == 0:
            continue  # one interval ends where another starts: no change
        n += deltas[t]
        out.append((t - t0, n))
    return out


def stage_order(events: Sequence[BatchEvent]) -> list[str]:
    """Stage names in pipeline order: by their first batch (a stage's first batch needs the
    previous stage's first output), stages without a batch last."""
    first: dict[str, tuple[int, float]] = {}
    for e in events:
        key = (e.kind != "batch", e.start)
        first[e.stage] = min(first.get(e.stage, key), key)
    return sorted(first, key=first.__getitem__)


def t_origin(events: Sequence[BatchEvent]) -> float:
    return min((e.start for e in events), default=0.0)


def busy_timeline(events: Sequence[BatchEvent], *, t0: float | None = None) -> dict[str, Timeline]:
    """Per stage, the number of its actors running a batch over time."""
    t0 = t_origin(events) if t0 is None else t0
    return {
        s: step_counts(
            ((e.start, e.end) for e in events if e.stage == s and e.kind == "batch"), t0=t0
        )
        for s in stage_order(events)
    }


def actor_spans(events: Sequence[BatchEvent]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per stage, per actor: its time in the pool (the "actor" event; without one, its setup
    start to its last batch end)."""
    out: dict[str, dict[str, tuple[float, float]]] = {s: {} for s in stage_order(events)}
    table = {(e.stage, e.actor): (e.start, e.end) for e in events if e.kind == "actor"}
    for e in events:
        if (e.stage, e.actor) in table:
            out[e.stage][e.actor] = table[e.stage, e.actor]
            continue
        a, b = out[e.stage].get(e.actor, (e.start, e.end))
        out[e.stage][e.actor] = (min(a, e.start), max(b, e.end))
    return out


def pool_timeline(events: Sequence[BatchEvent], *, t0: float | None = None) -> dict[str, Timeline]:
    """Per stage, the actors in its pool over time."""
    t0 = t_origin(events) if t0 is None else t0
    return {s: step_counts(spans.values(), t0=t0) for s, spans in actor_spans(events).items()}


def ray_actor_events(stage_of_class: Mapping[str, str], *, since: float) -> list[BatchEvent]:
    """An "actor" event per Ray Data pool actor of this job started after `since` (wall clock):
    its StartTime (alive) .. EndTime (dead) in Ray's actor table (still alive: until now).
    `stage_of_class` maps the UDF class name (`MapWorker(MapBatches(<name>))`) to the stage. []
    when Ray's table is not readable (`ray._private.state` is private)."""
    import ray

    try:
        from ray._private.state import actors  # noqa: PLC2701

        table = actors()
        job = ray.get_runtime_context().get_job_id()
    except Exception:  # noqa: BLE001 - a Ray without it: pools fall back to setup..last batch
        return []
    now, out = time.time(), []
    for actor_id, a in table.items():
        m = re.fullmatch(r"MapWorker\(MapBatches\((\w+)\)\)", str(a.get("ActorClassName", "")))
        start = float(a.get("StartTime") or 0) / 1000
        if not m or m.group(1) not in stage_of_class or a.get("JobID") != job or start < since:
            continue  # another job's, another run's, or never started
        end = float(a.get("EndTime") or 0) / 1000 or now
        out.append(
            BatchEvent(
                stage=stage_of_class[m.group(1)],
                actor=str(actor_id),
                kind="actor",
                start=start,
                end=max(end, start),
            )
        )
    return out


@dataclass(kw_only=True, slots=True, frozen=True)
class StageSummary:
    """What one stage did in a run."""

    stage: str
    batches: int
    """Batch calls (items in, with batch_size 1)."""
    busy_s: float
    """Actor-seconds spent in batches."""
    cpu_s: float
    """CPU seconds spent in batches."""
    setup_s: float
    """Actor-seconds spent in setup."""
    share: float
    """busy_s / all stages' busy_s."""
    cpu_share: float
    """cpu_s / all stages' cpu_s."""
    actors: int
    """Distinct actors that ran it."""
    max_busy: int
    """Most actors running a batch at the same time."""
    max_pool: int
    """Largest pool: most actors in it at the same time."""


def summarize(events: Sequence[BatchEvent]) -> dict[str, StageSummary]:
    """Per stage (in pipeline order), busy and setup seconds, share, actor counts."""
    busy, pool, spans = busy_timeline(events), pool_timeline(events), actor_spans(events)
    batches = [e for e in events if e.kind == "batch"]
    total = sum(e.end - e.start for e in batches) or 1.0
    total_cpu = sum(e.cpu_s for e in batches) or 1.0
    out = {}
    for s in stage_order(events):
        mine = [e for e in events if e.stage == s]
        b = sum(e.end - e.start for e in mine if e.kind == "batch")
        c = sum(e.cpu_s for e in mine if e.kind == "batch")
        out[s] = StageSummary(
            stage=s,
            batches=sum(e.kind == "batch" for e in mine),
            busy_s=b,
            cpu_s=c,
            setup_s=sum(e.end - e.start for e in mine if e.kind == "setup"),
            share=b / total,
            cpu_share=c / total_cpu,
            actors=len(spans[s]),
            max_busy=max((n for _, n in busy[s]), default=0),
            max_pool=max((n for _, n in pool[s]), default=0),
        )
    return out
