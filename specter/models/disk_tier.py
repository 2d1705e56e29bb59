"""The disk tier's directory in the suite's cache: where it goes (`disk_tier_dir`), whether the machine's memory
calls for it (`available_memory`), the checks before it is built (`check_room`: a directory we may write in, room
for every file) and the build's atomic directory (`building_dir`), and the manifest that every later load checks it
against (`write_manifest`, `tier_problem`). `specter.models.streaming` builds and maps the files themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import weakref
from pathlib import Path

import torch

from specter.errors import SpecterError
from specter.io import atomic_dir, cache_root, read_at_most, writable_problem
from specter.models.integrity import model_hash
from specter.progress import log


def available_memory() -> int | None:
    """The bytes of memory this process can still take: the system's `MemAvailable`, or less where the process's
    cgroup (a container, a SLURM job) has a memory limit (v2 `memory.max` less `memory.current`, or v1
    `memory.limit_in_bytes` less `memory.usage_in_bytes`); None where Linux does not say."""
    def text(path: str) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    found = [int(line.split()[1]) * 1024 for line in text("/proc/meminfo").splitlines()
             if line.startswith("MemAvailable:")]
    for limit, used in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, now = text(limit).strip(), text(used).strip()
        if cap.isdigit() and now.isdigit():  # "max": no limit
            found.append(max(0, int(cap) - int(now)))
    return min(found) if found else None


def disk_tier_dir(path: Path, dtype: torch.dtype, known_hash: str | None = None) -> Path:
    """Where the disk tier keeps the checkpoint's expert rows at `dtype`: the suite's cache, by the checkpoint's
    hash."""
    root = cache_root()
    if root is None:
        raise SpecterError("the disk tier keeps the experts in the suite's cache, and SPECTER_CACHE_DIR is set empty; "
                           "set it to a directory with room for the experts, or keep them in memory")
    digest = (known_hash or model_hash(path))[:16]
    return root / "expert-rows" / f"{digest}-{str(dtype).removeprefix('torch.')}"


#: the disk tier's manifest: what the build wrote, checked before every later load maps the files
MANIFEST = "manifest.json"
#: the most a manifest holds (about 200 bytes a layer file: a real model's is tens of kilobytes)
MAX_MANIFEST_BYTES = 1 << 24
_SAMPLES, _BLOCK = 16, 1 << 16  # a file's digest reads 16 blocks of 64 KiB, evenly spaced from its first to its last


def _sampled_digest(file: Path, size: int) -> str:
    """blake2b over the file's size and `_SAMPLES` blocks of `_BLOCK` bytes spread evenly over it (all of a file under
    1 MiB): a load reads about a megabyte a layer instead of the whole tier, which can be tens of gigabytes."""
    h = hashlib.blake2b(str(size).encode(), digest_size=16)
    step = max(0, size - _BLOCK) / max(1, _SAMPLES - 1)
    starts = sorted({int(i * step) for i in range(_SAMPLES)}) if size > _SAMPLES * _BLOCK else [0]
    with open(file, "rb") as f:
        for start in starts:
            f.seek(start)
            h.update(f.read(_BLOCK if size > _SAMPLES * _BLOCK else size))
    return h.hexdigest()


def tier_identity(model_sha256: str, dtype: torch.dtype) -> str:
    """What a tier holds, as its manifest names it: the checkpoint's whole hash and the dtype of its rows (the
    directory's name keeps a prefix of the hash: a directory renamed or swapped with another model's still names its
    own in the manifest)."""
    return f"{model_sha256}-{str(dtype).removeprefix('torch.')}"


def write_manifest(tier: Path, identity: str) -> None:
    """Each layer file's size, inode, modification and change times and sampled digest, and the model and dtype the
    tier holds (`tier_identity`), in `tier`'s manifest, written once the directory is in its place (a tier without a
    manifest is built again)."""
    from specter.io import atomic_write_text

    files = {}
    for file in sorted(tier.glob("layer-*.bin")):
        st = file.stat()
        files[file.name] = {"bytes": st.st_size, "inode": st.st_ino, "mtime_ns": st.st_mtime_ns,
                            "ctime_ns": st.st_ctime_ns, "sampled_blake2b": _sampled_digest(file, st.st_size)}
    atomic_write_text(tier / MANIFEST, json.dumps({"format": 3, "model": identity, "files": files}, indent=1))


def tier_problem(tier: Path, expected: set[str] | None = None, identity: str | None = None) -> str | None:
    """Why the disk tier in `tier` does not match the manifest its build wrote, or None where it does: a layer file
    (of `expected`, and every one there) missing or unlisted, a file resized, replaced, written or touched since (its
    inode, modification or change time: a change time is set by every write and no user can set it back), or other
    bytes where the digest samples them. A manifest forged to match forged files would pass: the tier is the suite's
    own cache, and hashing every byte would read the whole tier, tens of gigabytes for a real model, on every load."""
    try:
        if (tier / MANIFEST).exists() and not (tier / MANIFEST).is_file():  # a FIFO's read would wait forever
            return f"{MANIFEST} is not a regular file"
        manifest = json.loads(read_at_most(tier / MANIFEST, MAX_MANIFEST_BYTES))
    except FileNotFoundError:
        return f"no {MANIFEST}"
    except (OSError, ValueError, RecursionError) as err:
        return f"{MANIFEST} unreadable ({type(err).__name__})"
    files = manifest.get("files") if isinstance(manifest, dict) and manifest.get("format") == 3 else None
    if not isinstance(files, dict) or not files:
        return f"{MANIFEST} of another format or listing no files"
    if identity is not None and manifest.get("model") != identity:
        return f"it holds {str(manifest.get('model'))[:80]!r}, not {identity!r} (a directory of another model)"
    if any(not isinstance(name, str) or not name.startswith("layer-") or "/" in name or "\0" in name
           for name in files):
        return f"{MANIFEST} names a file that is no layer file"
    present = {p.name for p in tier.glob("layer-*.bin")}
    for name in sorted((expected or set()) | present):
        if name not in files:
            return f"{name} is not in {MANIFEST}"
    for name, want in sorted(files.items()):
        file = tier / str(name)
        try:
            st = file.stat()
        except OSError:
            return f"{name} missing"
        if not isinstance(want, dict):
            return f"{MANIFEST} damaged at {name}"
        if not file.is_file():
            return f"{name} is not a file"
        if type(want.get("bytes")) is not int:
            return f"{MANIFEST} gives {name}'s bytes as {want.get('bytes')!r:.40}, not a whole number"
        if st.st_size != want.get("bytes"):
            return f"{name} is {st.st_size} bytes, built as {want.get('bytes')}"
        if (st.st_ino, st.st_mtime_ns, st.st_ctime_ns) != (want.get("inode"), want.get("mtime_ns"),
                                                         want.get("ctime_ns")):
            return f"{name} was replaced, written or touched after the build"
        if _sampled_digest(file, st.st_size) != want.get("sampled_blake2b"):
            return f"{name} holds other bytes than the build wrote"
    return None


def rows_bytes(layer, dtype: torch.dtype) -> int:
    """The bytes of a layer's expert rows at `dtype` (its file in the disk tier)."""
    per_expert = layer.experts.gate_up_proj[0].numel() + layer.experts.down_proj[0].numel()
    return layer.num_experts * per_expert * torch.empty(0, dtype=dtype).element_size()


