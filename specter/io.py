"""Writing outputs atomically: a unique temporary file (or directory) beside the target, renamed over it when complete.

A reader (or a later run) therefore sees either the old file or the whole new one, never a partial write. The
temporary name comes from `tempfile` in the target's own directory (so the rename stays on one file system and a
predictable name cannot be planted as a symlink), as `.NAME.HOST-PID.RANDOM.tmp` (`.old` for a replaced directory on
its way out): hidden, and naming the process that made it.

Temporaries go away on every exit Python sees: an error or a signal unwinds through the writer, which removes its
own; a signal during an import ends the process at once after removing those it tracks (`specter.interrupt`). Only a
SIGKILL (or a power cut) leaves one behind, and the next writer into the same directory removes it: a temporary of
this host whose process is gone (`sweep_stale`). Nothing else there is touched.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from specter import interrupt

#: a temporary's name: `.NAME.HOST-PID.RANDOM.tmp` or `.old` (RANDOM from tempfile's alphabet: no dots)
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>[0-9]+)\.[a-z0-9_]+\.(?:tmp|old)")


class KeyTwice(ValueError):
    """A JSON object that gives one key twice (`json.loads` keeps the last value without a word)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} is given twice in one object")
        self.key = key


def _unique(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise KeyTwice(key)
        out[key] = value
    return out


def json_strict(text: str | bytes):
    """`json.loads`, refusing an object that gives a key twice (`KeyTwice`, a ValueError)."""
    return json.loads(text, object_pairs_hook=_unique)


_PLAIN = {"tag:yaml.org,2002:int": r"[-+]?(0|[1-9][0-9]*)",
          "tag:yaml.org,2002:float": r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?"
                                     r"|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"}


def plain_numbers(loader: type, refuse=None) -> None:
    """Make `loader` (a SafeLoader subclass) take a number only as plain decimal text: YAML 1.1 also reads `1:30` as
    90 (base 60), `1_6` as 16, `0x41` as 65 and `010` as 8, without a word. `refuse(node, text)` raises the caller's
    error for any other form (by default YAML's own ConstructorError, naming the value and its place)."""
    import re

    import yaml

    def constructor_error(node, text) -> None:
        raise yaml.constructor.ConstructorError(problem=f"{text!r:.40} is a number YAML 1.1 reads in another base or "
                                                "with separators; write it as a plain decimal",
                                                problem_mark=node.start_mark)

    refuse = refuse or constructor_error
    for tag, pattern in _PLAIN.items():
        base = loader.yaml_constructors[tag]

        def construct(self, node, base=base, pattern=re.compile(pattern)):
            if not pattern.fullmatch(node.value):
                refuse(node, node.value)
            return base(self, node)

        loader.add_constructor(tag, construct)
    assert issubclass(loader, yaml.SafeLoader)


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:64] or "host"


def _new(path: Path, directory: bool = False, suffix: str = ".tmp") -> tuple[int | None, Path]:
    """A new temporary beside `path` (a file, open: its descriptor; or a directory), tracked by `specter.interrupt`;
    stale temporaries in the same directory are removed first."""
    sweep_stale(path.parent)
    prefix = f".{path.name}.{_host()}-{os.getpid()}."
    if directory:
        fd, tmp = None, tempfile.mkdtemp(dir=path.parent, prefix=prefix, suffix=suffix)
    else:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    interrupt.track(Path(tmp))
    return fd, Path(tmp)


def _remove(tmp: Path) -> None:
    """Remove a temporary (file or directory, whatever is left of it) and forget it."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)
    interrupt.forget(tmp)


def sweep_stale(directory: str | Path) -> list[Path]:
    """Remove what killed writers left in `directory`: the suite's temporaries (named as `_TEMPORARY` says) made on
    this host by a process that no longer runs (or by an earlier process with this one's pid). A temporary of a live
    process, of another host (a shared file system), or any other file is left alone. Returns what it removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    host = _host()
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry.name)
        if m is None or m["host"] != host:
            continue
        path, pid = Path(entry.path), int(m["pid"])
        if (pid == os.getpid() and interrupt.tracked(path)) or (pid != os.getpid() and _alive(pid)):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(path)
            else:
                path.unlink()
        except OSError:  # not ours to remove after all (permissions): a sweep never fails a command
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextmanager
def temporary(beside: str | Path, directory: bool = False) -> Iterator[Path]:
    """A new empty temporary file (or directory) beside `beside`, named as the writers' are, removed when the block
    ends, whatever happens (a caller that wants to keep it renames it first)."""
    Path(beside).parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new(Path(beside), directory)
    if fd is not None:
        os.close(fd)
    try:
        yield tmp
    finally:
        _remove(tmp)


def publish(tmp: Path, path: str | Path) -> Path:
    """Rename a temporary file from `temporary()` to `path` (beside it), with the permissions the umask gives."""
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private
    os.replace(tmp, path)
    interrupt.forget(tmp)
    return Path(path)


