"""The streaming loader (`specter.models.streaming`): every class it reads loads bit for bit as transformers loads
it, its experts as the rows the host store adopts without a copy, and a live run's loading holds the checkpoint's
bytes once (peak resident memory, measured in a fresh process)."""

from __future__ import annotations

import json
import shutil
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


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3"])
def test_a_packed_draft_computes_what_the_dense_draft_computes(arch, tiny_dirs, rtn_drafts):
    """The live engine's draft keeps its GPTQ codes (no dense weight anywhere in its experts) and dequantizes them on
    each call to the very weights the dense draft holds: the same logits, bit for bit."""
    from specter.quant.draft import DequantizedLinear, PackedQuantLinear, load_draft

    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    dense = load_draft(target, rtn_drafts[arch])
    packed = load_draft(target, rtn_drafts[arch], packed=True)
    kinds = {type(m) for m in packed.model.modules()}
    assert PackedQuantLinear in kinds and DequantizedLinear not in kinds
    prompt = torch.tensor([list(range(5, 21))])
    with torch.no_grad():
        assert torch.equal(dense.model(input_ids=prompt).logits, packed.model(input_ids=prompt).logits)
    packed_bytes = sum(b.numel() * b.element_size() for m in packed.model.modules()
                       if isinstance(m, PackedQuantLinear) for b in m.buffers())
    dense_bytes = sum(b.numel() * b.element_size() for m in dense.model.modules()
                      if isinstance(m, DequantizedLinear) for b in m.buffers())
    assert packed_bytes < dense_bytes / 4


PEAK = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[1])
    from conftest import spec
    from specter.runs import live
    from specter.runs.execute import prepare
    from specter.session import Session

    model, draft, warm_model, warm_draft, system, out = sys.argv[2:8]

    def request(model, draft):
        return dict(system=system, model=model, draft=draft, dataset="code", hardware="a100-40gb-pcie4", k=2,
                    engine="live", out=out, num_prompts=1, prefix_tokens=16, max_new_tokens=4, resident_per_layer=2,
                    warmup_prompts=0)

    def status(key):
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

    session = Session()  # the same loading of a tiny checkpoint first: imports and lazily built caches
    p = prepare(spec(**request(warm_model, warm_draft)), session)
    live.runtime(p, session)
    del p, session
    open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here
    base = status("VmRSS")
    session = Session()
    p = prepare(spec(**request(model, draft)), session)
    runtime = live.runtime(p, session)
    dense = [n for n, m in p.draft.model.named_modules() if type(m).__name__ == "DequantizedLinear"] if p.draft else []
    device = sum(t.numel() * t.element_size() for t in (*runtime.slots.values(), runtime.staging))
    print(json.dumps({"peak": status("VmHWM") - base - device, "loaded_by": p.target.loaded_by,
                      "dense_draft": dense[:3], "shared": len(runtime.store.shared_layers),
                      "layers": len(runtime.store.layers)}))