#: room kept free beside the tier's files (the manifest, the file system's own blocks)
_SPARE = 64 * 2**20


def check_room(tier: Path, need: int) -> None:
    """Refuse, in one line naming the path, the bytes and the fix, a disk tier the cache cannot hold: a cache that is
    not a directory we may write in, or a file system with less free space than the tier's files."""
    for path in (tier, *tier.parents):  # a stray file or a dangling link where the tier's directories go
        if path.is_symlink() and not path.exists():
            raise SpecterError(f"the disk tier cannot be built: {str(path)!r} is a symbolic link to a path that does "
                               "not exist; remove the link or point SPECTER_CACHE_DIR at a directory")
        if path.exists():
            break
    if tier.exists() and not tier.is_dir():
        raise SpecterError(f"the disk tier cannot be built: {str(tier)!r} is a file where its directory goes; remove "
                           "that file and run again")
    existing = tier
    while not existing.exists():
        existing = existing.parent
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise SpecterError(f"the disk tier cannot be built: {str(existing)!r} is on a read-only file system; set "
                           "SPECTER_CACHE_DIR to a directory on a writable one, or keep the experts in memory "
                           "(--host-store memory)")
    problem = writable_problem(tier, directory=True)
    if problem is not None:
        raise SpecterError(f"the disk tier cannot be built: {problem}; set SPECTER_CACHE_DIR to a directory you can "
                           "write in, or keep the experts in memory (--host-store memory)")
    existing = tier.parent
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < need + _SPARE:
        raise SpecterError(f"the disk tier needs {need / 2**20:.1f} MiB ({need} bytes) and {_SPARE // 2**20} MiB "
                           f"spare in {str(existing)!r}, which has {free / 2**20:.1f} MiB free; free space there or "
                           "set SPECTER_CACHE_DIR to a file system with room (or keep the experts in memory: "
                           "--host-store memory)")


