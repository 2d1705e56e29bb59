"""The draft's sidecar `meta.json`, tied to the target it was made from by the target's model hash
(`specter.models.integrity.model_hash`).

Loaders read the sidecar; nothing is inferred from file names.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specter.errors import SpecterError
from specter.io import json_strict, read_at_most

METHODS = ("gptq", "rtn")  # GPTQ (GPTQModel, calibrated) and round-to-nearest

META_FILE = "meta.json"


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


#: the most a sidecar holds (a few hundred bytes are written)
MAX_META_BYTES = 1 << 20
#: the key of experts.safetensors' metadata holding the sidecar's fields that say what the experts are
#: (`DraftMeta.bound`), so that the experts' checksum covers them too
BOUND_KEY = "specter.draft"
BOUND_FIELDS = ("method", "bits", "group_size", "sym", "source_hash", "calibration")


def _calibration_ok(calibration) -> bool:
    """A GPTQ draft's calibration as quantize records it: a corpus name and whole numbers of sequences and
    positions."""
    if not isinstance(calibration, dict) or not isinstance(calibration.get("corpus"), str):
        return False
    counts = (calibration.get("num_sequences"), calibration.get("seq_len"))
    return all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in counts)


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
    experts_sha256: str  # `specter.io.files_sha256` of experts.safetensors: the experts this sidecar was written with
    seconds: float
    versions: dict = field(default_factory=dict)
    numerics: dict = field(default_factory=dict)  # what the quantization ran with (`determinism.settings`)

    def write(self, out_dir: Path) -> None:
        (out_dir / META_FILE).write_text(json.dumps(asdict(self), indent=2, sort_keys=True) + "\n")

    @classmethod
    def read(cls, draft_dir: str | Path) -> DraftMeta:
        path = Path(draft_dir) / META_FILE
        if not path.is_file():
            why = f"its {META_FILE} is not a regular file" if path.exists() or path.is_symlink() else f"no {META_FILE}"
            raise SpecterError(f"{str(draft_dir)!r} is not a draft ({why}); make one with "
                               "`specter quantize --model DIR --out DIR`")
        try:
            meta = cls(**json_strict(read_at_most(path, MAX_META_BYTES)))
        except (ValueError, TypeError) as err:  # JSON's errors, a key given twice, bytes other than UTF-8, too long
            raise SpecterError(f"{path} is not a valid draft sidecar ({err}); quantize the draft again") from None
        meta.check(path)
        return meta

    def expert_bytes(self, expert_shapes, draft_dir) -> int:
        """`quantized_bytes_per_expert`, held to what a draft of the target's `expert_shapes` ((out, in) of each
        linear) stores at its bits and groups: the packed linears, and their float16 biases where the target has
        them. An edited figure would change every memory plan that charges the draft."""
        from specter.quant.packing import packed_bytes

        codes = sum(packed_bytes(in_f, out_f, self.bits, self.group_size) for out_f, in_f in expert_shapes)
        biased = codes + 2 * sum(out_f for out_f, _ in expert_shapes)
        if self.quantized_bytes_per_expert not in (codes, biased):
            raise SpecterError(f"{Path(draft_dir) / META_FILE}: quantized_bytes_per_expert is "
                               f"{self.quantized_bytes_per_expert}, and a {self.bits}-bit draft in groups of "
                               f"{self.group_size} of this model's experts stores {codes} bytes an expert ({biased} "
                               "with biases); quantize the draft again")
        return self.quantized_bytes_per_expert

    def bound(self) -> str:
        """The fields that say what the experts are, as experts.safetensors keeps them (`BOUND_KEY`)."""
        return json.dumps({name: getattr(self, name) for name in BOUND_FIELDS}, sort_keys=True)

    def check_experts(self, draft_dir) -> None:
        """The draft's experts.safetensors the one this sidecar was written with (another draft's experts of the same
        shapes, swapped in, load without a word otherwise), and the sidecar's fields that say what they are the ones
        the experts were written with (an edited method, bits or calibration would label other experts)."""
        from safetensors import safe_open

        from specter.io import files_sha256

        path = Path(draft_dir) / "experts.safetensors"
        if files_sha256([path]) != self.experts_sha256:
            raise SpecterError(f"{path} is not the file its {META_FILE} was written with (another draft's experts, or "
                               "edited); quantize the draft again")
        with safe_open(str(path), "pt") as f:
            kept = (f.metadata() or {}).get(BOUND_KEY)
        if kept is not None and kept != self.bound():  # a draft of a version before the binding keeps none
            written = json.loads(kept)
            field = next((n for n in BOUND_FIELDS if written.get(n) != getattr(self, n)), "a field")
            raise SpecterError(f"{Path(draft_dir) / META_FILE}: {field} is {getattr(self, field, None)!r}, and its "
                               f"experts were written as {written.get(field)!r}: the sidecar was edited; quantize "
                               "the draft again")

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
        if not isinstance(self.experts_sha256, str) or len(self.experts_sha256) != 64:
            problems.append(f"experts_sha256 {self.experts_sha256!r:.80} (a sha256)")
        if not isinstance(self.sym, bool):
            problems.append(f"sym {self.sym!r} (true or false)")
        if not isinstance(self.source_model, str):
            problems.append(f"source_model {self.source_model!r} (a path)")
        if isinstance(self.seconds, bool) or not isinstance(self.seconds, (int, float)) \
                or not math.isfinite(self.seconds) or self.seconds < 0:
            problems.append(f"seconds {self.seconds!r} (a finite number >= 0)")
        calibrated = self.method == "gptq"
        if calibrated and not _calibration_ok(self.calibration):
            problems.append(f"calibration {self.calibration!r} (GPTQ's corpus, num_sequences and seq_len)")
        if self.method == "rtn" and self.calibration is not None:
            problems.append(f"calibration {self.calibration!r} on a round-to-nearest draft (null: RTN calibrates "
                            "nothing)")
        if not isinstance(self.versions, dict) or not all(isinstance(v, str) for v in self.versions.values()):
            problems.append(f"versions {self.versions!r} (each a version string)")
        threads = self.numerics.get("threads", 1) if isinstance(self.numerics, dict) else None
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            problems.append(f"numerics {self.numerics!r} (what determinism.settings records: threads >= 1)")
        if problems:
            raise SpecterError(f"{path}: {'; '.join(problems)}; quantize the draft again")
