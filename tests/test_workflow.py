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


def test_unknown_config_key_fails_before_any_job_naming_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["fidelity"]["strides"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad))
    assert proc.returncode != 0
    assert "'strides' was unexpected" in proc.stdout + proc.stderr


def test_wrong_type_fails_naming_the_value(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["calibration"]["seq_len"] = "long"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad))
    assert proc.returncode != 0 and "'long' is not of type 'integer'" in proc.stdout + proc.stderr