""")


@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A 151 MB Mixtral-class checkpoint (4 layers of 8 experts, hidden 512, intermediate 768) and its INT4 draft."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specter.models.tiny import save_tiny_model
    from specter.quant.quantize import quantize_draft

    root = tmp_path_factory.mktemp("large")
    model = save_tiny_model("mixtral", root / "model")
    config = json.loads((model / "config.json").read_text())
    config.update(hidden_size=512, intermediate_size=768, num_hidden_layers=4)
    (model / "config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model))).save_pretrained(str(model))
    quantize_draft(str(model), root / "draft", method="rtn", bits=4, group_size=64)
    return model, root / "draft"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
@pytest.mark.parametrize("system", ["on-demand", "specter"])
def test_a_live_runs_loading_peaks_within_1_2x_what_it_reads(system, large, tiny_dirs, rtn_drafts, tmp_path):
    """A fresh process loads a 151 MB checkpoint for a live run (target, tokenizer, prompts, host store, and for
    Specter its INT4 draft): its peak resident memory beyond what it held before, less the device's slots and staging
    buffers (device memory, which the CPU as device keeps in the same RAM), stays within 1.2x the bytes it reads (the
    checkpoint, and the draft's file), and no dense draft is built. Loading through transformers and copying the
    experts into a store peaked at about 2.4x the checkpoint on a 52 MB one."""
    model, draft = large
    read = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    if system == "specter":
        read += (draft / "experts.safetensors").stat().st_size
    assert read > 140 * 2**20
    out = subprocess.run([sys.executable, "-c", PEAK, str(Path(__file__).parent), str(model), str(draft),
                          tiny_dirs["mixtral"], rtn_drafts["mixtral"], system, str(tmp_path / "unused.jsonl")],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    assert measured["loaded_by"].startswith("safetensors") and measured["shared"] == measured["layers"]
    assert measured["dense_draft"] == []
    assert measured["peak"] <= 1.2 * read, (measured["peak"] / 2**20, read / 2**20)


def test_the_disk_tier_maps_the_experts_from_files_it_builds_once(tiny_dirs, tmp_path, monkeypatch):
    """`experts_on="disk"`: each MoE layer's expert rows are a memory-mapped file of the suite's cache, the model equal
    to transformers' load (every tensor, the logits), the store adopting the mapped rows; a second load maps the same
    files without writing them; a write into a loaded model's rows never reaches them (a private mapping)."""
    import os

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    loaded = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    streamed = stream_moe_model(tiny_dirs["mixtral"], torch.float32, experts_on="disk")
    tier = streamed.experts_on_disk
    assert tier is not None and str(tier).startswith(str(tmp_path / "cache")) and "disk tier" in streamed.loaded_by
    files = sorted(tier.glob("layer-*.bin"))
    assert len(files) == len(streamed.moe_layers)
    want, got = loaded.model.state_dict(), streamed.model.state_dict()
    assert set(want) == set(got) and all(torch.equal(want[n], got[n]) for n in want)
    prompt = torch.tensor([list(range(5, 21))])
    with torch.no_grad():
        assert torch.equal(loaded.model(input_ids=prompt).logits, streamed.model(input_ids=prompt).logits)
    store = ExpertStore(streamed, dtype=torch.float32, share=True)
    assert store.shared_layers == list(store.layers)  # the mapped rows themselves, no copy in memory
    stamps = [os.stat(f).st_mtime_ns for f in files]
    again = stream_moe_model(tiny_dirs["mixtral"], torch.float32, experts_on="disk")
    assert again.experts_on_disk == tier and [os.stat(f).st_mtime_ns for f in files] == stamps
    first = again.moe_layers[0].layer_index
    ExpertStore(again, dtype=torch.float32, share=True).layers[first].mul_(-3.0)
    on_file = torch.from_file(str(files[0]), shared=False, size=store.layers[first].numel(), dtype=torch.float32)
    assert torch.equal(on_file.view_as(store.layers[first]), store.layers[first])  # the file still holds the experts


def test_the_disk_tier_is_chosen_where_the_checkpoint_exceeds_memory_and_refused_damaged(tiny_dirs, tmp_path,
                                                                                      monkeypatch):
    """`auto` keeps the experts in memory where the checkpoint fits the memory available, on disk where it does not;
    a checkpoint with a NaN among its experts is refused while its tier is built, and no tier is left behind; the
    disk tier with no cache to keep it in is refused in one line; `--host-store disk` needs the live engine."""
    from safetensors.torch import load_file, save_file

    from conftest import spec
    from specter.errors import SpecterError
    from specter.models import streaming

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    assert stream_moe_model(tiny_dirs["olmoe"], torch.float32, experts_on="auto").experts_on_disk is None
    monkeypatch.setattr(streaming, "available_memory", lambda: 1024)
    assert stream_moe_model(tiny_dirs["olmoe"], torch.float32, experts_on="auto").experts_on_disk is not None

    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for f in Path(tiny_dirs["mixtral"]).iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    for shard in damaged.glob("*.safetensors"):
        tensors = load_file(str(shard))
        for name in tensors:
            if ".experts." in name and name.endswith("w2.weight"):
                tensors[name][0, 0] = float("nan")
        save_file(tensors, str(shard), metadata={"format": "pt"})
    (damaged / "model_card.json").unlink(missing_ok=True)
    with pytest.raises(SpecterError, match="hold NaN or infinite values"):
        stream_moe_model(damaged, torch.float32, experts_on="disk")
    assert not streaming.disk_tier_dir(damaged, torch.float32).exists()

    monkeypatch.setenv("SPECTER_CACHE_DIR", "")
    with pytest.raises(SpecterError, match="the disk tier keeps the experts in the suite's cache"):
        stream_moe_model(tiny_dirs["olmoe"], torch.float32, experts_on="disk")
    for setting, message in ((dict(host_store="disk"), "--host-store disk keeps a live run's experts; add --engine"),
                             (dict(live_device="cuda"), "--device cuda names the live engine's device; add --engine"),
                             (dict(live_draft_kernel="packed"), "--live-draft-kernel packed picks the live draft's")):
        with pytest.raises(SpecterError, match=message + ".*--engine sim does not read it"):
            spec(system="on-demand", model=tiny_dirs["olmoe"], dataset="code", hardware="a100-40gb-pcie4",
                 resident_per_layer=2, **setting).check_names()


def test_a_live_run_from_the_disk_tier_decodes_the_recorded_tokens_and_says_where_its_experts_were(
        tiny_dirs, rtn_drafts, tmp_path, monkeypatch):
    from conftest import spec
    from specter.runs.execute import execute

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    request = dict(system="specter", model=tiny_dirs["mixtral"], draft=rtn_drafts["mixtral"], dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"), num_prompts=1, prefix_tokens=16,
                   max_new_tokens=8, resident_per_layer=2, k=3, warmup_prompts=0)
    session = Session()
    simulated = execute(spec(**request), session, progress=False)
    live = execute(spec(**request, engine="live", host_store="disk"), Session(), progress=False)
    assert live[0].output_token_ids == simulated[0].output_token_ids
    assert live[0].config["device"]["experts_on_host"].startswith("memory-mapped from the disk tier")
    assert live[0].config["host_store"] == "disk"


ANON = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from conftest import spec
    from specter.runs import live
    from specter.runs.execute import prepare
    from specter.session import Session

    model, draft, warm_model, warm_draft, host_store, out, cache = sys.argv[2:9]
    os.environ["SPECTER_CACHE_DIR"] = cache  # one cache for the processes of one test (conftest made its own)

    def request(model, draft):
        return dict(system="on-demand", model=model, draft=draft, dataset="code", hardware="a100-40gb-pcie4",
                    engine="live", out=out, num_prompts=1, prefix_tokens=16, max_new_tokens=4, resident_per_layer=2,
                    warmup_prompts=0, host_store=host_store)

    def status(key):
        return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))

    session = Session()  # imports and lazily built caches first, on a tiny checkpoint
    p = prepare(spec(**request(warm_model, warm_draft)), session)
    live.runtime(p, session)
    del p, session
    base = status("RssAnon")
    session = Session()
    p = prepare(spec(**request(model, draft)), session)
    runtime = live.runtime(p, session)
    device = sum(t.numel() * t.element_size() for t in (*runtime.slots.values(), runtime.staging))
    experts = sum(r.numel() * r.element_size() for r in runtime.store.layers.values())
    print(json.dumps({"anon": status("RssAnon") - base - device, "experts": experts,
                      "on_disk": str(p.target.experts_on_disk)}))
