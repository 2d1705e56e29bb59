"""The timing engines' semantics, the cost model, hardware presets and profiles, and the lower bound."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from specter.errors import SpecterError
from specter.timing import COMPUTE, H2D, HOST, CostModel, Op, SimEngine, load_profile, preset_names
from specter.timing.bounds import PassWork, belady_loads, decode_lower_bound_seconds
from specter.timing.hardware import profile_from_dict


def _unit_profile(**over):
    """A profile where numbers are easy: 1 TFLOP/s, 1 GB/s memory, 1 GB/s link, no overheads."""
    data = {
        "name": "unit",
        "device": {"peak_tflops": 1.0, "memory_bandwidth_gbps": 1.0, "launch_overhead_us": 0, "host_sync_us": 0,
                   "memory_gb": 1},
        "link": {"h2d_pinned_gbps": 1.0, "h2d_pageable_gbps": 0.5, "latency_us": 0},
        "host": {"peak_tflops": 0.1, "memory_bandwidth_gbps": 1.0, "launch_overhead_us": 0, "dispatch_us": 0,
                 "policy_us": 0},
    }
    for key, value in over.items():
        section, field = key.split("__")
        data[section][field] = value
    return profile_from_dict(data)


MS10_COPY = Op("copy", bytes_copied=10e6)  # 10 MB at 1 GB/s = 10 ms
MS10_COMPUTE = Op("compute", flops=10e9)  # 10 GFLOP at 1 TFLOP/s = 10 ms


def test_copy_and_compute_on_two_streams_overlap():
    eng = SimEngine(_unit_profile())
    eng.launch(H2D, MS10_COPY)
    eng.launch(COMPUTE, MS10_COMPUTE)
    assert eng.synchronize() == pytest.approx(0.010)


def test_compute_waiting_on_copy_event_ends_at_20ms():
    eng = SimEngine(_unit_profile())
    eng.launch(H2D, MS10_COPY)
    eng.wait(COMPUTE, eng.record(H2D))
    eng.launch(COMPUTE, MS10_COMPUTE)
    done = eng.record(COMPUTE)
    assert eng.event_time(done) == pytest.approx(0.020)
    assert eng.timeline.stall_seconds(COMPUTE, waited_on=H2D) == pytest.approx(0.010)


def _chain_tpot(dispatch_us: float, ops: list[Op]) -> float:
    eng = SimEngine(_unit_profile(host__dispatch_us=dispatch_us, device__launch_overhead_us=2))
    for op in ops:
        eng.launch(COMPUTE, op)
    return eng.synchronize()


def test_a_chain_of_tiny_ops_is_launch_bound_and_one_large_op_device_bound():
    """1,000 tiny kernels take what the host needs to dispatch them, and more as dispatch grows; one large kernel
    takes its own time whatever the dispatch."""
    tiny = [Op(f"tiny{i}", flops=1e3) for i in range(1000)]  # 1 ns of arithmetic, 2 us of device launch each
    assert _chain_tpot(0, tiny) == pytest.approx(1000 * 2e-6, rel=1e-3)  # no dispatch: the device's own launches
    assert _chain_tpot(10, tiny) == pytest.approx(1000 * 10e-6, rel=1e-2)  # launch-bound: the host's dispatch
    assert _chain_tpot(20, tiny) == pytest.approx(2 * _chain_tpot(10, tiny), rel=1e-2)  # grows with dispatch
    large = [Op("large", flops=10e9)]  # 10 ms
    assert _chain_tpot(0, large) == pytest.approx(0.010 + 2e-6)
    assert _chain_tpot(20, large) == pytest.approx(_chain_tpot(0, large), abs=21e-6)  # only its one launch


def test_an_op_of_many_kernels_waits_for_its_last_launch():
    """An op that stands for 100 kernels, dispatched at 10 us each, cannot end before its last kernel is launched."""
    eng = SimEngine(_unit_profile(host__dispatch_us=10))
    eng.launch(COMPUTE, Op("fused", flops=1e6, launches=100))  # 1 us of arithmetic
    assert eng.event_time(eng.record(COMPUTE)) == pytest.approx(100 * 10e-6 + 1e-6 / 100)
    assert eng.now() == pytest.approx(100 * 10e-6)


def test_a_host_read_waits_for_the_device_then_pays_the_sync():
    eng = SimEngine(_unit_profile(host__dispatch_us=10, device__host_sync_us=15))
    eng.launch(COMPUTE, MS10_COMPUTE)
    assert eng.now() == pytest.approx(10e-6)  # the host ran ahead: it only launched
    done = eng.synchronize(eng.record(COMPUTE))
    assert done == pytest.approx(10e-6 + 0.010 + 15e-6) and eng.now() == done
    eng.launch(COMPUTE, Op("next", flops=1e3))  # launched after the read: starts after it and its dispatch
    assert eng.timeline.spans[-1].start == pytest.approx(done + 10e-6)


def test_copies_overlap_the_host_s_work():
    """A copy launched before the host dispatches a chain of kernels and does its policy work runs beside them; on a
    synchronous device (the CPU as device) nothing overlaps."""
    def run(synchronous: bool) -> float:
        eng = SimEngine(_unit_profile(host__dispatch_us=10, host__policy_us=4000, device__synchronous=synchronous))
        eng.launch(H2D, MS10_COPY)  # 10 ms on the link
        for i in range(500):  # 5 ms of host dispatch
            eng.launch(COMPUTE, Op(f"tiny{i}", flops=1e3))
        eng.policy("policy")  # 4 ms of the runtime's own work
        return eng.synchronize()

    assert run(False) == pytest.approx(0.010 + 10e-6, rel=1e-3)  # the copy hides the 9 ms of host work
    assert run(True) == pytest.approx(0.010 + 10e-6 + 500 * (10e-6 + 1e-9) + 0.004, rel=1e-3)


def test_a_host_sync_costs_the_profile_s_time_and_delays_what_the_host_launches_next():
    """Reading a device result costs host_sync: the next op the host launches starts that much later."""
    eng = SimEngine(_unit_profile(device__host_sync_us=15))
    eng.launch(COMPUTE, MS10_COMPUTE)
    assert eng.synchronize(eng.record(COMPUTE)) == pytest.approx(0.010 + 15e-6)
    eng.launch(COMPUTE, MS10_COMPUTE)
    assert eng.event_time(eng.record(COMPUTE)) == pytest.approx(0.020 + 15e-6)
    assert [round(s.end - s.start, 9) for s in eng.timeline.spans if s.stream == "sync"] == [15e-6]


def test_ops_on_one_stream_serialize():
    eng = SimEngine(_unit_profile())
    for _ in range(3):
        eng.launch(COMPUTE, MS10_COMPUTE)
    assert eng.event_time(eng.record(COMPUTE)) == pytest.approx(0.030)
    spans = [s for s in eng.timeline.spans if s.stream == COMPUTE]
    assert [round(s.start, 6) for s in spans] == [0.0, 0.01, 0.02]


def test_host_synchronize_delays_later_launches():
    eng = SimEngine(_unit_profile())
    eng.launch(H2D, MS10_COPY)
    eng.synchronize(eng.record(H2D))  # host blocks on the copy
    eng.launch(COMPUTE, MS10_COMPUTE)  # so compute cannot start before 10 ms
    assert eng.event_time(eng.record(COMPUTE)) == pytest.approx(0.020)


def test_numerics_run_and_return():
    eng = SimEngine(_unit_profile())
    out = eng.launch(COMPUTE, Op("add", fn=lambda: torch.ones(2) + 1, flops=2))
    assert torch.equal(out, torch.full((2,), 2.0))


def _schedule(eng):
    for i in range(20):
        eng.launch(H2D, Op(f"copy{i}", bytes_copied=1e6 * (i % 3 + 1), pinned=i % 2 == 0))
        if i % 4 == 0:
            eng.wait(COMPUTE, eng.record(H2D))
        eng.launch(COMPUTE, Op(f"k{i}", flops=3e9, bytes_read=2e6, launches=2))
        eng.launch(HOST, Op(f"h{i}", flops=1e8))
        if i % 5 == 0:
            eng.synchronize(eng.record(COMPUTE))
    return eng.finish()


def test_identical_schedules_give_identical_times():
    a = _schedule(SimEngine(load_profile("a100-40gb-pcie4")))
    b = _schedule(SimEngine(load_profile("a100-40gb-pcie4")))
    assert a.spans == b.spans and a.stalls == b.stalls


def test_cost_model_roofline_and_copy():
    cost = CostModel(_unit_profile(device__launch_overhead_us=5, link__latency_us=10))
    assert cost.compute_seconds(flops=1e9, bytes_read=0) == pytest.approx(5e-6 + 1e-3)  # compute bound
    assert cost.compute_seconds(flops=0, bytes_read=2e6) == pytest.approx(5e-6 + 2e-3)  # memory bound
    assert cost.copy_seconds(1e6, pinned=True) == pytest.approx(10e-6 + 1e-3)
    assert cost.copy_seconds(1e6, pinned=False) == pytest.approx(10e-6 + 2e-3)
    assert cost.host_seconds(flops=1e9, bytes_read=0) == pytest.approx(10e-3)


def test_bandwidth_by_size_interpolates_in_log_size():
    prof = _unit_profile()
    data = prof.to_yaml_dict()
    data["link"]["h2d_by_size"] = [
        {"bytes": 1000, "pinned_gbps": 1.0, "pageable_gbps": 0.5},
        {"bytes": 100000, "pinned_gbps": 3.0, "pageable_gbps": 1.5},
    ]
    data["link"].update(h2d_pinned_gbps=3.0, h2d_pageable_gbps=1.5)  # the largest point's, as measured
    p = profile_from_dict(data)
    assert p.h2d_bandwidth(10000) == pytest.approx(2e9)
    assert p.h2d_bandwidth(10, pinned=False) == pytest.approx(0.5e9)
    assert p.h2d_bandwidth(10**9) == pytest.approx(3e9)


@pytest.mark.parametrize("name", ["a100-40gb-pcie4", "rtx4090-pcie4", "rtx3090-pcie4", "h100-pcie5", "h200-pcie5",
                                  "t4-pcie3", "rtx-a5000-pcie4"])
def test_every_preset_loads_with_sources(name):
    assert name in preset_names()
    p = load_profile(name)
    assert p.name == name and p.h2d_pinned_bandwidth > p.h2d_pageable_bandwidth


@pytest.mark.parametrize("name", preset_names())
def test_every_number_of_every_preset_has_a_source(name):
    """Each number of a shipped preset (device, link, host) names where it comes from, in a sentence."""
    from importlib.resources import files

    data = yaml.safe_load(files("specter.presets").joinpath("hardware", f"{name}.yaml").read_text())
    numbers = [f"{section}.{key}" for section in ("device", "link", "host")
               for key, value in data[section].items() if isinstance(value, (int, float)) and not isinstance(
                   value, bool)]
    assert len(numbers) >= 11
    missing = [key for key in numbers if len(str(data["sources"].get(key, "")).split()) < 3]
    assert not missing, f"{name}: no source for {missing}"


def test_the_paper_machine_prices_its_host_from_the_paper_s_cpu():
    p = load_profile("a100-40gb-pcie4")
    assert "Xeon Silver 4310" in p.host_name and "Xeon Silver 4310" in p.sources["host.name"]
    assert p.host_peak_flops == pytest.approx(24 * 2.1e9 * 32, rel=1e-3)
    assert p.host_memory_bandwidth == pytest.approx(2 * 8 * 2666.67e6 * 8, rel=1e-3)


def test_profile_round_trips_through_yaml(tmp_path):
    p = load_profile("a100-40gb-pcie4")
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(p.to_yaml_dict()))
    assert load_profile(path) == p


def test_unknown_preset_lists_known_ones():
    with pytest.raises(SpecterError, match="known presets: a100-40gb-pcie4, h100-pcie5"):
        load_profile("a100-80gb")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d["link"].pop("h2d_pinned_gbps"), "missing field link.h2d_pinned_gbps"),
        (lambda d: d["device"].__setitem__("peak_tflops", -3), "device.peak_tflops must be positive"),
        (lambda d: d["link"].__setitem__("latency_us", -1), "link.latency_us must be non-negative"),
        (lambda d: d["host"].__setitem__("memory_bandwidth_gbps", "fast"), "must be a finite number"),
        (lambda d: d.pop("host"), "missing section 'host'"),
    ],
)
def test_bad_profile_is_one_clear_error(tmp_path, mutate, message):
    data = load_profile("t4-pcie3").to_yaml_dict()
    mutate(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecterError, match=message):
        load_profile(path)


def test_profile_bandwidth_cpu_writes_a_profile_hardware_accepts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "specter", "profile-bandwidth", "--out", str(tmp_path), "--device", "cpu",
         "--max-bytes", str(1 << 20)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    p = load_profile(tmp_path / "profile.yaml")
    assert p.measured and len(p.h2d_by_size) == 5  # 4 KiB .. 1 MiB
    assert p.host_launch_overhead > 0 and p.host_dispatch > 0  # the CPU's op and a decode step's op, timed
    assert p.device_synchronous and p.device_launch_overhead == 0  # the CPU is the device: dispatch is its op's cost
    rows = (tmp_path / "bandwidth.csv").read_text().splitlines()
    assert rows[0] == "size_bytes,memory,median_s,gbps,repeats" and len(rows) == 6
    SimEngine(p).launch(H2D, Op("copy", bytes_copied=1 << 20))
    shown = subprocess.run([sys.executable, "-m", "specter", "hardware", str(tmp_path / "profile.yaml")],
                           capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("measured-cpu:"), shown.stderr


def test_dispatch_is_timed_on_the_class_and_widths_of_the_model_a_live_run_decodes(tiny_dirs, tmp_path):
    """`profile-bandwidth --dispatch-model DIR` times the host's dispatch on two decoder layers of the checkpoint's own
    class and widths (its config alone), its experts run eagerly as the suite loads them, and says so in the profile's
    sources; a directory with no model is refused in one line before anything is measured."""
    from specter.timing.dispatch import KernelCounter, decoder_moe

    model = decoder_moe("cpu", tiny_dirs["olmoe"])
    assert type(model).__name__ == "OlmoeForCausalLM" and model.config.num_hidden_layers == 2
    assert model.config.hidden_size == json.loads((Path(tiny_dirs["olmoe"]) / "config.json").read_text())[
        "hidden_size"] and model.config._experts_implementation == "eager"
    counter = KernelCounter()
    with counter, torch.no_grad():
        model(input_ids=torch.tensor([[1, 2]]))
    assert sum(counter.kernels.values()) > 0
    proc = subprocess.run(
        [sys.executable, "-m", "specter", "profile-bandwidth", "--out", str(tmp_path / "p"), "--device", "cpu",
         "--max-bytes", str(1 << 20), "--dispatch-model", tiny_dirs["olmoe"]], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    sources = yaml.safe_load((tmp_path / "p" / "profile.yaml").read_text())["sources"]["host.dispatch_us"]
    assert f"2 decoder layers of {Path(tiny_dirs['olmoe']).name}'s class and shapes" in sources
    bad = subprocess.run([sys.executable, "-m", "specter", "profile-bandwidth", "--out", str(tmp_path / "q"),
                          "--device", "cpu", "--dispatch-model", str(tmp_path / "nothing")],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "does not exist" in bad.stderr and not (tmp_path / "q" / "profile.yaml").exists()


def _rows(times_ms: dict[int, float], spread: float = 1.1):
    from specter.timing.profiler import CopyRow

    return [CopyRow(size, "host", t / 1e3, size / (t / 1e3) / 1e9, 10, spread) for size, t in times_ms.items()]


def test_the_profiler_refuses_copies_that_do_not_describe_a_link(monkeypatch):
    """A flat time across sizes (a busy core), a falling bandwidth or repeats spread widely are measured again, then
    refused in one line naming the cause; a clean curve passes."""
    from specter.timing import profiler

    mib = 1 << 20
    assert profiler.copy_fault(_rows({mib: 0.1, 4 * mib: 0.4, 16 * mib: 1.6})) is None
    assert "did not grow" in profiler.copy_fault(_rows({mib: 8.0, 4 * mib: 8.0, 16 * mib: 8.1}))
    assert "fell" in profiler.copy_fault(_rows({mib: 0.1, 4 * mib: 0.4, 16 * mib: 4.0}))
    assert "spread 5.0x" in profiler.copy_fault(_rows({mib: 0.1, 4 * mib: 0.4}, spread=5.0))
    assert profiler.copy_fault(_rows({4096: 0.001, 16384: 0.001}, spread=5.0)) is None  # too small to be bound
    flat = {(64 << 10) << i: 8.0 for i in range(5)}  # 64 KiB to 1 MiB, all 8 ms: a busy core, --max-bytes 1 MiB
    assert "8 ms at 65536 bytes and 8 ms at 1048576" in profiler.copy_fault(_rows(flat))
    one_stray = profiler._copy_row(mib, "host", [1e-4] * 9 + [9e-4])  # one repeat waited a scheduler slice
    assert one_stray.spread == pytest.approx(1.0) and one_stray.median_s == pytest.approx(1e-4)
    assert profiler._copy_row(mib, "host", [1e-4] * 5 + [5e-4] * 5).spread == pytest.approx(5.0)
    calls = []

    def busy():
        calls.append(1)
        return _rows({mib: 8.0, 4 * mib: 8.0})

    with pytest.raises(SpecterError, match="did not grow with the size, in each of 3 tries"):
        profiler._measured_rows(busy)
    assert len(calls) == profiler.MEASURE_TRIES
    tries = iter([_rows({mib: 8.0, 4 * mib: 8.0}), _rows({mib: 0.1, 4 * mib: 0.4})])
    assert profiler._measured_rows(lambda: next(tries))[0].median_s == pytest.approx(1e-4)  # measured again


def test_profiles_without_the_dispatch_figure_are_refused_with_the_fix(tmp_path):
    data = load_profile("t4-pcie3").to_yaml_dict()
    data["host"].pop("dispatch_us")
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecterError, match="missing field host.dispatch_us .*profile-bandwidth` measures it"):
        load_profile(path)
    data = load_profile("t4-pcie3").to_yaml_dict()
    data["device"]["synchronous"] = "yes"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SpecterError, match="device.synchronous must be true"):
        load_profile(path)


def test_belady_loads():
    # one slot, alternating experts: 1 stays cached (free fill), 2 streams through a staging buffer each time
    assert belady_loads([{1}, {2}, {1}, {2}], slots=1) == 2
    # two slots hold both: only the first fill, which is free
    assert belady_loads([{1}, {2}, {1}, {2}], slots=2) == 0
    assert belady_loads([{1}, {2}, {1}, {2}], slots=2, free_initial=False) == 2
    # Belady keeps the experts needed soonest (1, 2) and streams 3; LRU would evict 1 and miss twice more
    assert belady_loads([{1}, {2}, {3}, {1}, {2}], slots=2, free_initial=False) == 3
    # a step needing more experts than slots streams the excess
    assert belady_loads([{1, 2, 3}], slots=2, free_initial=False) == 3


def test_lower_bound_is_max_of_compute_and_link():
    cost = CostModel(_unit_profile())
    passes = [PassWork(tokens=1, flops=1e9, bytes_read=0, launches=1)] * 4  # 4 ms of compute
    assert decode_lower_bound_seconds(passes, link_bytes=2e6, cost=cost) == pytest.approx(4e-3)
    assert decode_lower_bound_seconds(passes, link_bytes=9e6, cost=cost) == pytest.approx(9e-3)


@pytest.mark.gpu
def test_cuda_engine_overlaps_copy_and_compute():
    from specter.timing.cuda import CudaEngine

    eng = CudaEngine()
    src = torch.ones(64 << 20, dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    eng.launch(H2D, Op("copy", fn=lambda: dst.copy_(src, non_blocking=True), bytes_copied=src.numel()))
    eng.launch(COMPUTE, Op("mm", fn=lambda: [a @ a for _ in range(20)], flops=20 * 2 * 4096**3))
    timeline = eng.finish()
    copy = next(s for s in timeline.spans if s.label == "copy")
    mm = next(s for s in timeline.spans if s.label == "mm")
    assert copy.start < mm.end and mm.start < copy.end  # they overlapped
    assert torch.equal(dst.cpu(), src)


def test_hqq_experts_cross_the_link_at_mixtral_offloadings_stored_bytes():
    """HQQ as Mixtral-Offloading stores an expert: packed codes, 8-bit scales and zeros of every 16 weights, FP16
    meta-scales and zeros of every 128 scales and one of the zeros."""
    from specter.timing.cost import hqq_expert_bytes, hqq_linear_bytes

    # [16, 128] at 2 bits: 16 / 4 rows of 128 code bytes; 128 groups of 16: 128 scale codes + one FP16 (scale,
    # zero) pair for them, 128 zero codes + one FP16 pair
    assert hqq_linear_bytes(16, 128, 2) == 512 + (128 + 4) + (128 + 4)
    assert hqq_linear_bytes(20, 128, 3) == 2 * 128 * 4 + (160 + 2 * 2 * 2) + (160 + 4)  # ten 3-bit codes an int32
    assert hqq_linear_bytes(16, 128, 4) == 8 * 128 + (128 + 4) + (128 + 4)
    mixtral = ((14336, 4096), (14336, 4096), (4096, 14336))
    params = 3 * 4096 * 14336
    assert hqq_expert_bytes(mixtral, 2) * 8 / params == pytest.approx(2 + 8 / 16 + 8 / 16 + 32 / (16 * 128), rel=1e-4)
    with pytest.raises(ValueError, match="2, 3 or 4 bits"):
        hqq_linear_bytes(16, 128, 8)


def test_gguf_q4_k_m_experts_at_llama_cpps_types_and_gguf_block_sizes():
    """GGUF Q4_K_M as llama.cpp quantizes an expert: gate and up at Q4_K (144 bytes a 256-weight block), down at Q6_K
    (210) in the layers `use_more_bits` names and Q4_K in the others, a row of no whole 256-weight block at Q5_0 or
    Q8_0 (22 or 34 bytes a 32-weight block); the expert priced at the MoE layers' mean."""
    from specter.timing.cost import gguf_expert_bytes, uses_more_bits

    assert [i for i in range(32) if uses_more_bits(i, 32)] == [0, 1, 2, 3, *range(6, 28, 3), 28, 29, 30, 31]
    mixtral = ((14336, 4096), (14336, 4096), (4096, 14336))
    q4k, q6k = 4096 * 56 * 144, 4096 * 56 * 210  # the down projection: 56 blocks a row of 14336
    assert gguf_expert_bytes(mixtral, tuple(range(32)), 32) == 2 * 14336 * 16 * 144 + (16 * q4k + 16 * q6k) // 32
    lite = ((1408, 2048), (1408, 2048), (2048, 1408))  # DeepSeek-V2-Lite: 1408 is no multiple of 256
    more = sum(uses_more_bits(i, 27) for i in range(1, 27))
    down = (more * 2048 * 44 * 34 + (26 - more) * 2048 * 44 * 22) / 26  # Q8_0 or Q5_0, 44 blocks of 32 a row
    assert gguf_expert_bytes(lite, tuple(range(1, 27)), 27) == round(2 * 1408 * 8 * 144 + down)
    with pytest.raises(ValueError, match="q4_k_m"):
        gguf_expert_bytes(mixtral, (0,), 1, "q8_0")


