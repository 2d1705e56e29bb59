"""Progress of long steps: phases with elapsed time, loops with a count and an ETA; plain lines where stderr is not a
terminal; nothing under --quiet."""

from __future__ import annotations

import io
import logging
import re

import pytest

from specter import progress


@pytest.fixture
def captured(monkeypatch):
    monkeypatch.setenv("SPECTER_PROGRESS_SECONDS", "0")  # a line at every step
    stream = io.StringIO()
    yield stream
    progress.log.handlers[:] = []
    progress.log.setLevel(logging.NOTSET)


def test_plain_lines_with_phases_counts_and_eta(captured):
    progress.configure(progress.NORMAL, captured)
    with progress.phase("fitting"):
        assert list(progress.steps(range(4), "layers", unit="layer")) == [0, 1, 2, 3]
    text = captured.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert all(re.match(r"specter \[ *\d+\.\d s\] ", line) for line in lines), lines
    assert lines[0].endswith("fitting ...") and re.search(r"fitting: done in \d+\.\d s$", lines[-1])
    assert any(re.search(r"layers: 2/4 \(50%\), [0-9.]+ s elapsed, ETA [0-9.]+ s$", line) for line in lines), lines
    assert re.search(r"layers: 4 layers done in", text)


def test_a_loop_left_early_says_where_it_stopped(captured):
    progress.configure(progress.NORMAL, captured)
    for i in progress.steps(range(10), "prompts", unit="prompt"):
        if i == 2:
            break
    assert "prompts: stopped at 2/10 after" in captured.getvalue()


def test_quiet_shows_warnings_only(captured):
    progress.configure(progress.QUIET, captured)
    with progress.phase("fitting"):
        list(progress.steps(range(3), "layers"))
    progress.log.warning("skipped: naive does not fit")
    assert captured.getvalue().splitlines() == [captured.getvalue().splitlines()[-1]]
    assert "skipped: naive does not fit" in captured.getvalue()


def test_verbose_shows_debug_lines(captured):
    progress.configure(progress.VERBOSE, captured)
    progress.log.debug("a detail")
    assert "a detail" in captured.getvalue()


def test_a_library_call_without_the_cli_prints_no_progress(capsys):
    """Without `configure` (the suite used as a library, or in tests) loops run silently."""
    assert list(progress.steps(range(3), "layers")) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_fmt_seconds():
    assert progress.fmt_seconds(12.34) == "12.3 s"
    assert progress.fmt_seconds(245) == "4 min 05 s"
    assert progress.fmt_seconds(3725) == "1 h 02 min"


def test_the_default_stream_is_stderr_as_it_is_at_each_line(monkeypatch):
    """configure() without a stream writes to whatever sys.stderr is when a line is logged: a stream closed since (a
    finished test's capture) is never written to."""
    try:
        first = io.StringIO()
        monkeypatch.setattr("sys.stderr", first)
        progress.configure(progress.NORMAL)
        first.close()
        second = io.StringIO()
        monkeypatch.setattr("sys.stderr", second)
        with progress.phase("fitting"):
            list(progress.steps(range(2), "layers"))
        assert "fitting: done in" in second.getvalue()
    finally:
        progress.log.handlers[:] = []
        progress.log.setLevel(logging.NOTSET)
