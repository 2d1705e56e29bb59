"""How the CLI stops on Ctrl-C (SIGINT) and SIGTERM (or another of `TERMINATING`, whose default would kill it
unheard): exit 128 + the signal's number (130, 143) with one line, leaving no partial output. SIGXFSZ is ignored, so
a write past a file size limit fails as any other refused write does.

`install()` runs as the first instruction of both entry points (`python -m specter`, and `specter.cli.entry` behind
the `specter` script, through `specter.cli.main`), before any heavy import, and imports nothing heavy itself. A signal
then raises, as Python's own handler would, KeyboardInterrupt (SIGINT) or SystemExit(128 + signal), which unwinds the
command: atomic writers remove their temporaries, the GPTQ worker's process group is killed, and `specter.cli.main`
prints the line. Both entry points end through `exit_process`, past the interpreter's teardown, when the signal
handlers are no longer Python's.

Except inside an import. Libraries catch what an import raises and go on half-initialized: a Ctrl-C in torch's import
of numpy left numpy partly imported, and the next `np.dtypes` recursed until a RecursionError (4 of 16 early
interrupts), and a Ctrl-C inside torch's C++ initialization aborted the process. So a signal that arrives while any
import is under way raises nothing: the handler removes the temporaries this process has open (`specter.io`, which
every output goes through, tracks each here from its creation until it is renamed into place or removed) and ends the
process at once with the same status and line. A child process (the GPTQ worker) dies with
its parent (it asks Linux for that, see `gptq_worker.die_with_parent`).
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = "specter: interrupted; outputs are written whole or not at all, so none is partial"
#: the signals that end a command as SIGTERM does (each one's default action would kill the process without a line)
TERMINATING = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
               signal.SIGXCPU, signal.SIGVTALRM, signal.SIGPROF)
#: {the status a terminating signal ends a command with (128 + its number, as the shell reports it): its line}
TERMINATED = {128 + s: f"specter: terminated ({signal.Signals(s).name}); outputs are written whole or not at all, so "
                       "none is partial" for s in TERMINATING}
#: the temporary files and directories this process has open: what an exit at once removes
_OPEN: set = set()


def track(path) -> None:
    _OPEN.add(path)


def forget(path) -> None:
    _OPEN.discard(path)


def tracked(path) -> bool:
    return path in _OPEN


def install() -> None:
    """Handle SIGINT and the terminating signals as the module docstring says; from the main thread, before the
    heavy imports."""
    for signum in (signal.SIGINT, *TERMINATING):
        signal.signal(signum, _on_signal)
    # past a file size limit a write then fails with EFBIG, met as any other refusal of the file system (one line),
    # where SIGXFSZ's default action would kill the process without one
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def exit_process(code: int):
    """End the process with `code` once its command has returned, without the interpreter's teardown.

    Unloading torch and transformers takes about a second (1.2 s after `specter build-model tiny-olmoe` on 2 cores),
    and during it Python has already put back the default signal actions: a SIGTERM then killed the process by the
    signal (status -15) instead of exiting 143 as from anywhere else, and the second was spent on every command a
    workflow runs. Every output is written whole and closed before a command returns, so only the standard streams
    are left to flush; a signal during that flush still unwinds through the handler. For the process's entry points
    only: `specter.cli.main` itself returns, for callers in the same process."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away: what it did not read is gone either way
        pass
    os._exit(code)


_SIGNALLED: list[int] = []  # the signal the command is unwinding from, once one came
_SAID: list[bool] = []  # whether its line was printed


def said() -> None:
    """The CLI printed the line of the signal it unwound from (a second signal then ends the process silently)."""
    _SAID.append(True)


def _on_signal(signum: int, frame) -> None:
    if _SIGNALLED:  # a second signal while the first unwinds (or in the exit handlers): end now, one line in all
        _exit_now(_SIGNALLED[0], quiet=bool(_SAID))
    _SIGNALLED.append(signum)
    if _importing(frame):
        _exit_now(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + signum)  # unwinds like an exception: temporary files and directories are removed


def _importing(frame) -> bool:
    """Whether `frame` or a frame below it runs the import machinery (an import, however deep, is under way)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
            return True
        frame = frame.f_back
    return False


def _exit_now(signum: int, quiet: bool = False) -> None:
    import shutil

    for path in list(_OPEN):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if not quiet:  # not sys.stderr: the signal may have come in the middle of a print
        os.write(2, ((INTERRUPTED if signum == signal.SIGINT else TERMINATED[128 + signum]) + "\n").encode())
    os._exit(128 + signum)
