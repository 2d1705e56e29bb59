"""`specter profile-bandwidth`: measure a machine and write a hardware profile that `--hardware` accepts.

On CUDA: host-to-device bandwidth from pinned and pageable memory for sizes 4 KiB to 1 GiB (median of `repeats` timed
copies after warm-up, CUDA events), kernel launch overhead (median of empty-kernel launches), a GEMM roofline point
(FP16 matmul FLOP/s) and device memory bandwidth (device-to-device copy). Without CUDA: host copy bandwidth into
preallocated memory (copies rotating through 256 MiB, so that they read and write memory rather than the caches) stands
in for the link, and the CPU for the device (its op dispatch, timed on a one-element op, for the launch overhead; its
memory bandwidth, the rate a one-token product reads a 256 MiB weight); the profile says so in its description. The
host section (the CPU that runs Fiddler's experts) is measured the same way on both. Both write `bandwidth.csv` (one
row per size and memory kind) and `profile.yaml`.
"""

from __future__ import annotations

import csv
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import yaml

from specter.errors import SpecterError
from specter.timing.hardware import load_profile

KIB = 1024
#: the memory a CPU measurement reads from (a decode product's weight; the pool host copies rotate through): past the
#: caches of most CPUs, as a decode step's reads are, since the rest of the step has pushed them out
COLD_BYTES = 1 << 28
HOST_MATMUL = 1024  # the side of the float32 matmul a CPU's FLOP/s are timed on


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


def _median_time(fn: Callable[[], None], repeats: int, warmup: int,
                 timer: Callable[[Callable[[], None]], float]) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(timer(fn) for _ in range(repeats))


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
                      repeats: int = 10, warmup: int = 3, name: str | None = None) -> tuple[Path, Path]:
    """Measure and write `bandwidth.csv` and `profile.yaml` into `out_dir`; returns their paths."""
    if repeats < 10:
        raise SpecterError(f"--repeats must be at least 10 for a stable median, got {repeats}")
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        raise SpecterError("--device cuda asked for, but torch sees no CUDA device; use --device cpu")
    sizes = sizes or default_sizes()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if use_cuda:
        rows, profile = _profile_cuda(sizes, repeats, warmup, name)
    else:
        rows, profile = _profile_cpu(sizes, repeats, warmup, name)
    csv_path, yaml_path = out / "bandwidth.csv", out / "profile.yaml"
    with csv_path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["size_bytes", "memory", "median_s", "gbps", "repeats"])
        for r in rows:
            w.writerow([r.size_bytes, r.memory, f"{r.median_s:.9f}", f"{r.gbps:.4f}", r.repeats])
    yaml_path.write_text(yaml.safe_dump(profile, sort_keys=False))
    load_profile(yaml_path)  # what we wrote must load
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
            t = _median_time(partial(big_dst.copy_, big_src), repeats, warmup, _wall_timer)
        else:
            t = _median_time(_rotating_copy(src, dst, size), repeats, warmup, _wall_timer)
        rows.append(CopyRow(size, "host", t, size / t / 1e9, repeats))
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


def _host_sources() -> dict[str, str]:
    """Where the host section's figures (and, without CUDA, the device's) come from."""
    return {"host": f"peak: a float32 {HOST_MATMUL} x {HOST_MATMUL} matmul; memory bandwidth: one token through a "
                    f"float32 {COLD_BYTES >> 20} MiB linear (bytes read over time); launch overhead: an in-place add "
                    "on one element, per op over batches of 100"}


def _host_section(repeats: int, warmup: int) -> dict:
    return {
        "name": f"this machine's CPU ({torch.get_num_threads()} threads)",
        "peak_tflops": round(_host_matmul_tflops(repeats, warmup), 6),
        "memory_bandwidth_gbps": round(_host_gemv_read_gbps(repeats, warmup), 4),
        "launch_overhead_us": round(_host_op_overhead_us(repeats, warmup), 3),
    }


def _profile_cpu(sizes, repeats, warmup, name):
    rows = _host_copy_rows(sizes, repeats, warmup)
    host = _host_section(repeats, warmup)
    largest = rows[-1].gbps
    profile = {
        "name": name or "measured-cpu",
        "description": "MEASURED on a machine without CUDA: host memory copies stand in for the link and the CPU for "
                       "the device; use it to exercise the tools, not to predict GPU times",
        "measured": True,
        "device": {"name": host["name"], "peak_tflops": host["peak_tflops"],
                   "memory_bandwidth_gbps": host["memory_bandwidth_gbps"],
                   "launch_overhead_us": host["launch_overhead_us"],
                   "host_sync_us": 0.0, "memory_gb": round(_total_memory_gb(), 3)},
        "link": {"name": "host memcpy", "h2d_pinned_gbps": round(largest, 4), "h2d_pageable_gbps": round(largest, 4),
                 "latency_us": round(rows[0].median_s * 1e6, 3),
                 "h2d_by_size": [{"bytes": r.size_bytes, "pinned_gbps": round(r.gbps, 4),
                                  "pageable_gbps": round(r.gbps, 4)} for r in rows]},
        "host": host,
        "sources": {"all": f"measured by specter profile-bandwidth on {time.strftime('%Y-%m-%d')}, each figure the "
                           f"median of {repeats} after {warmup} warm-up",
                    **_host_sources(), "device": "this CPU as the device: measured as `host` says",
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


def _profile_cuda(sizes, repeats, warmup, name):
    dev = torch.device("cuda")
    rows: list[CopyRow] = []
    for size in sizes:
        dst = torch.empty(size, dtype=torch.uint8, device=dev)
        for memory, src in (("pinned", torch.ones(size, dtype=torch.uint8).pin_memory()),
                            ("pageable", torch.ones(size, dtype=torch.uint8))):
            t = _median_time(partial(dst.copy_, src, non_blocking=True), repeats, warmup, _cuda_timer)
            rows.append(CopyRow(size, memory, t, size / t / 1e9, repeats))
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
        "host": _host_section(repeats, warmup),
        "sources": {"all": f"measured by specter profile-bandwidth on {time.strftime('%Y-%m-%d')}: median of {repeats} "
                           f"after {warmup} warm-up; GEMM {n}x{n} FP16; device memory from a 1 GiB device copy "
                           "(read + write); launch overhead: an in-place add on one element, per launch over batches "
                           "of 100 (CUDA events); host sync: the host reading one device value (`item`); link: "
                           "pinned and pageable copies of each size; latency: the smallest pinned copy's time",
                    **_host_sources()},
    }
    return rows + host_rows, profile
