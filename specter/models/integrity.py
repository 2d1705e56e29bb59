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
    """sha256 over config.json and the bytes of every weights file its loaders read (sorted by name): the target's
    identity."""
    root = Path(model_dir)
    return files_sha256([root / "config.json", *weight_files(root), *sorted(root.glob("*.bin"))])


def weight_files(path: Path) -> list[Path]:
    """The safetensors files a checkpoint's weights are read from, chosen as transformers chooses them, so that every
    loader of the suite reads the same tensors: `model.safetensors` where there is one, else the shards that
    `model.safetensors.index.json` lists, else every `*.safetensors` file. A file the index does not list is not read
    (a checkpoint published with a `consolidated.safetensors` beside its shards, as Mistral's are). Refused, naming the
    file: an index that maps no tensor to a file, a shard it lists that is missing, and a `model.safetensors` beside
    an index that does not list it (transformers would read that file and ignore the index)."""
    index = path / "model.safetensors.index.json"
    single = path / "model.safetensors"
    if not index.is_file():
        return _regular([single] if single.is_file() else sorted(path.glob("*.safetensors")))
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
        shards = sorted(set(weight_map.values()))
        if not shards or not all(isinstance(s, str) and s and Path(s).name == s for s in shards):
            raise ValueError("no shards")
    except (OSError, ValueError, AttributeError, TypeError, RecursionError):
        raise SpecterError(f"the checkpoint in {str(path)!r}: {index.name} is not an index of its weights (it maps "
                           "no tensor to a file); restore it from the checkpoint's source") from None
    if (single.exists() or single.is_symlink()) and single.name not in shards:
        raise SpecterError(f"the checkpoint in {str(path)!r} holds {single.name}, which {index.name} does not list "
                           "(a file of another checkpoint or an older copy, which transformers reads instead of the "
                           "shards): remove it, or restore the index")
    gone = [s for s in shards if not (path / s).exists() and not (path / s).is_symlink()]
    if gone:
        more = f" and {len(gone) - 1} more shard(s)" if len(gone) > 1 else ""
        raise SpecterError(f"the checkpoint in {str(path)!r} lacks {gone[0]}{more}, which {index.name} lists; copy "
                           "or re-download the missing shard(s)")
    return _regular([path / s for s in shards])


def _regular(files: list[Path]) -> list[Path]:
    """`files`, each a regular file (a link to a device, a pipe or a directory would hang or fail a loader)."""
    import stat

    for file in files:
        try:
            mode = file.stat().st_mode
        except OSError:
            mode = 0
        if not stat.S_ISREG(mode):
            raise SpecterError(f"the checkpoint's weights file {str(file)!r} is not a regular file (a link to a "
                               "device, a pipe or a directory, or a dangling link); put the weights file itself there")
    return files


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
