"""Running: one spec (`execute`, `run`), a grid or several systems in one process (`sweep`, `compare`). The records
they write are `specter.records` (outside this package, so that reading them imports no torch); the live engine's part
of a run is `live`."""

from specter.runs.execute import execute, run, schedule
from specter.runs.sweep import compare, grid, summary, sweep

__all__ = ["compare", "execute", "grid", "run", "schedule", "summary", "sweep"]
