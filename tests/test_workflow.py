"""The Snakemake workflow parses, plans the configured jobs, and passes Snakemake's linter."""

from __future__ import annotations

import json
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


def test_missing_model_path_fails_before_any_job_naming_the_key(tmp_path):
    import yaml

    config = yaml.safe_load((ROOT / ".test" / "config.yaml").read_text())
    config["models"] = {"mine": {"path": str(tmp_path / "nowhere")}}
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(config))
    proc = _snakemake("-n", "--cores", "1", "--configfile", str(bad), "--directory", str(tmp_path))
    assert proc.returncode != 0
    assert "config models.mine.path" in proc.stdout + proc.stderr and "holds no checkpoint" in proc.stdout + proc.stderr


def test_lint_is_clean():
    for extra in ([], ["--configfile", ".test/config.yaml"]):
        proc = _snakemake("--lint", *extra)
        assert proc.returncode == 0 and "Congratulations" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_test_config_replaces_the_default_one_instead_of_merging():
    proc = _snakemake("-n", "--cores", "1", "--forceall", "--configfile", ".test/config.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "smollm2-moe" not in proc.stdout and "tiny-olmoe" in proc.stdout


def test_workflow_end_to_end_on_the_test_config(tmp_path):
    """One baseline alone as a target, then every experiment, then nothing to do, then the report (CI's end-to-end)."""
    import pandas as pd

    args = ["-s", str(ROOT / "Snakefile"), "--directory", str(tmp_path), "--configfile",
            str(ROOT / ".test" / "config.yaml"), "--cores", "2"]
    single = "results/runs/small/code/mixtral-offloading.jsonl"
    proc = _snakemake(*args, single)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / single).is_file() and not (tmp_path / "results" / "tables").exists()

    proc = _snakemake(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    experiments = ["main", "k_sweep", "prefix_sweep", "routing", "working_set", "prefetch_policy", "ablation",
                   "oracle", "budget", "hardware", "paper_check", "fidelity"]
    for name in experiments:
        table = pd.read_csv(tmp_path / "results" / "tables" / f"{name}.csv")
        assert len(table) > 0, name
        png = (tmp_path / "results" / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n", name
    main = pd.read_csv(tmp_path / "results" / "tables" / "main.csv")
    assert set(main["system"]) == {"resident", "on-demand", "naive", "mixtral-offloading", "moe-infinity", "fiddler",
                                   "sp-moe", "specmoeoff", "specter"}
    assert (main["tpot_ms"] >= main["lower_bound_tpot_ms"]).all() and main["simulated"].all()
    assert set(main["memory"]) == {"same slots", "same memory"}  # both of the paper's comparisons
    priced = main[main["cost_as"] == "mixtral-8x7b"]
    assert len(priced) and (priced["tpot_ms"] > 10).all()  # Mixtral-8x7B's shapes: the paper's regime
    for path in (tmp_path / "results" / "runs").rglob("*.jsonl"):  # the runs replayed the recorded numerics
        assert all(json.loads(line)["extra"]["live_forwards"] == 0 for line in path.read_text().splitlines()), path

    proc = _snakemake(*args, "-n")
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout + proc.stderr

    proc = _snakemake(*args, "--report", str(tmp_path / "report.html"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (tmp_path / "report.html").read_text()
    assert "simulated" in html and "Belady" in html  # the captions made it in
