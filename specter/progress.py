"""What a long command is doing: phases with their elapsed time, and loops with a count and an ETA.

Everything goes through the `specter` logger to stderr, so `--quiet` (warnings and errors only) and `--verbose` (debug
lines too) work through `logging`. On a terminal a loop is a tqdm bar (elapsed, ETA, rate); where stderr is not a
terminal (a Snakemake log, a SLURM job's output, a pipe) it is a plain line when the loop starts, at most every
`SPECTER_PROGRESS_SECONDS` seconds (default 10) after, and when it ends: no carriage returns in the log. Lines carry
the seconds since the command started:

    specter [  41.2 s] moefy layers: 12/30 (40%), 28.1 s elapsed, ETA 42 s
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

log = logging.getLogger("specter")
QUIET, NORMAL, VERBOSE = -1, 0, 1


_WALL_START = time.time()  # the command's start (configure resets it)


class _Elapsed(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"specter [{record.created - _WALL_START:7.1f} s] {record.getMessage()}"


class _Stderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when a line is written (a test's capture, or a redirected stream, may
    replace it after `configure`)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


def configure(verbosity: int = NORMAL, stream=None) -> None:
    """Send the suite's progress and messages to `stream` (default: stderr, as it is at each line): QUIET shows
    warnings only, VERBOSE debug lines."""
    global _WALL_START
    _WALL_START = time.time()
    handler = logging.StreamHandler(stream) if stream is not None else _Stderr()
    handler.setFormatter(_Elapsed())
    log.handlers[:] = [handler]
    log.propagate = False
    log.setLevel({QUIET: logging.WARNING, NORMAL: logging.INFO, VERBOSE: logging.DEBUG}[verbosity])


def enabled() -> bool:
    return log.isEnabledFor(logging.INFO)


def fmt_seconds(seconds: float) -> str:
    """12.3 s, 4 min 05 s, 1 h 02 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


@contextmanager
def phase(name: str) -> Iterator[None]:
    """A step of a command: a line when it starts, and one with its duration when it ends."""
    started = time.monotonic()
    log.info("%s ...", name)
    yield
    log.info("%s: done in %s", name, fmt_seconds(time.monotonic() - started))


def _is_terminal(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _plural(unit: str, n: int) -> str:
    return unit if n == 1 else unit + "s"


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get("SPECTER_PROGRESS_SECONDS", "10")))
    except ValueError:
        return 10.0


class Progress:
    """A loop of `total` steps (None: unknown) that is advanced by hand: `update(n)`, then `close()`."""

    def __init__(self, desc: str, total: int | None, unit: str = "step"):
        self.desc, self.total, self.unit, self.done = desc, total, unit, 0
        self.started = self._last = time.monotonic()
        self._bar = None
        if not enabled():
            return
        handler_stream = getattr(log.handlers[0], "stream", None) if log.handlers else None
        if _is_terminal(handler_stream):
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit, file=handler_stream, dynamic_ncols=True)
        else:
            log.info("%s: %s", desc, f"0/{total} {_plural(unit, total)}" if total is not None else "started")

    def update(self, n: int = 1) -> None:
        if n <= 0:
            return
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if enabled() and now - self._last >= _interval() and (self.total is None or self.done < self.total):
            self._last = now
            log.info("%s", self._line(now))

    def _line(self, now: float) -> str:
        elapsed = now - self.started
        if not self.total:
            return f"{self.desc}: {self.done} {_plural(self.unit, self.done)}, {fmt_seconds(elapsed)} elapsed"
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        return (f"{self.desc}: {self.done}/{self.total} ({self.done / self.total:.0%}), {fmt_seconds(elapsed)} "
                f"elapsed" + (f", ETA {fmt_seconds(eta)}" if eta is not None else ""))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif enabled():
            took = fmt_seconds(time.monotonic() - self.started)
            if self.total is None or self.done >= self.total:
                log.info("%s: %s %s done in %s", self.desc, self.done, _plural(self.unit, self.done), took)
            else:
                log.info("%s: stopped at %s/%s after %s", self.desc, self.done, self.total, took)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def steps(items: Iterable, desc: str, total: int | None = None, unit: str = "step") -> Iterator:
    """Iterate `items`, showing the loop's progress (see the module docstring)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    with Progress(desc, total, unit) as bar:
        for item in items:
            yield item
            bar.update()
