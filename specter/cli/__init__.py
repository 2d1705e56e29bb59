"""The `specter` command line: parse, call one library function, print. Bad input exits 2 with a one-line error.

This module runs a command and turns what stops it (a SpecterError, a signal, a file system's refusal) into one line;
`specter.cli.parser` builds the parser from `specter.cli.commands` (one module per command: its flags, its example and
what it does), `specter.cli.arguments` holds the argument types that check a flag's text and the flags several
commands share, and `specter.cli.output` how the commands word what they print."""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable, Sequence

from specter.cli.parser import build_parser
from specter.errors import SpecterError


def main(argv: Sequence[str] | None = None) -> int:
    from specter import interrupt

    interrupt.install()  # first: a Ctrl-C or SIGTERM from here on exits 130 (143) with one line, nothing left behind
    from specter.bytecode import cache_bytecode
    from specter.determinism import pin_environment

    cache_bytecode()  # before the heavy imports (torch, transformers): see its docstring
    try:
        pin_environment()  # before torch computes anything: the same bits on any AVX2 CPU (see determinism.py)
        args = build_parser().parse_args(argv)
        from specter import progress

        progress.configure(args.verbosity)  # phases and progress on stderr (see specter/progress.py)
        _outputs_are_not_inputs(args)
        func: Callable[[argparse.Namespace], int] = args.func
        stdout, sys.stdout = sys.stdout, _Named(sys.stdout, "standard output")
        try:
            return func(args)
        finally:
            sys.stdout = stdout
    except SpecterError as err:
        print(f"specter: error: {' '.join(str(err).split())}", file=sys.stderr)  # one line, whatever it quotes
        return err.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except SystemExit as exc:
        if exc.code in interrupt.TERMINATED:  # raised by the SIGTERM handler (argparse exits 0 or 2)
            print(interrupt.TERMINATED[exc.code], file=sys.stderr)
            interrupt.said()
            return exc.code  # returned, not raised: the entry point exits at once (`exit_process`), before the
            # interpreter's teardown puts the default handlers back and a second SIGTERM kills the process unheard
        raise
    except BrokenPipeError:  # the reader went away (`specter systems | head`): stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not raise again
        return 128 + 13  # SIGPIPE
    except OSError as err:
        line = _file_system_line(err)
        if line is None:
            raise
        print(f"specter: error: {line}", file=sys.stderr)
        return 1
    except MemoryError:
        print("specter: error: out of memory: the command needs more memory than this machine gives it; give smaller "
              "settings or a machine with more memory (outputs are written whole or not at all)", file=sys.stderr)
        return 1
    except Exception as err:
        if _caused_by_interrupt(err):  # e.g. transformers' lazy import wraps a Ctrl-C in a RuntimeError
            return _interrupted()
        if isinstance(err, RuntimeError) and "can't allocate memory" in str(err):  # torch's CPU allocator
            print(f"specter: error: out of memory ({' '.join(str(err).split())[:120]}); give smaller settings or a "
                  "machine with more memory (outputs are written whole or not at all)", file=sys.stderr)
            return 1
        if type(err).__name__ == "SafetensorError" and "No space left on device" in str(err):  # safetensors' writer
            print(f"specter: error: {_file_system_line(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))}",
                  file=sys.stderr)
            return 1
        raise


class _Named:
    """A stream whose write errors name it (`specter models >/dev/full` says that standard output is full)."""

    def __init__(self, stream, name: str) -> None:
        self._stream, self._name = stream, name

    def _named(self, call, *args):
        try:
            return call(*args)
        except OSError as err:
            if err.filename is not None or err.errno is None:
                raise
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), self._name) from None

    def write(self, text: str) -> int:
        return self._named(self._stream.write, text)

    def flush(self) -> None:
        return self._named(self._stream.flush)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


#: what the file system refuses, and its fix
FILE_SYSTEM_FIXES = {
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT), "free space there or write elsewhere"),
    errno.EROFS: "write elsewhere",
    **dict.fromkeys((errno.EISDIR, errno.ENOTDIR), "put the file there (a directory stands where a file should, or a "
                    "file where a directory should)"),
    **dict.fromkeys((errno.EACCES, errno.EPERM), "make it accessible or use another path"),
}


def _file_system_line(err: OSError) -> str | None:
    """One line for a file system's refusal met anywhere in a command (a full disk under an output, a cache directory
    that cannot be searched), or None for another error. Outputs are written whole or not at all, so nothing
    partial is left."""
    if err.errno not in FILE_SYSTEM_FIXES:
        return None
    where = f" ({err.filename})" if err.filename else ""
    return (f"{err.strerror or os.strerror(err.errno)}{where}; {FILE_SYSTEM_FIXES[err.errno]} and run the command "
            "again (outputs are written whole or not at all)")


#: the options a command writes to
OUTPUTS = ("out", "memo_out", "gptq_log", "figure", "html", "front")


def _outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """Refuse an output that is one of the command's inputs (`run --dataset p.jsonl --out p.jsonl` replaced the prompts
    with records), before anything is read or written."""
    for key in OUTPUTS:
        out = getattr(args, key, None)
        if not out or not os.path.exists(out):
            continue
        for name, value in vars(args).items():
            if name == key:
                continue
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(item, (str, os.PathLike)) or not item or not os.path.exists(item):
                    continue
                try:
                    same = os.path.samefile(item, out)
                except OSError:
                    continue
                if same:
                    flag = f"--{name.replace('_', '-')}" if name not in ("paths", "inputs") else "an input"
                    raise SpecterError(f"--{key.replace('_', '-')} {str(out)!r} is also {flag}: writing it would "
                                       "replace what the command reads; choose another output path")


def entry() -> None:
    """The `specter` console script: `main`, then the process ends without the interpreter's teardown (see
    `specter.interrupt.exit_process`)."""
    from specter.interrupt import exit_process

    exit_process(main())


def _interrupted() -> int:
    from specter import interrupt

    print(interrupt.INTERRUPTED, file=sys.stderr)
    interrupt.said()
    return 130


def _caused_by_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in `err`'s chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