class _PendingCudaEvent:
    """A CUDA event's interface whose work has not completed: waiting on it would hang the host."""

    def __init__(self, done: bool, ms: float = 0.0) -> None:
        self.done, self.ms = done, ms

    def query(self) -> bool:
        return self.done

    def synchronize(self):
        raise AssertionError("the host waited on a prefetch's event")


class _Origin:
    def elapsed_time(self, handle) -> float:
        return handle.ms


def test_a_prefetch_s_event_query_never_blocks_the_host():
    """The planner asks after each draft step which prefetch batches have landed; on CUDA that is cudaEventQuery,
    never a synchronize: a pending batch stays pending, a landed one is timed from its event."""
    from types import SimpleNamespace

    from specter.speculation.lookahead import INITIAL_BW, PlannerState
    from specter.timing.cuda import CudaEngine
    from specter.timing.engine import Event

    engine = object.__new__(CudaEngine)  # no device here: the query path alone
    engine._origin = _Origin()
    pending = Event(H2D, handle=_PendingCudaEvent(done=False))
    landed = Event(H2D, handle=_PendingCudaEvent(done=True, ms=3.0))
    assert engine.landed(pending) is None
    assert engine.landed(landed) == pytest.approx(3e-3)
    state = PlannerState(pending=[(1e-3, 2_000_000, pending), (1e-3, 2_000_000, landed)])
    state.observe_copies(SimpleNamespace(engine=engine))
    assert [event for _, _, event in state.pending] == [pending]
    assert state.bw_est != INITIAL_BW  # the landed batch (2 MB in 2 ms) was folded in


