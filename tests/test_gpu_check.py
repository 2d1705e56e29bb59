"""`.ci/gpu-check`, the one script a GPU machine runs, run here as it is written: its own command lines, with its
Mixtral-shaped build flags (`build-model tiny-mixtral --set hidden_size=... --set dtype=...`) at a reduced size, on the
CPU as device, so that the lines a GPU machine runs are lines the tests ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).parents[1]


def test_the_gpu_checks_own_lines_with_its_gpu_shape_flags_run_on_the_cpu(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_SHAPES": "mixtral-4-layers",
           "GPU_CHECK_HIDDEN": "64", "GPU_CHECK_INTERMEDIATE": "112", "GPU_CHECK_HEADS": "4", "GPU_CHECK_KV_HEADS": "2",
           "GPU_CHECK_GROUP": "16", "GPU_CHECK_MAX_BYTES_LOG2": "20",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(ROOT / ".ci" / "gpu-check")], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "--set hidden_size=64 --set intermediate_size=112 --set num_hidden_layers=4" in done.stdout
    config = json.loads((tmp_path / "out" / "model" / "config.json").read_text())
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
            config["num_attention_heads"], config["num_key_value_heads"]) == (64, 112, 4, 4, 2)
    table = pd.read_csv(tmp_path / "out" / "sim_vs_measured.csv")
    assert set(table["system"]) == {"on-demand", "mixtral-offloading", "specter"}
    tpot = table[table["part"] == "TPOT"]
    assert (tpot["measured_ms"] > 0).all() and (tpot["simulated_ms"] > 0).all() and (tpot["n"] == 6).all()
    assert "measured on cpu" in done.stdout and "mixtral-4-layers shapes" in done.stdout
