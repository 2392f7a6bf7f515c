"""vfm_core.progress: one line per ``every_s`` seconds at most and one at the end, through
logging; the flows' Prefect logging names the library's logger."""

from __future__ import annotations

import io
import logging
import sys
import types

import pytest

from vfm_core import infra_env
from vfm_core.progress import MediaProgress, Progress, format_duration


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "vfm_core.progress"]


def test_lines_are_rate_limited_and_the_end_is_logged(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="vfm_core")
    with Progress(100, desc="work", unit="clip", every_s=10, clock=clock) as bar:
        for _ in range(99):
            clock.t += 0.5  # 2 units a second: a line at 10 s, 20 s, ... (not one per unit)
            bar.update()
    lines = _lines(caplog)
    assert len(lines) == 4 + 1, lines  # 10, 20, 30, 40 s, then the end (49.5 s)
    assert lines[0] == "work: 20/100 clips (20%), 10 s, 2 clip/s, about 40 s left"
    assert lines[-1].startswith("work: 99/100 clips (99%), 50 s, 2 clip/s")


def test_the_last_unit_logs_once_at_once(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="vfm_core")
    bar = Progress(3, desc="steps", unit="step", every_s=10, clock=clock)
    clock.t = 1.0
    bar.update(2, note="loss 0.5")
    assert _lines(caplog) == []  # 1 s < 10 s
    clock.t = 2.0
    bar.update(note="loss 0.25")
    bar.close()
    assert _lines(caplog) == ["steps: 3/3 steps (100%), 2 s, 1.5 step/s, about 0 s left, loss 0.25"]


def test_delay_keeps_a_short_loop_quiet(caplog):
    clock = Clock()
    caplog.set_level(logging.INFO, logger="vfm_core")
    with Progress(5, desc="short", delay_s=3, every_s=1, clock=clock) as bar:
        for _ in range(5):
            clock.t += 0.5
            bar.update()
    assert _lines(caplog) == []
    with Progress(None, desc="open-ended", unit="batch", delay_s=3, every_s=1, clock=clock) as bar:
        for _ in range(10):
            clock.t += 0.5
            bar.update()
    assert _lines(caplog)[-1] == "open-ended: 10 batches, 5 s, 2 batch/s"


def test_every_s_from_the_environment_and_disabled(monkeypatch, caplog):
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0.5")
    assert Progress(4, desc="x").every == 0.5
    for bad in ("abc", "-1", "inf"):  # was ignored without a word
        monkeypatch.setenv("VFM_PROGRESS_EVERY_S", bad)
        with pytest.warns(UserWarning, match=f"VFM_PROGRESS_EVERY_S='{bad}': expected seconds"):
            assert Progress(4, desc="x").every == 10.0
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0.5")
    caplog.set_level(logging.INFO, logger="vfm_core")
    with Progress(4, desc="off", enabled=False) as bar:
        bar.update(4)
    assert _lines(caplog) == []


def test_file_sink_and_named_logger(caplog):
    clock = Clock()
    out = io.StringIO()
    with Progress(2, desc="gen", unit="call", file=out, clock=clock) as bar:
        clock.t = 4
        bar.update(2)
    assert out.getvalue() == "gen: 2/2 calls (100%), 4 s, 0.5 call/s, about 0 s left\n"
    caplog.set_level(logging.INFO, logger="vfm_core")
    with Progress(1, desc="mine", logger=logging.getLogger("vfm_core.data.x")) as bar:
        bar.update()
    assert [r.name for r in caplog.records] == ["vfm_core.data.x"]


@pytest.mark.parametrize(
    "s, text", [(0.4, "0 s"), (59, "59 s"), (200, "3 min 20 s"), (7500, "2 h 05 min")]
)
def test_format_duration(s, text):
    assert format_duration(s) == text


def test_prefect_logs_library_keeps_the_users_loggers(monkeypatch):
    monkeypatch.setenv(infra_env.EXTRA_LOGGERS, "mylib, other")
    infra_env.prefect_logs_library()
    assert infra_env.os.environ[infra_env.EXTRA_LOGGERS] == "mylib,other,vfm_core"
    infra_env.prefect_logs_library()  # once
    assert infra_env.os.environ[infra_env.EXTRA_LOGGERS] == "mylib,other,vfm_core"
    assert logging.getLogger("vfm_core").getEffectiveLevel() <= logging.INFO


def test_prefect_imported_first_gets_its_api_handler_on_the_library(monkeypatch):
    """A worker's flow-run process imports prefect before the flows package: the handler that
    prefect's setup_logging gives its extra loggers is attached afterwards, once."""
    if "prefect" not in sys.modules:
        monkeypatch.setitem(sys.modules, "prefect", types.ModuleType("prefect"))
    monkeypatch.delenv(infra_env.EXTRA_LOGGERS, raising=False)
    lib = logging.getLogger("vfm_core")
    api = logging.Handler()
    extra = logging.getLogger("prefect.extra")
    monkeypatch.setattr(extra, "handlers", [api])
    monkeypatch.setattr(lib, "handlers", [])
    infra_env.prefect_logs_library()
    infra_env.prefect_logs_library()
    assert lib.handlers == [api]


def test_training_lines_say_the_time_spent_and_left(capsys):
    from vfm_core.train.metrics import ConsoleLogger

    log = ConsoleLogger(40, initial=20, bar=False)  # a resumed run: its rate from step 20 on
    m = {"loss": 0.5, "tokens_per_s": 100.0, "tflops": 0.001, "mfu": 0.01}
    for step in range(21, 41):
        log.log(step, m)
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split()[1] for ln in lines] == [
        f"{s}/40" for s in (22, 24, 26, 28, 30, 32, 34, 36, 38, 40)
    ]
    assert lines[0].endswith(" left") and ", about " in lines[0]
    assert lines[-1].endswith("0 s, about 0 s left")


def test_media_progress_says_seconds_rate_and_time_left_at_a_steady_rate():
    """A 193 s video decoded at 3x realtime, one call per frame: a line every 10 s of wall
    time (not per frame), none before the first interval, one at the end."""
    clock, out = Clock(), io.StringIO()
    with MediaProgress(193.0, desc="split long.mp4", every_s=10, clock=clock, file=out) as bar:
        for i in range(193 * 25):
            clock.t = i / 25 / 3
            bar.at(i / 25)
            bar.at(i / 25 - 1.0)  # an earlier position (a second decode of a span) is ignored
    lines = out.getvalue().splitlines()
    assert len(lines) == 6 + 1, lines  # 10, 20, ..., 60 s, then the end (64.3 s)
    assert lines[0] == "split long.mp4: 30/193 s of video (16%), 10 s, 3x realtime, about 54 s left"
    assert lines[-1].startswith("split long.mp4: 193/193 s of video (100%), 1 min 04 s, 3x")


def test_media_progress_quiet_for_a_short_video_and_from_a_start():
    clock, out = Clock(), io.StringIO()
    with MediaProgress(60.0, desc="short", every_s=10, clock=clock, file=out) as bar:  # delay
        for i in range(30):
            clock.t = i * 0.3  # 9 s in all: nothing shown
            bar.at(i * 2.0)
    assert out.getvalue() == ""  # delay_s defaults to every_s
    with MediaProgress(100.0, desc="tail", start_s=50.0, every_s=1, clock=clock, file=out) as bar:
        clock.t += 5.0
        bar.at(60.0)  # 10 s of video in 5 s since the first position, 50 s: 40 s left at 2x
    assert out.getvalue().splitlines() == [
        "tail: 60/100 s of video (60%), 5 s, 2x realtime, about 20 s left"
    ]