def test_the_simulator_s_landed_is_its_event_time_once_the_host_has_passed_it():
    sim = SimEngine(_unit_profile())
    ev = sim.record(H2D)
    sim.launch(H2D, MS10_COPY)
    later = sim.record(H2D)
    assert sim.landed(ev) == ev.time
    assert sim.landed(later) is None  # 10 ms of copy ahead of the host's clock


def _breakdown_by_instants(spans, start, end):
    """The breakdown's definition, one instant at a time: between consecutive instants where any span starts or ends,
    the part is what runs then (draft, target with or without a copy, a copy alone, host compute, else idle)."""
    from specter.metrics import BREAKDOWN

    cuts = sorted({start, end, *(t for s in spans for t in (s.start, s.end) if start < t < end)})
    out = dict.fromkeys(BREAKDOWN, 0.0)
    for a, b in zip(cuts, cuts[1:]):
        on = [s for s in spans if s.start <= a and s.end >= b]
        draft = any(s.stream == COMPUTE and "draft" in s.label for s in on)
        target = any(s.stream == COMPUTE and "draft" not in s.label for s in on)
        link, host = any(s.stream == H2D for s in on), any(s.stream == HOST for s in on)
        part = ("draft" if draft else ("target compute, copies overlapped" if link else "target compute") if target
                else "stall on copies" if link else "host compute" if host else "host syncs and idle")
        out[part] += b - a
    return out


