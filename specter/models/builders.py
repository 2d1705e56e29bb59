"""Named model builders behind `specter build-model NAME --out DIR`: everything the suite can make offline.

`smollm2-moe` (the embedded default model) and `smollm2-moe-ExK` (proxies of the paper's routing structures):
SmolLM2-135M-Instruct turned into an MoE (see `moefy.py` and `proxies.py`); `--set key=value` changes a build setting.
`tiny-<model_type>`: a seeded random tiny checkpoint of a stock class (tests, the workflow's `.test` config); `--set`
gives it other shapes (`hidden_size=4096`, ...) and a dtype (`.ci/gpu-check`'s Mixtral-shaped model).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specter.errors import SpecterError
from specter.models.tiny import TINY_CONFIGS, save_tiny_model

Builder = Callable[[Path, int, dict], Path]


def _proxy(name: str) -> Builder:
    def build(out: Path, seed: int, overrides: dict) -> Path:
        from specter.models.proxies import build_proxy

        return build_proxy(name, out, seed=seed, overrides=overrides)
    return build


def _tiny(model_type: str) -> Builder:
    def build(out: Path, seed: int, overrides: dict) -> Path:
        return save_tiny_model(model_type, out, seed=seed, overrides=overrides)
    return build


def builders() -> dict[str, Builder]:
    from specter.models.proxies import PROXIES

    return {**{name: _proxy(name) for name in PROXIES},
            **{f"tiny-{model_type}": _tiny(model_type) for model_type in sorted(TINY_CONFIGS)}}


_MODEL_FILES = ("config.json", "model.safetensors", "model_card.json")  # a directory with one of these holds a model


def build_model(name: str, out: str | Path, seed: int = 0, overrides: dict[str, str] | None = None) -> Path:
    """Build model `name` into `out`. A model already there is replaced, atomically, once the new one is complete; any
    other non-empty directory is refused (it is not ours to delete)."""
    known = builders()
    if name not in known:
        raise SpecterError(f"unknown model {name!r}; buildable: {', '.join(known)}")
    from transformers.utils import logging as hf_logging

    from specter.io import atomic_dir

    hf_logging.disable_progress_bar()  # transformers' shard-writing bar: one shard, and carriage returns in logs
    out = Path(out)
    if out.is_dir() and any(out.iterdir()) and not any((out / n).is_file() for n in _MODEL_FILES):
        raise SpecterError(f"{str(out)!r} is a non-empty directory that holds no model; choose another --out (a "
                           "model already there is replaced, anything else is left alone)")
    with atomic_dir(out) as tmp:  # a killed build leaves nothing that looks like a model
        known[name](tmp, seed, dict(overrides or {}))
    return out
