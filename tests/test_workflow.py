"""The Snakemake workflow parses, plans the configured jobs, and passes Snakemake's linter."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _snakemake(*args):
    return subprocess.run(["snakemake", *args], cwd=ROOT, capture_output=True, text=True)


def test_dry_run_plans_models_drafts_and_fidelity():
    proc = _snakemake("-n", "--cores", "1", "--forceall")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    for rule in ("build_model", "quantize", "fidelity", "all"):
        assert rule in proc.stdout