""")


@pytest.mark.slow  # three fresh processes loading a 151 MB checkpoint: about 50 s
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc/self/status")
def test_the_disk_tier_keeps_the_experts_out_of_anonymous_memory(large, tiny_dirs, rtn_drafts, tmp_path):
    """A fresh process loads a 151 MB checkpoint for a live run: with its experts in memory its anonymous memory grows
    by at least their bytes; from the disk tier (built by a first process, mapped by a second) by under a quarter of
    them: the experts are pages of files, which the kernel may drop and read again."""
    model, draft = large
    measured = {}
    for name, store in (("memory", "memory"), ("build", "disk"), ("mapped", "disk")):
        out = subprocess.run([sys.executable, "-c", ANON, str(Path(__file__).parent), str(model), str(draft),
                              tiny_dirs["mixtral"], rtn_drafts["mixtral"], store, str(tmp_path / "unused.jsonl"),
                              str(tmp_path / "cache")], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        measured[name] = json.loads(out.stdout.strip().splitlines()[-1])
        if name == "build":
            built = {f: f.stat().st_mtime_ns for f in (tmp_path / "cache" / "expert-rows").glob("*/layer-*.bin")}
    assert built and {f: f.stat().st_mtime_ns for f in built} == built  # the second process mapped what the first built
    experts = measured["memory"]["experts"]
    assert experts > 140 * 2**20 and measured["memory"]["on_disk"] == "None"
    assert measured["memory"]["anon"] >= 0.9 * experts, measured
    for name in ("build", "mapped"):
        assert measured[name]["on_disk"].startswith(str(tmp_path / "cache" / "expert-rows")), measured[name]
        assert measured[name]["anon"] < 0.25 * experts, (name, measured[name]["anon"] / 2**20, experts / 2**20)


def test_a_sharded_checkpoint_is_read_from_the_shards_its_index_lists_and_nothing_beside_them(tiny_dirs, tmp_path):
    """A checkpoint as Mistral publishes one: shards, their index, and a `consolidated.safetensors` beside them that
    the index does not list (here of other values). Every loader reads the shards (as transformers does): the
    streamed model is the model transformers loads from the same folder, and the model's hash is that of its shards."""
    from safetensors.torch import load_file, save_file

    from specter.models.integrity import model_hash, weight_files

    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["mixtral"], model)
    tensors = load_file(str(model / "model.safetensors"))
    (model / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, str(model / file), metadata={"format": "pt"})
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: f for f, part in halves.items() for n in part}}))
    sharded_hash = model_hash(model)
    save_file({n: torch.randn_like(t) if t.is_floating_point() else t for n, t in tensors.items()},
              str(model / "consolidated.safetensors"), metadata={"format": "pt"})
    assert [f.name for f in weight_files(model)] == sorted(halves)
    assert model_hash(model) == sharded_hash
    loaded = load_moe_model(str(model), dtype=torch.float32)
    streamed = stream_moe_model(str(model), torch.float32)
    want, got = loaded.model.state_dict(), streamed.model.state_dict()
    assert set(want) == set(got) and all(torch.equal(want[n], got[n]) for n in want)
    original = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32).model.state_dict()
    assert all(torch.equal(original[n], got[n]) for n in original)