def atomic_write(path: str | Path, write: Callable[[IO], None], binary: bool = False) -> Path:
    """Call `write(f)` on a temporary file beside `path`, then rename it to `path`; returns `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new(path)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; outputs get the usual permissions
        with os.fdopen(fd, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8", "newline": ""})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        if err.filename is None and err.errno is not None:  # a full disk names no file: name the output
            raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err
        raise
    finally:
        _remove(tmp)  # after the rename there is nothing left to remove
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
    _, tmp = _new(path, directory=True)
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes the directory private; outputs get the usual permissions
        try:
            yield tmp
        except OSError as err:
            if err.filename is None and err.errno is not None:  # a full disk names no file: name the output
                raise OSError(err.errno, err.strerror or os.strerror(err.errno), str(path)) from err
            raise
        except Exception as err:  # safetensors' writer reports a full disk as its own error, in words
            if type(err).__name__ == "SafetensorError" and "No space left on device" in str(err):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
            raise
        _usual_permissions(tmp)
        if path.exists():
            _, old = _new(path, directory=True, suffix=".old")
            try:
                os.replace(path, old / path.name)
                try:
                    os.replace(tmp, path)
                except BaseException:
                    os.replace(old / path.name, path)  # the previous one back in place
                    raise
            finally:
                if path.exists() or not (old / path.name).exists():
                    _remove(old)
                else:  # neither in place nor back: keep the previous one where it is, never remove it
                    interrupt.forget(old)
        else:
            os.replace(tmp, path)
    finally:
        _remove(tmp)


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
        read_only = os.statvfs(ancestor).f_flag & os.ST_RDONLY
        return f"cannot write in {str(ancestor)!r} ({'a read-only file system' if read_only else 'permission denied'})"
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


def not_a_file(path: str | Path) -> str | None:
    """Why `path` is no regular file to read ("does not exist", or what stands there instead), or None where it is
    one."""
    path = Path(path)
    if path.is_file():
        return None
    return "is not a regular file (a directory, a pipe or a device)" if path.exists() else "does not exist"


def read_at_most(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, reading no more than `limit` + 1 of them: a longer file (a sparse file of
    gigabytes where a few hundred bytes belong) raises ValueError naming it and the limit."""
    with Path(path).open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"{path} is larger than the {limit} bytes a file of its kind holds")
    return data


def files_sha256(paths) -> str:
    """sha256 over each file's name and bytes, in the order given. Kept in the cache (`specter.io.cache_root`) under
    the files' paths, sizes, inodes and modification and change times (a model's weights take about 2.5 s to hash,
    and every run and sweep checks them): a file written, moved or touched since changes its change time, and its
    hash is computed again. An entry holds the digest, the key it is filed under and a tag over both and a sample of
    the files' bytes (`_entry_tag`), so an entry copied over another, or one whose digest alone was rewritten, is
    computed again too."""
    paths = [Path(p) for p in paths]
    key_path = _hash_cache_entry(paths)
    try:  # an entry that cannot be reached (an unsearchable cache) costs the hashing, as a missing one does
        cached = read_at_most(key_path, 300).split() if key_path is not None and key_path.is_file() else None
    except (OSError, ValueError):  # an entry longer than a digest, its key and its tag is no entry this suite wrote
        cached = None
    # an entry holds its digest, its own key and their tag: one copied from another files' entry names another key,
    # and a digest rewritten alone no longer matches its tag
    if (cached is not None and len(cached) == 3 and cached[1] == key_path.name.encode() and len(cached[0]) == 64
            and all(c in b"0123456789abcdef" for c in cached[0])):
        try:
            if cached[2] == _entry_tag(cached[0].decode(), key_path.name, paths).encode():
                return cached[0].decode()
        except OSError:  # a file gone since its key was taken: hashing it raises the error the caller expects
            pass
    digest = _files_sha256(paths)
    if key_path is not None:
        try:
            atomic_write_text(key_path, f"{digest} {key_path.name} {_entry_tag(digest, key_path.name, paths)}\n")
        except OSError as err:  # an unwritable cache costs the next check its hashing, nothing else: said once
            cache_unusable(str(key_path.parents[2]), str(err.strerror or err))
    return digest


@functools.cache
def cache_unusable(root: str, why: str) -> None:
    """One warning a process for a cache it cannot write in (a file where the directory goes, read-only, full): called
    again with the same cache and cause, it says nothing."""
    import logging

    logging.getLogger(__name__).warning("the suite's cache %s cannot be written (%s): file hashes are computed again "
                                        "on every run; point SPECTER_CACHE_DIR at a writable directory", root, why)


def _hash_cache_entry(paths: list[Path]) -> Path | None:
    root = cache_root()
    if root is None:
        return None
    try:
        stats = [(str(p.resolve()), p.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
                 for p in paths for st in [p.stat()]]
    except OSError:  # a missing file: hashing it raises the error the caller expects
        return None
    key = hashlib.sha256(json.dumps(stats).encode()).hexdigest()
    return root / "file-hashes" / key[:2] / key


_SAMPLE = 1 << 16  # bytes read from each end of each file for an entry's tag


def _entry_tag(digest: str, key: str, paths: list[Path]) -> str:
    """sha256 over an entry's digest, its key and the first and last 64 KiB of each file: a digest of other files
    written into an entry (another model's, say) fails its tag, at the cost of reading 128 KiB per file."""
    h = hashlib.sha256(f"{digest} {key}".encode())
    for path in paths:
        if not Path(path).is_file():  # a pipe named by a crafted entry would be read for ever
            raise OSError(f"{path} is not a regular file")
        with Path(path).open("rb") as f:
            h.update(f.read(_SAMPLE))
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - _SAMPLE, 0))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()


def _files_sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    buffer = bytearray(1 << 20)  # one reused buffer: hashing a checkpoint holds 1 MiB of it, never a chunk per read
    view = memoryview(buffer)
    for path in paths:
        if not Path(path).is_file():  # a pipe or a device would be read for ever
            from specter.errors import SpecterError

            raise SpecterError(f"{path} is not a regular file (a pipe, a device or a directory); restore the file")
        h.update(Path(path).name.encode())
        with Path(path).open("rb") as f:
            while n := f.readinto(buffer):
                h.update(view[:n])
    return h.hexdigest()