def test_the_breakdown_partitions_time_by_what_runs_at_each_instant():
    import random

    from specter.metrics import breakdown
    from specter.timing.engine import SYNC, Span

    spans = [Span(COMPUTE, "p.L0.attn", 0.0, 2.0), Span(H2D, "p.L0.demand.e1", 1.0, 4.0),
             Span(COMPUTE, "p.L0.e1", 4.0, 5.0), Span(COMPUTE, "w.draft.L0.attn", 6.0, 7.0), Span(HOST, "f", 8.0, 9.0),
             Span(SYNC, "host", 9.0, 10.0)]
    assert breakdown(spans, 0.0, 10.0) == {"draft": 1.0, "target compute": 2.0,
                                           "target compute, copies overlapped": 1.0, "stall on copies": 2.0,
                                           "host compute": 1.0, "host syncs and idle": 3.0}
    assert breakdown([], 1.0, 3.0)["host syncs and idle"] == 2.0
    rng = random.Random(0)
    for _ in range(20):
        spans = []
        for _ in range(rng.randint(1, 40)):
            a = rng.choice([rng.uniform(0, 10), float(rng.randint(0, 10))])  # shared instants as well as distinct ones
            spans.append(Span(rng.choice([COMPUTE, H2D, HOST, SYNC]), rng.choice(["x.attn", "y.draft.e1"]), a,
                              a + rng.choice([0.0, rng.uniform(0, 3)])))
        got, want = breakdown(spans, 1.0, 9.0), _breakdown_by_instants(spans, 1.0, 9.0)
        assert got == pytest.approx(want, abs=1e-12)
        assert sum(got.values()) == pytest.approx(8.0)


def test_every_cuda_engine_of_a_runtime_launches_on_its_one_pair_of_streams(monkeypatch):
    """A live run makes an engine per decode (the warm-up's, then each timed prompt's): they share the compute and
    copy streams their runtime made once (`LiveRuntime.streams`), so the caching allocator's blocks the warm-up freed
    serve the timed runs (a stream's freed blocks are kept for that stream). Stand-ins for CUDA's streams and events
    count what is made."""
    from specter.timing import cuda, make_engine

    made = []

    class Stream:
        def __init__(self, device):
            made.append(device)

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self, stream=None):
            pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    streams = cuda.make_streams(torch.device("cuda"))
    engines = [make_engine("live", _unit_profile(), "cuda", streams=streams) for _ in range(4)]
    assert len(made) == 2 and all(e._streams is streams for e in engines)
    assert streams[COMPUTE] is not streams[H2D]
    cuda.CudaEngine()  # an engine of no runtime makes its own pair
    assert len(made) == 4
