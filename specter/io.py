"""Writing outputs atomically: a unique temporary file (or directory) beside the target, renamed over it when complete.

A reader (or a later run) therefore sees either the old file or the whole new one, never a partial write, and a killed
writer leaves only its temporary file, whose name starts with a dot and ends in `.tmp`. The temporary name comes from
`tempfile` in the target's own directory (so the rename stays on one file system and a predictable name cannot be
planted as a symlink).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def atomic_write(path: str | Path, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Call `write(f)` on a temporary file beside `path`, then rename it to `path`; returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; outputs get the usual permissions
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _usual_permissions(root: Path) -> None:
    """Give every file under `root` the permissions the umask gives a new file (safetensors' `save_file`, which
    writes models and drafts, makes its files private: readable by their owner alone, unreadable on a shared
    cluster)."""
    mode = 0o666 & ~_umask()
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            os.chmod(path, mode)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text))


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temporary sibling directory to fill; renamed to `path` when the block completes, removed if it fails or is
    killed by a signal that Python sees. A directory already at `path` is replaced only once the new one is complete,
    so a killed build never leaves anything that looks done."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes the directory private; outputs get the usual permissions
        yield tmp
        _usual_permissions(tmp)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / path.name)
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def writable_problem(path: str | Path, directory: bool = False) -> str | None:
    """Why `path` cannot be written as a file (or, with `directory`, made a directory), or None if it can: its nearest
    existing ancestor must be a directory we may write in, and the path itself must not be the other kind."""
    path = Path(path)
    if path.exists():
        if directory and not path.is_dir():
            return f"{str(path)!r} exists and is not a directory"
        if not directory and path.is_dir():
            return f"{str(path)!r} is a directory, not a file"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{str(ancestor)!r} is not a directory, so {str(path)!r} cannot be made under it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot write in {str(ancestor)!r} (permission denied)"
    return None


def cache_root() -> Path | None:
    """Where the suite keeps what it can recompute (the converted GGUF, file hashes): `$SPECTER_CACHE_DIR`, default
    `$XDG_CACHE_HOME/specter`, else `~/.cache/specter`; None when `SPECTER_CACHE_DIR` is set empty (no cache)."""
    root = os.environ.get("SPECTER_CACHE_DIR")
    if root == "":
        return None
    if root is None:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specter")
    return Path(root)


def cache_bytecode() -> None:
    """Let this process keep the bytecode it compiles, in the suite's cache (`cache_root()/pycache`), where the
    environment forbids writing it beside the sources (`PYTHONDONTWRITEBYTECODE`) and names no other place for it
    (`PYTHONPYCACHEPREFIX`). Call first in an entry point, before the heavy imports.

    Without it, on such a machine with a `pip install --no-compile` environment, every process compiles torch's,
    transformers' and the suite's modules from source again: measured, a replayed sweep took 21 to 24 s of which about
    11 s was compiling, and the default workflow starts about fifty processes. Nothing is written beside the sources;
    with no cache (`SPECTER_CACHE_DIR` set empty) this does nothing."""
    if not sys.dont_write_bytecode or sys.pycache_prefix is not None:
        return
    try:
        root = cache_root()
    except RuntimeError:  # no home directory to find the default cache in: compile as before, never fail here
        return
    if root is None:
        return
    sys.pycache_prefix = str((root / "pycache").absolute())  # absolute: the GPTQ worker runs in a temporary cwd
    sys.dont_write_bytecode = False

