"""`specter profile-bandwidth`: measure a machine and write a hardware profile that `--hardware` accepts.

On CUDA: host-to-device bandwidth from pinned and pageable memory for sizes 4 KiB to 1 GiB (median of `repeats` timed
copies after warm-up, CUDA events), kernel launch overhead (median of empty-kernel launches), a GEMM roofline point
(FP16 matmul FLOP/s) and device memory bandwidth (device-to-device copy). Without CUDA: host copy bandwidth into
preallocated memory (copies rotating through 256 MiB, so that they read and write memory rather than the caches) stands
in for the link, and the CPU for the device (its memory bandwidth, the rate a one-token product reads a 256 MiB weight);
the profile says so in its description. The host section (the CPU that runs Fiddler's experts) is measured the same way
on both, and with it the host's time per dispatched op (`host.dispatch_us`: one eager decode step of a stock two-layer
MoE model at the default proxy's widths, or of `--dispatch-model`'s class and widths, less its weights' reads, over the
kernels it dispatches, `specter.timing.dispatch`, on the device the profile describes). Without CUDA the profile's
device is the host itself (`device.synchronous`), so an op's fixed cost is that dispatch time and the device charges no
launch overhead.

The profiler checks its figures before it writes them: copies of at least `BANDWIDTH_BOUND_BYTES` whose repeats spread
widely (the slower over the faster, the extreme fifths left out, above `MAX_SPREAD`), or a bandwidth curve that falls as
the size grows or stays flat in time while the size grows 4x (another process on the cores: with the second of two cores
busy, every copy from 64 KiB to 16 MiB took a flat 8 ms), are measured again, up to `MEASURE_TRIES` times, and refused
with one line naming the cause if the fault persists. Both write `bandwidth.csv` (one row per size and memory kind) and
`profile.yaml`.
"""

from __future__ import annotations

import csv
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import yaml

from specter.errors import SpecterError
from specter.io import atomic_write_text
from specter.timing.dispatch import dispatch_seconds
from specter.timing.hardware import load_profile

KIB = 1024
#: the memory a CPU measurement reads from (a decode product's weight; the pool host copies rotate through): past the
#: caches of most CPUs, as a decode step's reads are, since the rest of the step has pushed them out
COLD_BYTES = 1 << 28
HOST_MATMUL = 1024  # the side of the float32 matmul a CPU's FLOP/s are timed on
#: the most a copy's slower repeats may take over its faster ones (the extreme fifths left out) before it is measured
#: again (a copy of one size repeats within a few percent on an idle machine; a busy core makes repeats wait a whole
#: scheduler slice)
MAX_SPREAD = 3.0
#: measurements taken before a fault that persists is refused
MEASURE_TRIES = 3
#: copies at least this large are bandwidth-bound: 4x the bytes must take at least `MIN_GROWTH` x the time
BANDWIDTH_BOUND_BYTES = 1 << 20
MIN_GROWTH = 1.5


def default_sizes(max_bytes: int = 1 << 30) -> list[int]:
    """4 KiB, 16 KiB, ... up to `max_bytes` (powers of 4)."""
    sizes, s = [], 4 * KIB
    while s <= max_bytes:
        sizes.append(s)
        s *= 4
    return sizes


@dataclass(frozen=True)
class CopyRow:
    size_bytes: int
    memory: str  # "pinned" or "pageable" (CUDA), "host" (CPU copy)
    median_s: float
    gbps: float
    repeats: int
    spread: float = 1.0  # the slowest repeat over the fastest, the extreme fifths left out


def _times(fn: Callable[[], None], repeats: int, warmup: int,
           timer: Callable[[Callable[[], None]], float]) -> list[float]:
    for _ in range(warmup):
        fn()
    return [timer(fn) for _ in range(repeats)]


def _median_time(fn: Callable[[], None], repeats: int, warmup: int,
                 timer: Callable[[Callable[[], None]], float]) -> float:
    return statistics.median(_times(fn, repeats, warmup, timer))


