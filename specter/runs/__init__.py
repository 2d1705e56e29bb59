"""Running: one spec (`execute`, `run`), a grid or several systems in one process (`sweep`, `compare`), and the
records they write (`records`). The CUDA engine's part of a run is `device`.

The running functions load on first use: reading records (`specter.runs.records`, what `specter aggregate` needs)
imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib

_HOMES = {"execute": "execute", "run": "execute", "schedule": "execute", "compare": "sweep", "grid": "sweep",
          "summary": "sweep", "sweep": "sweep"}

__all__ = ["compare", "execute", "grid", "run", "schedule", "summary", "sweep"]


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"specter.runs.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'specter.runs' has no attribute {name!r}")
