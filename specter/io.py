"""Writing outputs atomically: a unique temporary file beside the target, renamed over it when complete.

A reader (or a later run) therefore sees either the old file or the whole new one, never a partial write, and a killed
writer leaves only its temporary file, whose name starts with a dot and ends in `.tmp`. The temporary name comes from
`tempfile` in the target's own directory (so the rename stays on one file system and a predictable name cannot be
planted as a symlink).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda f: f.write(text))