def _copy_row(size: int, memory: str, times: list[float]) -> CopyRow:
    t = statistics.median(times)
    ranked = sorted(times)
    fifth = len(ranked) // 5  # the spread leaves out the fastest and slowest fifths: one stray repeat is no fault
    spread = ranked[-1 - fifth] / max(ranked[fifth], 1e-12)
    return CopyRow(size, memory, t, size / t / 1e9, len(times), spread)


def copy_fault(rows: list[CopyRow]) -> str | None:
    """Why a set of copy rows cannot describe the link, or None where they can: past `BANDWIDTH_BOUND_BYTES`, repeats
    that spread widely, a bandwidth that falls as the size grows, or a time that stays flat while it grows; and over
    the whole range up to a bandwidth-bound size, a time that did not grow with 16x the bytes or more."""
    for r in rows:
        if r.size_bytes >= BANDWIDTH_BOUND_BYTES and r.spread > MAX_SPREAD:
            return (f"{r.memory} copies of {r.size_bytes} bytes spread {r.spread:.1f}x between repeats (at most "
                    f"{MAX_SPREAD:g}x)")
    by_memory: dict[str, list[CopyRow]] = {}
    for r in rows:
        by_memory.setdefault(r.memory, []).append(r)
    for memory, series in by_memory.items():
        series.sort(key=lambda r: r.size_bytes)
        small, large = series[0], series[-1]  # over the whole range, whatever its largest size
        if (large.size_bytes >= max(16 * small.size_bytes, BANDWIDTH_BOUND_BYTES)
                and large.median_s < MIN_GROWTH * small.median_s):
            return (f"{memory} copies took {small.median_s * 1e3:.3g} ms at {small.size_bytes} bytes and "
                    f"{large.median_s * 1e3:.3g} ms at {large.size_bytes}: the time did not grow with the size")
        for a, b in zip(series, series[1:]):
            if a.size_bytes < BANDWIDTH_BOUND_BYTES:
                continue
            growth = (b.median_s / a.median_s) / (b.size_bytes / a.size_bytes) * 4
            if growth < MIN_GROWTH:
                return (f"{memory} copies took {a.median_s * 1e3:.3g} ms at {a.size_bytes} bytes and "
                        f"{b.median_s * 1e3:.3g} ms at {b.size_bytes}: the time did not grow with the size")
            if b.gbps < a.gbps / 2:
                return (f"{memory} copy bandwidth fell from {a.gbps:.3g} GB/s at {a.size_bytes} bytes to "
                        f"{b.gbps:.3g} GB/s at {b.size_bytes}")
    return None


def _measured_rows(measure: Callable[[], list[CopyRow]]) -> list[CopyRow]:
    """`measure()`'s rows once they pass `copy_fault`, measured up to `MEASURE_TRIES` times; else one error."""
    fault = None
    for _ in range(MEASURE_TRIES):
        rows = measure()
        fault = copy_fault(rows)
        if fault is None:
            return rows
    raise SpecterError(f"the copies measured do not describe a link ({fault}, in each of {MEASURE_TRIES} tries): "
                       "another process is most likely using the cores or the link; run profile-bandwidth again "
                       "with nothing else running")


