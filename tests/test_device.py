"""The device side: the host ExpertStore, the slot buffers and kernels behind every op, and `--engine cuda`.

On the CPU the runtime's kernels run under the simulated engine, in launch order, with `check=True`: every expert kernel
asserts that the slot or staging buffer it reads holds the expert it was asked for, which is how a slot overwritten
while still in use, or a copy into the wrong slot, would show. The CUDA tests run where a GPU is (gpu marker).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from specter.models import load_moe_model
from specter.models.experts import expert_ffn
from specter.numerics.forward import ForwardService
from specter.offload.device import DeviceRuntime, PackedLinearKernel
from specter.offload.store import ExpertStore
from specter.offload.work import ModelWork
from specter.quant.draft import load_draft
from specter.quant.packing import dequantize, pack
from specter.quant.quantize import quantize_draft
from specter.runs import schedule
from specter.systems import DecodeConfig, registry
from specter.timing import SimEngine, load_profile
from specter.timing.cost import CostModel

ARCHS = ("olmoe", "gpt_oss", "deepseek_v3")  # plain; biased and interleaved; a dense layer, shared experts and MLA


@pytest.fixture(scope="module")
def setups(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("device")
    out = {}
    for arch in ARCHS:
        quantize_draft(tiny_dirs[arch], root / arch, method="rtn", bits=4, group_size=32)
        target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
        draft = load_draft(target, root / arch)
        service = ForwardService(target)
        service.draft, service.draft_key = draft.moe, arch
        service.require(r for cls in registry().values() for r in cls.trace_recorders)  # what every system reads
        out[arch] = (target, draft, service, ExpertStore(target))
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_store_rows_are_the_experts(arch, setups):
    target, _, _, store = setups[arch]
    assert not store.pinned and store.expert_bytes == target.moe_layers[0].expert_bytes(torch.float16)
    x = torch.randn(3, target.config.hidden_size) * 0.1
    for layer in target.moe_layers:
        for e in (0, layer.num_experts - 1):
            views = store.layout.views(store.row(layer.layer_index, e))
            for name, t in layer.expert_weights(e).tensors().items():
                assert torch.equal(views.tensors()[name], t.to(torch.float16)), (layer.layer_index, e, name)
            got = expert_ffn(x, views.to(dtype=torch.float32))
            torch.testing.assert_close(got, layer.expert_forward(e, x), rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_packed_kernel_computes_the_dequantized_weight(bits):
    gen = torch.Generator().manual_seed(bits)
    out_f, in_f, g = 64, 96, 32
    codes = torch.randint(0, 2**bits, (out_f, in_f), generator=gen)
    zeros = torch.randint(0, 2**bits, (out_f, in_f // g), generator=gen)
    scales = torch.rand(out_f, in_f // g, generator=gen) * 0.01 + 0.001
    p = pack(codes, zeros, scales, g, bits)
    bias = torch.randn(out_f, generator=gen) * 0.01
    kernel = PackedLinearKernel(p, bias, torch.device("cpu"))
    assert bool(kernel.per_word) == (bits != 3)  # 3-bit codes straddle words: kept one byte each
    torch.testing.assert_close(kernel.weight_t().float(), dequantize(p).T, rtol=1e-3, atol=1e-4)
    x = torch.randn(5, in_f, generator=gen).half()
    torch.testing.assert_close(kernel(x).float(), x.float() @ dequantize(p).T + bias, rtol=2e-2, atol=2e-2)


def _runtime(setup, slots, max_tokens=24, max_context=64):
    target, draft, _, store = setup
    return DeviceRuntime(target, ModelWork.of(target), store, slots, "cpu", max_tokens=max_tokens,
                         max_context=max_context, draft=draft, check=True)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_system_reads_the_expert_it_asked_for_and_keeps_its_schedule(arch, setups):
    """Each system's ops with the device work attached: every expert kernel finds its expert in the buffer it reads
    (check=True), and attaching the work changes neither the tokens nor any time of the schedule."""
    target, draft, service, _ = setups[arch]
    work = ModelWork.of(target)
    profile = load_profile("a100-40gb-pcie4")
    vocab = target.config.vocab_size
    prompt, other = [(7 * i + 3) % vocab for i in range(12)], [(5 * i + 1) % vocab for i in range(12)]
    trace = service.trace(prompt, 16)
    warm = [service.trace(other, 16)]
    runtime = _runtime(setups[arch], slots=2)
    for name, cls in sorted(registry().items()):
        system = cls()
        slots = system.fixed_slots(work) if system.fixed_slots else 2
        device = runtime if slots == 2 else _runtime(setups[arch], slots)
        cfg = DecodeConfig(16, slots, 4, "adaptive", draft.quantized_bytes_per_expert)
        plain, plain_tl = schedule(system, SimEngine(profile), work, service, trace, cfg, CostModel(profile),
                                   lambda: warm)
        backed, backed_tl = schedule(system, SimEngine(profile), work, service, trace, cfg, CostModel(profile),
                                     lambda: warm, device)
        assert backed.tokens == plain.tokens == trace.tokens[:16], name
        assert backed.commit_times == plain.commit_times and backed_tl.spans == plain_tl.spans, name
        assert device.slot_holds, f"{name}: no expert reached a slot"
    assert runtime.staging_holds, "no system streamed an expert through a staging buffer"


def test_kernels_compute_the_experts_in_their_slots(setups):
    target, draft, _, store = setups["olmoe"]
    runtime = _runtime(setups["olmoe"], slots=3)
    layer = target.moe_layers[0]
    li = layer.layer_index
    runtime.copy_to_slot(li, 5, 1)()
    hidden = target.config.hidden_size
    x = runtime.x[:4, :hidden].float()
    torch.testing.assert_close(runtime.expert_in_slot(li, 5, 1, 4)().float(), layer.expert_forward(5, x),
                               rtol=5e-2, atol=5e-3)
    with pytest.raises(AssertionError, match="holds expert 5, not 6"):
        runtime.expert_in_slot(li, 6, 1, 4)()
    draft_layer = next(m for m in draft.moe.moe_layers if m.layer_index == li)
    torch.testing.assert_close(runtime.draft_expert(li, 2, 4)().float(), draft_layer.expert_forward(2, x),
                               rtol=5e-2, atol=5e-3)
    with pytest.raises(ValueError, match="sized for 24"):
        runtime.attention(li, 25, 30)()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_engine_cuda_without_a_gpu_is_refused(tiny_dirs, tmp_path):
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "on-demand", "--model",
                           tiny_dirs["olmoe"],
                           "--dataset", "code", "--hardware", "a100-40gb-pcie4", "--resident-per-layer", "2",
                           "--engine", "cuda", "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "--engine cuda needs a CUDA device" in errors[0], proc.stderr[-2000:]
    assert not out.exists()


@pytest.mark.gpu
def test_cuda_engine_runs_every_system_on_real_buffers(setups):
    """The same check as on the CPU, on CUDA streams: right experts in the slots, the recorded tokens."""
    from specter.timing.cuda import CudaEngine

    target, draft, service, _ = setups["olmoe"]
    work = ModelWork.of(target)
    profile = load_profile("a100-40gb-pcie4")
    store = ExpertStore(target, pin=True)
    assert store.pinned
    device = DeviceRuntime(target, work, store, 2, "cuda", max_tokens=24, max_context=64, draft=draft, check=True)
    trace = service.trace([(7 * i + 3) % target.config.vocab_size for i in range(12)], 16)
    for name, cls in sorted(registry().items()):
        system = cls()
        if system.fixed_slots:
            continue
        cfg = DecodeConfig(16, 2, 4, "adaptive", draft.quantized_bytes_per_expert)
        result, timeline = schedule(system, CudaEngine(), work, service, trace, cfg, CostModel(profile),
                                    lambda: [trace], device)
        assert result.tokens == trace.tokens[:16], name
        assert all(b >= a for a, b in zip(result.commit_times, result.commit_times[1:])), name
        assert timeline.busy_seconds("h2d") > 0, name


@pytest.mark.gpu
def test_specter_run_engine_cuda_writes_measured_records(tiny_dirs, tmp_path):
    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["mixtral"], draft, method="rtn", bits=4, group_size=32)
    records = {}
    for engine in ("sim", "cuda"):
        out = tmp_path / f"{engine}.jsonl"
        proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "specter", "--model",
                               tiny_dirs["mixtral"], "--draft", str(draft), "--dataset", "code", "--hardware",
                               "h100-pcie5", "--resident-per-layer", "2", "--k", "4", "--max-new-tokens", "16",
                               "--engine", engine, "--out", str(out)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        records[engine] = [json.loads(line) for line in out.read_text().splitlines()]
    for sim, cuda in zip(records["sim"], records["cuda"]):
        assert cuda["engine"] == "cuda" and cuda["simulated"] is False and sim["simulated"] is True
        assert cuda["output_token_ids"] == sim["output_token_ids"]
        assert cuda["tpot_ms"] > 0 and cuda["extra"]["simulated_tpot_ms"] == pytest.approx(sim["tpot_ms"])
        assert cuda["config"]["device"]["store_pinned"] is True


def test_run_engine_cuda_path_on_the_cpu(tiny_dirs, tmp_path, monkeypatch):
    """`specter run --engine cuda`'s own steps (recorded run, warm-up, timed run on the device buffers, its record
    fields), with the CUDA engine and device stood in for by the simulator and the CPU: the timed run computes no
    numerics, commits the recorded tokens, and its records say measured, with the simulated TPOT beside."""
    import specter.runs.device as on_device
    from conftest import spec
    from specter import timing
    from specter.runs import execute

    made = []

    def engine(kind, profile):
        made.append(kind)
        return SimEngine(profile)

    monkeypatch.setattr(on_device, "CUDA_DEVICE", "cpu")
    monkeypatch.setattr(timing, "make_engine", engine)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "stand-in")
    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["olmoe"], draft, method="rtn", bits=4, group_size=32)
    request = dict(model=tiny_dirs["olmoe"], dataset="code", hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"),
                   draft=str(draft), num_prompts=2, max_new_tokens=12, resident_per_layer=2, k=3)
    for system in ("specter", "fiddler", "naive"):
        sim = execute(spec(system=system, **request), progress=False)
        made.clear()
        cuda = execute(spec(system=system, engine="cuda", **request), progress=False)
        assert made == ["sim", "cuda", "cuda", "sim", "cuda"], made  # recorded, warm-up and timed; then prompt 2
        for s, c in zip(sim, cuda):
            assert c.output_token_ids == s.output_token_ids and c.engine == "cuda" and not c.simulated
            assert c.hardware == "stand-in" and c.config["device"]["name"] == "stand-in"
            assert c.extra["simulated_tpot_ms"] == s.tpot_ms and c.extra["simulated_on"] == "a100-40gb-pcie4"
    made.clear()  # repeats: each prompt timed twice from the same state, the warm-up once
    repeated = execute(spec(system="specter", engine="cuda", repeats=2, **request), progress=False)
    assert made == ["sim", "cuda", "cuda", "sim", "cuda", "sim", "cuda", "sim", "cuda"], made
    assert [(r.prompt_index, r.extra["repeat"]) for r in repeated] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r.extra["repeats"] == {"asked": 2, "timed": 2} for r in repeated)
    # the copied-KV arm on the device buffers: the draft's own KV, copied from the target's
    copied = execute(spec(system="specter", engine="cuda", system_options=(("draft-kv", "copied"),), **request),
                     progress=False)
    assert [c.output_token_ids for c in copied] == [s.output_token_ids for s in execute(
        spec(system="specter", **request), progress=False)]
    with pytest.raises(Exception, match="--temperature 0.7 samples live"):
        execute(spec(system="specter", engine="cuda", temperature=0.7, **request), progress=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_device_memory_a_runtime_asks_for_is_what_it_allocates_and_is_checked_first(arch, setups, monkeypatch):
    """`DeviceRuntime.device_bytes` states, part by part, what the runtime then allocates (the slots, staging buffers,
    non-expert weights and KV cache it holds, on the CPU standing in); on CUDA a run that does not fit the device's
    free memory is refused in one line that names each part, before anything is allocated."""
    from specter.errors import SpecterError
    from specter.offload.device import require_device_memory

    target, draft, _, store = setups[arch]
    runtime = _runtime(setups[arch], slots=2)
    parts = DeviceRuntime.device_bytes(target, ModelWork.of(target), store, 2, 24, 64, draft)

    def held(tensors) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    assert parts["expert slots"] == held(runtime.slots.values())
    assert parts["staging buffers"] == held([runtime.staging])
    assert parts["non-expert weights"] == held([w for ws in runtime.layer_weights.values() for w in ws]) + held(
        [runtime.head])
    assert parts["KV cache"] == held([t for kv in runtime.kv.values() for t in kv])
    kernels = [getattr(e, n) for e in runtime.draft_experts.values() for n in ("gate_proj", "up_proj", "down_proj")]
    assert parts["draft experts"] == held([t for k in kernels for name, t in vars(k).items()
                                           if isinstance(t, torch.Tensor) and name != "shifts"]) > 0

    def free_memory(device):
        return (sum(parts.values()) - 1, 80 * 10**9)

    monkeypatch.setattr(torch.cuda, "mem_get_info", free_memory)
    with pytest.raises(SpecterError, match=r"needs [\d.]+ MB on cuda \(.*expert slots [\d.]+ MB.*\), and [\d.]+ MB of "
                                           r"its 80.00 GB are free; lower --resident-per-layer"):
        require_device_memory(torch.device("cuda"), parts)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (sum(parts.values()), 80 * 10**9))
    require_device_memory(torch.device("cuda"), parts)  # exactly fits
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (_ for _ in ()).throw(AssertionError("queried")))
    require_device_memory(torch.device("cpu"), parts)  # never asked off CUDA
