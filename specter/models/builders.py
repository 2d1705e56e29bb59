"""Named model builders behind `specter build-model NAME --out DIR`: everything the suite can make offline.

`smollm2-moe`: the embedded default model, SmolLM2-135M-Instruct turned into a Qwen2-MoE (see `moefy.py`).
`tiny-<model_type>`: a seeded random tiny checkpoint of a stock class (tests, the workflow's `.test` config).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from specter.errors import SpecterError
from specter.models.tiny import TINY_CONFIGS, save_tiny_model

Builder = Callable[[Path, int], Path]

def _smollm2_moe(out: Path, seed: int) -> Path:
    from specter.models.moefy import build_smollm2_moe

    return build_smollm2_moe(out, seed=seed)


BUILDERS: dict[str, Builder] = {
    "smollm2-moe": _smollm2_moe,
    **{f"tiny-{model_type}": (lambda out, seed, mt=model_type: save_tiny_model(mt, out, seed=seed))
       for model_type in sorted(TINY_CONFIGS)},
}


def build_model(name: str, out: str | Path, seed: int = 0) -> Path:
    """Build model `name` into `out`; refuses to overwrite a directory that already holds a model."""
    if name not in BUILDERS:
        raise SpecterError(f"unknown model {name!r}; buildable: {', '.join(BUILDERS)}")
    out = Path(out)
    if (out / "config.json").exists():
        raise SpecterError(f"{str(out)!r} already holds a model; choose another --out or delete it first")
    return BUILDERS[name](out, seed)