def _wall_timer(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _cuda_timer(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def profile_bandwidth(out_dir: str | Path, device: str = "auto", sizes: list[int] | None = None,
                      repeats: int = 10, warmup: int = 3, name: str | None = None,
                      policy: Callable[[int, int], float] | None = None,
                      dispatch_model: str | None = None) -> tuple[Path, Path]:
    """Measure and write `bandwidth.csv` and `profile.yaml` into `out_dir`; returns their paths. `policy(repeats,
    warmup)` measures the runtime's own host seconds per MoE layer (`specter.offload.policy.policy_seconds`, which
    this layer cannot import); without it the profile says 0, unmeasured. `dispatch_model`: a checkpoint whose class
    and widths the dispatch time is measured at (`specter.timing.dispatch.decoder_moe`; default: the default
    proxy's)."""
    if repeats < 10:
        raise SpecterError(f"--repeats must be at least 10 for a stable median, got {repeats}")
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise SpecterError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    sizes = sizes or default_sizes()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if use_cuda:
        rows, profile = _profile_cuda(sizes, repeats, warmup, name, dispatch_model)
    else:
        rows, profile = _profile_cpu(sizes, repeats, warmup, name, dispatch_model)
    profile["host"]["policy_us"] = round(policy(repeats, warmup) * 1e6, 3) if policy is not None else 0.0
    profile["sources"]["host.policy_us"] = (
        "the suite's executor at each MoE layer of one-token passes over seeded random routes (half of each layer's "
        "experts in slots, no kernel run), per MoE layer (specter.offload.policy)" if policy is not None
        else "0, not measured")
    csv_path, yaml_path = out / "bandwidth.csv", out / "profile.yaml"
    text = yaml.safe_dump(profile, sort_keys=False)
    with tempfile.TemporaryDirectory(dir=out) as tmp:  # what we write must load: checked before it is in place
        (Path(tmp) / yaml_path.name).write_text(text)
        load_profile(Path(tmp) / yaml_path.name)
    lines = io.StringIO()
    w = csv.writer(lines)
    w.writerow(["size_bytes", "memory", "median_s", "gbps", "repeats"])
    for r in rows:
        w.writerow([r.size_bytes, r.memory, f"{r.median_s:.9f}", f"{r.gbps:.4f}", r.repeats])
    atomic_write_text(csv_path, lines.getvalue())
    atomic_write_text(yaml_path, text)
    return csv_path, yaml_path


def _host_matmul_tflops(repeats: int, warmup: int) -> float:
    n = HOST_MATMUL
    a, b = torch.randn(n, n), torch.randn(n, n)
    t = _median_time(partial(torch.mm, a, b), repeats, warmup, _wall_timer)
    return 2 * n**3 / t / 1e12


def _host_copy_rows(sizes: list[int], repeats: int, warmup: int) -> list[CopyRow]:
    """Host copies of each size, from and into `COLD_BYTES` of memory in rotation (each timed copy reads and writes
    bytes the previous ones have pushed out of the caches, as a decode's copy of an expert row does), or one buffer
    each where the size is that large already."""
    rows = []
    small = any(size < COLD_BYTES for size in sizes)
    src, dst = (torch.ones(COLD_BYTES if small else 1, dtype=torch.uint8) for _ in range(2))
    for size in sizes:
        if size >= COLD_BYTES:
            big_src, big_dst = torch.ones(size, dtype=torch.uint8), torch.empty(size, dtype=torch.uint8)
            times = _times(partial(big_dst.copy_, big_src), repeats, warmup, _wall_timer)
        else:
            times = _times(_rotating_copy(src, dst, size), repeats, warmup, _wall_timer)
        rows.append(_copy_row(size, "host", times))
    return rows


def _rotating_copy(src: torch.Tensor, dst: torch.Tensor, size: int) -> Callable[[], None]:
    """A copy of `size` bytes from `src` into `dst`, each call at the next offset (wrapping round)."""
    slots = max(1, src.numel() // size)
    state = {"i": 0}

    def copy() -> None:
        i = state["i"] = (state["i"] + 1) % slots
        dst[i * size:(i + 1) * size].copy_(src[i * size:(i + 1) * size])

    return copy


def _host_op_overhead_us(repeats: int, warmup: int) -> float:
    """The CPU's cost of one op that computes next to nothing (an in-place add on one element): what each op of a
    decode pays in dispatch before its arithmetic, as a kernel launch does on a GPU (median over `repeats` batches of
    100)."""
    x = torch.zeros(1)
    ops = 100

    def many_ops():
        for _ in range(ops):
            x.add_(1)

    return _median_time(many_ops, repeats, warmup, _wall_timer) / ops * 1e6




def _host_gemv_read_gbps(repeats: int, warmup: int) -> float:
    """The rate the CPU reads a weight at in a decode step: one token through a float32 [8192, 8192] linear (256 MiB,
    past the caches), the weight's bytes over the call's median time. This is what the cost model's memory term
    divides by (bytes read); a copy's size over its time is not, as a copy also writes what it reads."""
    n = int((COLD_BYTES // 4) ** 0.5)
    weight, x = torch.randn(n, n), torch.randn(1, n)
    t = _median_time(partial(torch.nn.functional.linear, x, weight), repeats, warmup, _wall_timer)
    return n * n * 4 / t / 1e9


def _host_sources(device: str, kernels: int, dispatch_model: str | None = None) -> dict[str, str]:
    """Where the host section's figures (and, without CUDA, the device's) come from."""
    bandwidth = "the device's" if device == "cuda" else "host.memory_bandwidth_gbps"
    model = ("a stock Qwen2-MoE of 2 decoder layers at the default proxy's shapes" if dispatch_model is None else
             f"2 decoder layers of {Path(dispatch_model).name}'s class and shapes")
    return {"host": f"peak: a float32 {HOST_MATMUL} x {HOST_MATMUL} matmul; memory bandwidth: one token through a "
                    f"float32 {COLD_BYTES >> 20} MiB linear (bytes read over time); launch overhead: an in-place add "
                    "on one element, per op over batches of 100",
            "host.dispatch_us": f"one greedy decode step of {model} (transformers' modules, experts run eagerly) on "
                                f"{device}, its wall time less its weights' "
                                f"reads at {bandwidth} memory bandwidth, over the {kernels} kernels it dispatches "
                                "(specter.timing.dispatch)"}


def _host_section(repeats: int, warmup: int, device: str, memory_bandwidth: float | None = None,
                  dispatch_model: str | None = None) -> tuple[dict, int]:
    """The host section, and the kernels of the decode step its dispatch figure was timed on (its weights read at
    `memory_bandwidth`, bytes/s: the device's; None: the host's own, measured here)."""
    host_read = _host_gemv_read_gbps(repeats, warmup)
    # a decode step's time varies more than one op's: three times the repeats
    dispatch_s, kernels, _ = dispatch_seconds(device, 3 * repeats, warmup, memory_bandwidth or host_read * 1e9,
                                              dispatch_model)
    return {
        "name": f"this machine's CPU ({torch.get_num_threads()} threads)",
        "peak_tflops": round(_host_matmul_tflops(repeats, warmup), 6),
        "memory_bandwidth_gbps": round(host_read, 4),
        "launch_overhead_us": round(_host_op_overhead_us(repeats, warmup), 3),
        "dispatch_us": round(dispatch_s * 1e6, 3),
    }, kernels


def _profile_cpu(sizes, repeats, warmup, name, dispatch_model=None):
    rows = _measured_rows(partial(_host_copy_rows, sizes, repeats, warmup))
    host, kernels = _host_section(repeats, warmup, "cpu", dispatch_model=dispatch_model)
    largest = rows[-1].gbps
    profile = {
        "name": name or "measured-cpu",
        "description": "MEASURED on a machine without CUDA: host memory copies stand in for the link and the CPU for "
                       "the device; use it to exercise the tools, not to predict GPU times",
        "measured": True,
        "device": {"name": host["name"], "peak_tflops": host["peak_tflops"],
                   "memory_bandwidth_gbps": host["memory_bandwidth_gbps"],
                   "launch_overhead_us": 0.0, "host_sync_us": 0.0, "memory_gb": round(_total_memory_gb(), 3),
                   "synchronous": True},
        "link": {"name": "host memcpy", "h2d_pinned_gbps": round(largest, 4), "h2d_pageable_gbps": round(largest, 4),
                 "latency_us": round(rows[0].median_s * 1e6, 3),
                 "h2d_by_size": [{"bytes": r.size_bytes, "pinned_gbps": round(r.gbps, 4),
                                  "pageable_gbps": round(r.gbps, 4)} for r in rows]},
        "host": host,
        "sources": {"all": f"measured by specter profile-bandwidth on {time.strftime('%Y-%m-%d')}, each figure the "
                           f"median of {repeats} after {warmup} warm-up",
                    **_host_sources("cpu", kernels, dispatch_model),
                    "device": "this CPU as the device: measured as `host` says",
                    "device.launch_overhead_us": "0: the CPU as device runs each op on the thread that dispatches it, "
                                                 "so an op's fixed cost is host.dispatch_us, not charged twice",
                    "link": f"host copies of each size from and into {COLD_BYTES >> 20} MiB of memory in rotation "
                            f"(sizes from {COLD_BYTES >> 20} MiB up: between buffers of their own size); latency: "
                            "the smallest copy's time",
                    "device.host_sync_us": "0, not measured: the CPU as device has no device to wait for"},
    }
    return rows, profile


def _total_memory_gb() -> float:
    try:
        import os

        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    except (ValueError, OSError, AttributeError):
        return 1.0


def _profile_cuda(sizes, repeats, warmup, name, dispatch_model=None):
    dev = torch.device("cuda")

    def link_rows() -> list[CopyRow]:
        rows: list[CopyRow] = []
        for size in sizes:
            dst = torch.empty(size, dtype=torch.uint8, device=dev)
            for memory, src in (("pinned", torch.ones(size, dtype=torch.uint8).pin_memory()),
                                ("pageable", torch.ones(size, dtype=torch.uint8))):
                times = _times(partial(dst.copy_, src, non_blocking=True), repeats, warmup, _cuda_timer)
                rows.append(_copy_row(size, memory, times))
        return rows

    rows = _measured_rows(link_rows)
    x = torch.zeros(1, device=dev)
    launches = 100

    def many_launches():
        for _ in range(launches):
            x.add_(1)

    launch_s = _median_time(many_launches, repeats, warmup, _cuda_timer) / launches
    sync_s = _median_time(x.item, repeats, warmup, _wall_timer)  # the host reads a device result: sync + tiny D2H
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.float16)
    b = torch.randn(n, n, device=dev, dtype=torch.float16)
    gemm_s = _median_time(partial(torch.mm, a, b), repeats, warmup, _cuda_timer)
    big = 1 << 30
    s1, s2 = torch.empty(big, dtype=torch.uint8, device=dev), torch.empty(big, dtype=torch.uint8, device=dev)
    d2d_s = _median_time(partial(s2.copy_, s1), repeats, warmup, _cuda_timer)
    pinned = {r.size_bytes: r for r in rows if r.memory == "pinned"}
    pageable = {r.size_bytes: r for r in rows if r.memory == "pageable"}
    host_rows = _host_copy_rows([s for s in sizes if s <= 1 << 28], repeats, warmup)
    host, kernels = _host_section(repeats, warmup, "cuda", 2 * big / d2d_s, dispatch_model)
    props = torch.cuda.get_device_properties(dev)
    largest = max(sizes)
    profile = {
        "name": name or f"measured-{props.name.lower().replace(' ', '-')}",
        "description": f"MEASURED {props.name} and its host link by specter profile-bandwidth",
        "measured": True,
        "device": {"name": props.name, "peak_tflops": round(2 * n**3 / gemm_s / 1e12, 3),
                   "memory_bandwidth_gbps": round(2 * big / d2d_s / 1e9, 3),
                   "launch_overhead_us": round(launch_s * 1e6, 3), "host_sync_us": round(sync_s * 1e6, 3),
                   "memory_gb": round(props.total_memory / 1e9, 3)},
        "link": {"name": "measured host-to-device", "h2d_pinned_gbps": round(pinned[largest].gbps, 4),
                 "h2d_pageable_gbps": round(pageable[largest].gbps, 4),
                 "latency_us": round(pinned[min(sizes)].median_s * 1e6, 3),
                 "h2d_by_size": [{"bytes": s, "pinned_gbps": round(pinned[s].gbps, 4),
                                  "pageable_gbps": round(pageable[s].gbps, 4)} for s in sizes]},
        "host": host,
        "sources": {"all": f"measured by specter profile-bandwidth on {time.strftime('%Y-%m-%d')}: median of {repeats} "
                           f"after {warmup} warm-up; GEMM {n}x{n} FP16; device memory from a 1 GiB device copy "
                           "(read + write); launch overhead: an in-place add on one element, per launch over batches "
                           "of 100 (CUDA events); host sync: the host reading one device value (`item`); link: "
                           "pinned and pageable copies of each size; latency: the smallest pinned copy's time",
                    **_host_sources("cuda", kernels, dispatch_model)},
    }
    return rows + host_rows, profile
