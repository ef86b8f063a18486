"""anchorlens.progress: stage lines when stderr is not a terminal, quiet for short stages and refusals."""

from __future__ import annotations

import io
import re
import time

import pytest

from anchorlens.errors import UsageError
from anchorlens.progress import stage


def test_plain_lines_start_progress_and_done_with_seconds():
    out = io.StringIO()
    with stage("capturing base", total=4, stream=out, delay_s=0, every_s=0) as s:
        s.update(2)
        s.update(2)
    lines = out.getvalue().splitlines()
    assert lines[0] == "capturing base (4 ex) ..."
    assert re.fullmatch(r"capturing base: 2/4 ex \([\d.]+ ex/s, ~[\d.]+s left\)", lines[1]), lines[1]
    assert re.fullmatch(r"capturing base: 4/4 ex \([\d.]+ ex/s\)", lines[2]), lines[2]
    assert re.fullmatch(r"capturing base: done in \d+\.\ds", lines[3]), lines[3]
    assert s.count == 4


def test_progress_lines_are_rate_limited():
    out = io.StringIO()
    with stage("scoring", total=1000, stream=out, delay_s=0, every_s=3600) as s:
        for _ in range(1000):
            s.update()
    assert len(out.getvalue().splitlines()) == 2  # start and done, no line per update


def test_short_stages_print_nothing_long_ones_announce_themselves():
    quick = io.StringIO()
    with stage("quick", stream=quick, delay_s=5):
        pass
    assert quick.getvalue() == ""
    slow = io.StringIO()
    with stage("writing figures", stream=slow, delay_s=0.05):
        time.sleep(0.3)
    lines = slow.getvalue().splitlines()
    assert lines[0] == "writing figures ..." and lines[1].startswith("writing figures: done in ")


def test_a_usage_error_ends_the_stage_silently_other_errors_say_stopped():
    out = io.StringIO()
    with pytest.raises(UsageError), stage("loading", stream=out, delay_s=0):
        raise UsageError("bad spec")
    assert out.getvalue().splitlines() == ["loading ..."]
    out = io.StringIO()
    with pytest.raises(KeyboardInterrupt), stage("training", stream=out, delay_s=0):
        raise KeyboardInterrupt
    assert out.getvalue().splitlines()[-1].startswith("training: stopped after ")


def test_disabled_stage_counts_but_prints_nothing():
    out = io.StringIO()
    with stage("x", total=3, stream=out, enabled=False, delay_s=0) as s:
        s.update(3)
    assert out.getvalue() == "" and s.count == 3


def test_progress_line_gives_rate_eta_and_rows_written():
    from anchorlens.progress import progress_line

    line = progress_line("capture", 64, 2490, 20.0, rows=1_201_920)
    assert line == "capture: 64/2490 ex (3.20 ex/s, ~12m38s left, 1,201,920 rows written)"
    assert progress_line("capture", 2490, 2490, 100.0, rows=5) == "capture: 2490/2490 ex (24.90 ex/s, 5 rows written)"
    assert progress_line("scan", 3, None, 2.0, unit="doc") == "scan: 3 doc (1.50 doc/s)"


def test_resumed_items_count_as_done_but_not_in_the_rate():
    from anchorlens.progress import progress_line

    # 96 examples read back from a killed run's shards, 32 computed in 10 s: the ETA uses 3.2 ex/s
    line = progress_line("capture", 128, 160, 10.0, resumed=96, rows=640)
    assert line == "capture: 128/160 ex (3.20 ex/s, ~10s left, 96 resumed, 640 rows written)"
    assert "time left unknown" in progress_line("capture", 96, 160, 1.0, resumed=96)


def test_stage_keeps_the_rows_and_resumed_counts_for_its_line():
    out = io.StringIO()
    s = stage("capture", total=10, stream=out, delay_s=3600, every_s=3600)
    s.update(4, rows=40, resumed=True)
    s.update(2, rows=60)
    s.update(1)  # rows unchanged
    assert (s.count, s.resumed, s.rows) == (7, 4, 60)
    assert re.fullmatch(r"capture: 7/10 ex \([\d.]+ ex/s, ~\S+ left, 4 resumed, 60 rows written\)", s.line(1.5))
    assert s.line(1.5).startswith("capture: 7/10 ex (2.00 ex/s, ~1.5s left")
    s.close()
    assert out.getvalue() == ""  # never announced: quiet
