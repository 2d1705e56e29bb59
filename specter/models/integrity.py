"""A model's weights checked for what would make a run commit garbage with exit 0: a NaN or infinite weight (a build
with a degenerate setting, weights filled with 0xFF bytes, a quantization scale past float16's range), and weights or
config edited since the model card recorded their hash.

`check_finite` runs where weights come into being or into memory: a build before it saves (`build-model`), a load
(`load_moe_model`), a quantization before it writes and a draft as it is dequantized. `check_card` compares the card's
`weights_sha256` (the model hash over config.json and every weight file, `model_hash`) with the files
now; the hash goes through the suite's file-hash cache, so a second check of unchanged files reads one small file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from specter.errors import SpecterError
from specter.io import files_sha256

CARD = "model_card.json"


def model_hash(model_dir: str | Path) -> str:
    """sha256 over config.json and every weight file's bytes (sorted by name): the target's identity."""
    root = Path(model_dir)
    return files_sha256([root / "config.json", *sorted(root.glob("*.safetensors")), *sorted(root.glob("*.bin"))])


_FINITE_CHUNK = 1 << 20  # elements checked at a time: a check's temporaries stay a few MB, whatever the tensor


def _all_finite(tensor) -> bool:
    """Whether every element is finite, checked a slice of the leading axis at a time (so a strided view of an
    expert's rows is never copied whole, and a 1.9 GB fused expert tensor costs no 1.9 GB temporary)."""
    import torch

    if tensor.numel() <= _FINITE_CHUNK or tensor.dim() == 0:
        return bool(torch.isfinite(tensor).all())
    if tensor.dim() == 1:
        return all(bool(torch.isfinite(part).all()) for part in tensor.split(_FINITE_CHUNK))
    row = tensor[0].numel()
    if row > _FINITE_CHUNK:  # one slice of the leading axis is itself too large: check inside each
        return all(_all_finite(part) for part in tensor.unbind(0))
    return all(bool(torch.isfinite(part).all()) for part in tensor.split(_FINITE_CHUNK // row))


def first_nonfinite(named_tensors: Iterable[tuple[str, object]]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or an infinity, or None."""
    for name, tensor in named_tensors:
        if tensor is not None and tensor.is_floating_point() and not _all_finite(tensor):
            return name
    return None


def check_finite(model, what: str, fix: str) -> None:
    """Refuse `model` (a torch module) if any parameter or buffer is NaN or infinite; `what` names it, `fix` the
    remedy."""
    bad = first_nonfinite([*model.named_parameters(), *model.named_buffers()])
    if bad is not None:
        raise SpecterError(f"{what}: tensor {bad} holds NaN or infinite values; {fix}")


def check_card(model_dir: str | Path, known_hash: str | None = None) -> None:
    """Where `model_dir` has a model card, its files must still have the hash the card recorded (`known_hash`: the
    model hash where the caller has computed it already)."""
    path = Path(model_dir) / CARD
    if not path.is_file():
        return
    try:
        card = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecterError(f"{path} is not a readable model card ({type(err).__name__}); rebuild the model with "
                           "`specter build-model`") from None
    recorded = card.get("weights_sha256") if isinstance(card, dict) else None
    if recorded is None:  # a card that records no hash has nothing to check
        return
    if not isinstance(recorded, str) or len(recorded) != 64:
        raise SpecterError(f"{path}: weights_sha256 {recorded!r} is not a sha256; rebuild the model with "
                           "`specter build-model`")
    actual = known_hash or model_hash(model_dir)
    if actual != recorded:
        raise SpecterError(f"{str(model_dir)!r}: its config.json or weights are not the ones {CARD} recorded "
                           f"(weights_sha256 {recorded[:12]}, the files now {actual[:12]}): edited or damaged since "
                           "the build; rebuild the model with `specter build-model` or copy it again")
