"""The draft's sidecar `meta.json` and the model hash that ties a draft to the target it was made from.

Loaders read the sidecar; nothing is inferred from file names.
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specter.errors import SpecterError

METHODS = ("gptq", "rtn")  # GPTQ (GPTQModel, calibrated) and round-to-nearest

META_FILE = "meta.json"


def files_sha256(paths) -> str:
    """sha256 over each file's name and bytes, in the order given. Kept in the cache (`specter.io.cache_root`) under
    the files' paths, sizes, inodes and modification and change times (a model's weights take about 2.5 s to hash,
    and every run and sweep checks them): a file written, moved or touched since changes its change time, and its
    hash is computed again."""
    paths = [Path(p) for p in paths]
    key_path = _hash_cache_entry(paths)
    if key_path is not None and key_path.is_file():
        cached = key_path.read_text().strip()
        if len(cached) == 64 and all(c in "0123456789abcdef" for c in cached):
            return cached
    digest = _files_sha256(paths)
    if key_path is not None:
        from specter.io import atomic_write_text

        try:
            atomic_write_text(key_path, digest + "\n")
        except OSError:  # an unwritable cache costs the next check its hashing, nothing else
            pass
    return digest


def _hash_cache_entry(paths: list[Path]) -> Path | None:
    from specter.io import cache_root

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


def _files_sha256(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(Path(path).name.encode())
        with Path(path).open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
    return h.hexdigest()


def model_hash(model_dir: str | Path) -> str:
    """sha256 over config.json and every weight file's bytes (sorted by name): the target's identity."""
    root = Path(model_dir)
    return files_sha256([root / "config.json", *sorted(root.glob("*.safetensors")), *sorted(root.glob("*.bin"))])


def versions() -> dict[str, str]:
    import torch
    import transformers

    import specter

    out = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "specter": specter.__version__}
    try:
        from importlib.metadata import version

        out["gptqmodel"] = version("gptqmodel")
    except Exception:  # noqa: BLE001 - any failure means "not installed"
        out["gptqmodel"] = "not installed"
    return out


@dataclass(frozen=True)
class DraftMeta:
    method: str  # "gptq" or "rtn"
    bits: int
    group_size: int
    sym: bool
    source_model: str  # absolute path of the target when quantized (informational)
    source_hash: str  # model_hash of the target: what loaders check
    calibration: dict | None  # corpus, num_sequences, seq_len (GPTQ only)
    quantized_bytes_per_expert: int  # packed codes, zeros, scales, g_idx, biases of the largest expert
    seconds: float
    versions: dict = field(default_factory=dict)
    numerics: dict = field(default_factory=dict)  # what the quantization ran with (`determinism.settings`)

    def write(self, out_dir: Path) -> None:
        (out_dir / META_FILE).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, draft_dir: str | Path) -> DraftMeta:
        path = Path(draft_dir) / META_FILE
        if not path.is_file():
            raise SpecterError(
                f"{str(draft_dir)!r} is not a draft (no {META_FILE}); make one with "
                "`specter quantize --model DIR --out DIR`"
            )
        try:
            meta = cls(**json.loads(path.read_text()))
        except (json.JSONDecodeError, TypeError, UnicodeDecodeError) as err:
            raise SpecterError(f"{path} is not a valid draft sidecar ({err}); quantize the draft again") from None
        meta.check(path)
        return meta

    def check(self, path) -> None:
        """Every field of a sidecar in range (an edited meta.json is refused, not trusted)."""
        from specter.quant.packing import SUPPORTED_BITS

        problems = []
        if self.method not in ("gptq", "rtn"):
            problems.append(f"method {self.method!r} (gptq or rtn)")
        if self.bits not in SUPPORTED_BITS:
            problems.append(f"bits {self.bits!r} (one of {SUPPORTED_BITS})")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            problems.append(f"group_size {self.group_size!r} (a whole number >= 1)")
        q = self.quantized_bytes_per_expert
        if isinstance(q, bool) or not isinstance(q, int) or q < 1:
            problems.append(f"quantized_bytes_per_expert {q!r} (a whole number >= 1)")
        if not isinstance(self.source_hash, str) or len(self.source_hash) != 64:
            problems.append(f"source_hash {self.source_hash!r} (a sha256)")
        if problems:
            raise SpecterError(f"{path}: {'; '.join(problems)}; quantize the draft again")