@contextlib.contextmanager
def building_dir(tier: Path):
    """`atomic_dir(tier)`, an OSError while it fills (a disk filled by another process, an I/O error) one line that
    names the directory; the partial build is removed either way."""
    try:
        with atomic_dir(tier) as into:
            yield into
    except OSError as err:
        raise SpecterError(f"building the disk tier {tier} failed ({err.strerror or err}); nothing of it was kept. "
                           "Free space in the cache or set SPECTER_CACHE_DIR elsewhere, then run again") from None


class TierLeases:
    """Read leases (`fcntl(F_SETLEASE, F_RDLCK)`) on a mapped disk tier's files: a writer that opens one for writing or
    truncates it is held back by the kernel (up to `/proc/sys/fs/lease-break-time`, 45 s by default) and
    this process is sent SIGIO, which stops it in one line (a `SpecterError` raised in the main thread, no record
    written) before it reads a page of a file that shrank under its map, which would end it with a bus error. The
    writer goes on once this process exits or `close`s.

    A file another process holds open for writing is refused in one line: its rows may change under the run. Where
    no lease can be had (a file another user owns, a file system without leases such as NFS, a thread other than the
    main one), the run goes on unprotected, warned once, and `unleased` says why (the loader's line in the record
    carries it)."""

    def __init__(self, tier: Path, files: list[Path]) -> None:
        import errno
        import fcntl
        import signal
        import threading

        self.tier, self._fcntl, self.held, self.unleased = tier, fcntl, [], None
        if threading.current_thread() is not threading.main_thread():
            self._unprotected("the tier was mapped outside the main thread, where no signal reaches")
            return
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
            except OSError as err:
                os.close(fd)
                if err.errno == errno.EAGAIN:
                    self.close()
                    raise SpecterError(f"another process holds the disk tier's {file} open for writing, so its rows "
                                       "could change under this run; let it finish, or delete "
                                       f"{tier} (it is rebuilt from the checkpoint), and run again") from None
                self._unprotected(f"{file.name} cannot be leased ({err.strerror}"
                                  + ("; it belongs to another user: a cache of your own, SPECTER_CACHE_DIR, holds "
                                     "tiers it can lease)" if err.errno in (errno.EACCES, errno.EPERM) else ")"))
                continue
            self.held.append((file, fd))
        if self.held:  # the handler holds the leases weakly: they go (and their files' writers go on) with the model
            own, before = weakref.ref(self), signal.getsignal(signal.SIGIO)

            def on_break(signum: int, frame) -> None:
                leases = own()
                if leases is not None:
                    leases.stop(signum, frame)
                elif callable(before):
                    before(signum, frame)

            self._before = before
            signal.signal(signal.SIGIO, on_break)

    def _unprotected(self, why: str) -> None:
        if self.unleased is None:
            self.unleased = why
            log.warning("the disk tier %s is read without a lease: %s. A writer that changes or truncates its files "
                        "during the run is not detected (its tokens could change, or it could end in a bus error)",
                        self.tier, why)

    def stop(self, signum: int, frame) -> None:
        """SIGIO's handler: end the run if one of these leases is being broken."""
        broken = [file for file, fd in self.held if self._broken(fd)]
        if not broken:  # another tier's lease, or a SIGIO of another kind
            if callable(self._before):
                self._before(signum, frame)
            return
        raise SpecterError(f"the disk tier's {broken[0]} was opened for writing or truncated while this run read it "
                           "through its memory map; the run stops before any record. Let the writer finish, then "
                           f"delete {self.tier} (it is rebuilt from the checkpoint) and run again")

    def _broken(self, fd: int) -> bool:
        try:
            return self._fcntl.fcntl(fd, self._fcntl.F_GETLEASE) != self._fcntl.F_RDLCK
        except OSError:
            return False

    def close(self) -> None:
        """Give the leases back (the files' writers go on)."""
        for _, fd in self.held:
            os.close(fd)
        self.held = []

    def __del__(self) -> None:
        self.close()
