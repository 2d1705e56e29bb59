"""Python's bytecode kept in the suite's cache, where the environment forbids writing it beside the sources, and read
from there only whole, as its own checksum says (`cache_bytecode`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys

from specter.io import cache_root

#: the largest bytecode file read from the cache (the suite's largest module compiles to some 100 kB; torch's and
#: transformers' to under 2 MB): a larger one is damage, compiled again from source rather than read
MAX_BYTECODE = 64 * 2**20


def cache_bytecode() -> None:
    """Let this process keep the bytecode it compiles, in the suite's cache (`cache_root()/pycache`), where the
    environment forbids writing it beside the sources (`PYTHONDONTWRITEBYTECODE`) and names no other place for it
    (`PYTHONPYCACHEPREFIX`). Call first in an entry point, before the heavy imports. Without it, on such a machine with
    a `pip install --no-compile` environment, every process compiles torch's, transformers' and the suite's modules
    from source again: measured, a replayed sweep took 21 to 24 s of which about 11 s was compiling, and the default
    workflow starts about fifty processes. Nothing is written beside the sources; with no cache (`SPECTER_CACHE_DIR`
    set empty) this does nothing."""
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
    _guard_bytecode(sys.pycache_prefix)


def _digest(path, code) -> bytes:
    """The trailer of a cached bytecode file at `path`: the sha256 of its path and its code."""
    return hashlib.sha256(os.fsencode(str(path)) + b"\0" + bytes(code)).digest()


def _guard_bytecode(prefix: str) -> None:
    """The bytecode kept under `prefix` written whole and read whole: Python's own writer publishes what one `write`
    call wrote, so a full disk left a truncated file that every later import of that module failed on (`EOFError:
    marshal data too short`), every later command with it. Under `prefix` a file is renamed into place only once its
    size is the data's, and ends in the sha256 of its code (Python's header checks only the source's size and time, so a
    flipped byte ran: a changed constant, or a SyntaxError from the middle of an import) and of its own path (a module's
    bytecode copied over another's of the same source size and time would run as that one); a file whose code is not its
    sha256's or does not unmarshal is removed and its module compiled from source (the next process writes it again);
    one that is not a regular file, or is past `MAX_BYTECODE`, is not read at all, and one whose header's flags are not
    the writer's (a hash-based file, which Python never checks against its source) is not used. Hashing what a command
    imports costs it about 0.1 s. Bytecode elsewhere is Python's business and left alone."""
    import _frozen_importlib_external as external  # the module the import system itself runs (importlib's is it)

    if getattr(external, "_specter_guard", None) == prefix:
        return
    write, unmarshal = external._write_atomic, external._compile_bytecode
    write, unmarshal = getattr(write, "__wrapped__", write), getattr(unmarshal, "__wrapped__", unmarshal)
    ours = prefix.rstrip(os.sep) + os.sep

    def write_whole(path, data, mode=0o666):
        if not str(path).startswith(ours):
            return write(path, data, mode)
        data = bytes(data) + _digest(path, memoryview(data)[16:])  # past the header: magic, flags, source
        tmp = f"{path}.{os.getpid()}.{id(data)}.tmp"
        fd = os.open(tmp, os.O_EXCL | os.O_CREAT | os.O_WRONLY, mode & 0o666)
        try:
            with os.fdopen(fd, "wb") as f:  # buffered: writes until every byte is out, or raises
                f.write(data)
            if os.stat(tmp).st_size != len(data):
                raise OSError(f"wrote {os.stat(tmp).st_size} of {len(data)} bytes")
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise  # the import system ignores a failed write: the module still runs from its source

    def unmarshal_whole(data, name=None, bytecode_path=None, source_path=None):
        ours_here = source_path is not None and str(bytecode_path or "").startswith(ours)
        try:
            if ours_here:
                code, digest = memoryview(data)[:-32], bytes(memoryview(data)[-32:])
                if len(data) < 32 or _digest(bytecode_path, code) != digest:
                    raise ValueError("bytecode other than its checksum")
                data = code
            return unmarshal(data, name, bytecode_path, source_path)
        except (EOFError, ValueError, TypeError, ImportError):  # ImportError: a file that holds no code object
            if not ours_here:
                raise
            with contextlib.suppress(OSError):
                os.unlink(bytecode_path)
            with open(source_path, "rb") as f:
                return compile(f.read(), source_path, "exec", dont_inherit=True)

    read = external.FileLoader.get_data
    read = getattr(read, "__wrapped__", read)

    def read_regular(self, path):  # a pipe would be read for ever, a device or a huge file without end
        if not (str(path).startswith(ours) and str(path).endswith(".pyc")):
            return read(self, path)
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BYTECODE:
            raise OSError(f"{path} is not a bytecode file (not a regular file, or past {MAX_BYTECODE} bytes)")
        data = read(self, path)
        if bytes(data[4:8]) != bytes(4):  # other flags than the writer's: a hash-based file Python never checks
            raise OSError(f"{path} holds flags the suite never writes")  # against its source again
        return data  # an OSError above: the import system compiles the module from its source

    write_whole.__wrapped__, unmarshal_whole.__wrapped__, read_regular.__wrapped__ = write, unmarshal, read
    external._write_atomic, external._compile_bytecode = write_whole, unmarshal_whole
    external.FileLoader.get_data = read_regular
    external._specter_guard = prefix


