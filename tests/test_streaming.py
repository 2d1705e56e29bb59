"""The streaming loader (`specter.models.streaming`): every class it reads loads bit for bit as transformers loads
it, its experts as the rows the host store adopts without a copy, and a live run's loading holds the checkpoint's
bytes once (peak resident memory, measured in a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from conftest import ARCHS
from specter.models.loading import load_moe_model
from specter.models.streaming import StreamingUnsupported, stream_moe_model
from specter.offload.store import ExpertStore
from specter.session import Session

STREAMED = [a for a in ARCHS if a != "gpt_oss"]


@pytest.mark.parametrize("arch", STREAMED)
def test_a_streamed_checkpoint_is_the_model_transformers_loads(arch, tiny_dirs):
    """Every parameter and buffer equal, the same logits, and each MoE layer's experts one [E, numel] tensor that the
    store adopts as its rows (the same values its own copy would hold, at the same address)."""
    dtypes = (torch.float32, torch.bfloat16) if arch == "mixtral" else (torch.float32,)
    prompt = torch.tensor([list(range(5, 21))])
    for dtype in dtypes:
        loaded = load_moe_model(tiny_dirs[arch], dtype=dtype)
        streamed = stream_moe_model(tiny_dirs[arch], dtype)
        want, got = loaded.model.state_dict(), streamed.model.state_dict()
        assert set(want) == set(got)
        for name in want:
            assert want[name].dtype == got[name].dtype and torch.equal(want[name], got[name]), (arch, dtype, name)
        for name, buffer in loaded.model.named_buffers():
            assert torch.equal(buffer, dict(streamed.model.named_buffers())[name]), (arch, name)
        with torch.no_grad():
            assert torch.equal(loaded.model(input_ids=prompt).logits, streamed.model(input_ids=prompt).logits)
        copied = ExpertStore(streamed, dtype=dtype)
        adopted = ExpertStore(streamed, dtype=dtype, share=True)
        assert adopted.shared_layers == [m.layer_index for m in streamed.moe_layers]
        for m in streamed.moe_layers:
            rows = adopted.layers[m.layer_index]
            assert rows.data_ptr() == m.experts.gate_up_proj.data_ptr()  # adopted, not copied
            assert torch.equal(rows, copied.layers[m.layer_index])
        assert streamed.loaded_by != loaded.loaded_by


def test_a_checkpoint_the_loader_cannot_read_loads_through_transformers(tiny_dirs):
    """GPT-OSS keeps its experts fused (interleaved, with biases): the loader says so before allocating, and a live
    run's session loads it as before."""
    with pytest.raises(StreamingUnsupported, match="gpt_oss"):
        stream_moe_model(tiny_dirs["gpt_oss"], torch.float32)
    target, _, _ = Session().numerics(tiny_dirs["gpt_oss"], stream=True)
    assert target.loaded_by == "transformers from_pretrained"


PEAK = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from conftest import spec
    from specter.runs import live
    from specter.runs.execute import prepare
    from specter.session import Session

    def request(model):
        return dict(system="on-demand", model=model, dataset="code", hardware="a100-40gb-pcie4", engine="live",
                    out=str(Path(sys.argv[2]) / "unused.jsonl"), num_prompts=1, prefix_tokens=16, max_new_tokens=4,
                    resident_per_layer=2, warmup_prompts=0)

    def status(key):
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

    session = Session()  # the same loading on a tiny checkpoint first: imports and lazily built caches
    p = prepare(spec(**request(sys.argv[4])), session)
    live.runtime(p, session)
    del p, session
    open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here
    base = status("VmRSS")
    session = Session()
    p = prepare(spec(**request(sys.argv[1])), session)
    runtime = live.runtime(p, session)
    print(json.dumps({"peak": status("VmHWM") - base, "loaded_by": p.target.loaded_by,
                      "shared": len(runtime.store.shared_layers), "layers": len(runtime.store.layers)}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_a_live_runs_loading_peaks_within_1_2x_the_checkpoints_bytes(tiny_dirs, tmp_path):
    """A fresh process loads a 52 MB Mixtral-class checkpoint for a live on-demand run (target, tokenizer, prompts,
    host store, slots): its peak resident memory beyond what it held before stays within 1.2x the checkpoint's
    bytes. Loading through transformers and copying into a store measures about 2.4x."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specter.models.tiny import save_tiny_model

    big = save_tiny_model("mixtral", tmp_path / "big")
    config = json.loads((big / "config.json").read_text())
    config.update(hidden_size=256, intermediate_size=512, num_hidden_layers=4)
    (big / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(big))).save_pretrained(str(big))
    checkpoint = sum(f.stat().st_size for f in big.glob("*.safetensors"))
    assert checkpoint > 40 * 2**20
    out = subprocess.run([sys.executable, "-c", PEAK, str(big), str(tmp_path), str(Path(__file__).parent),
                          tiny_dirs["mixtral"]], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["loaded_by"].startswith("safetensors") and measured["shared"] == measured["layers"]
    assert measured["peak"] <= 1.2 * checkpoint, (measured["peak"] / 2**20, checkpoint / 2**20)
