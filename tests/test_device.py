"""The host ExpertStore every measured run copies experts from, and the measured engine's name: a GPU measures with
`--engine live --device cuda` (the live engine's own tests are `test_live.py` and `test_live_device.py`).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specter.models import load_moe_model
from specter.models.experts import expert_ffn
from specter.offload.store import ExpertStore

ARCHS = ("olmoe", "gpt_oss", "deepseek_v3")  # plain; biased and interleaved; a dense layer, shared experts and MLA


@pytest.mark.parametrize("arch", ARCHS)
def test_store_rows_are_the_experts(arch, tiny_dirs):
    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    store = ExpertStore(target)
    assert not store.pinned and store.expert_bytes == target.moe_layers[0].expert_bytes(torch.float16)
    x = torch.randn(3, target.config.hidden_size) * 0.1
    for layer in target.moe_layers:
        for e in (0, layer.num_experts - 1):
            views = store.layout.views(store.row(layer.layer_index, e))
            for name, t in layer.expert_weights(e).tensors().items():
                assert torch.equal(views.tensors()[name], t.to(torch.float16)), (layer.layer_index, e, name)
            got = expert_ffn(x, views.to(dtype=torch.float32))
            torch.testing.assert_close(got, layer.expert_forward(e, x), rtol=2e-2, atol=2e-3)


def test_engine_cuda_is_refused_in_one_line_that_names_the_live_engine(tiny_dirs, tmp_path):
    """A GPU measures through the live engine: `--engine cuda` is refused before anything loads, in one line that
    names the engines and the way to measure on a GPU, and nothing is written."""
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "on-demand", "--model",
                           tiny_dirs["olmoe"], "--dataset", "code", "--hardware", "a100-40gb-pcie4",
                           "--resident-per-layer", "2", "--engine", "cuda", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    assert "'cuda' is not one of its choices (sim, live): a GPU measures with --engine live --device cuda" in errors[0]
    assert not out.exists()


def test_a_spec_with_the_engine_cuda_is_refused_with_the_live_engine_named():
    from conftest import spec
    from specter.errors import SpecterError

    with pytest.raises(SpecterError, match=r"--engine cuda is not an engine; engines: sim, live; a GPU measures with "
                                           r"--engine live --device cuda"):
        spec(system="on-demand", model="m", dataset="code", hardware="a100-40gb-pcie4", out="x.jsonl",
             resident_per_layer=2, engine="cuda").check_names()
