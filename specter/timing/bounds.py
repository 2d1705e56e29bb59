"""The physical lower bound of a decode run: no schedule of the same work on the same hardware can be faster.

Given the passes the target made (their FLOPs and the device-memory bytes they must read) and the expert loads that no
cache of the run's size could avoid, a run needs at least `max(sum of compute times, bytes over the link / bandwidth)`.
The max (not a per-pass sum of maxima) is what stays a bound when copies for one pass overlap compute of another. The
unavoidable loads come from Belady's offline-optimal replacement over the experts the target actually used, with the
initial cache content free (the best any warm-up could leave).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence

from specter.timing.cost import CostModel


def belady_loads(trace: Sequence[Collection[int]], slots: int, free_initial: bool = True) -> int:
    """Fewest loads any replacement policy (prefetching or not) needs to serve `trace` with `slots` cache entries.

    `trace[t]` is the set of experts step t needs at once. An expert may stream through a staging buffer without entering
    the cache (every runtime here has such buffers), so after each step the cache keeps the `slots` experts needed
    soonest (Belady's rule with bypass). With `free_initial`, the first `slots` distinct experts cost nothing.
    """
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    steps = [set(s) for s in trace]
    # next_use[t][e]: the next step >= t+1 that needs e (len(steps) if never).
    next_use: list[dict[int, int]] = [dict() for _ in steps]
    upcoming: dict[int, int] = {}
    for t in range(len(steps) - 1, -1, -1):
        next_use[t] = dict(upcoming)
        for e in steps[t]:
            upcoming[e] = t
    cache: set[int] = set()
    loads = 0
    free = slots if free_initial else 0
    for t, need in enumerate(steps):
        missing = need - cache
        paid = max(0, len(missing) - free)
        free = max(0, free - len(missing))
        loads += paid
        cache |= need
        if len(cache) > slots:
            # keep the experts needed soonest; experts of this step that do not fit were streamed (already counted)
            horizon = len(steps)
            ranked = sorted(cache, key=lambda e: (next_use[t].get(e, horizon), e))
            cache = set(ranked[:slots])
    return loads


@dataclass(frozen=True)
class PassWork:
    """One target forward pass of a decode run: its cost inputs on the device."""

    tokens: int  # tokens the pass processes
    flops: float
    bytes_read: float  # device-memory bytes: resident weights it touches, the experts it runs, the KV it reads
    launches: int  # kernels


def decode_lower_bound_seconds(passes: Sequence[PassWork], link_bytes: float, cost: CostModel) -> float:
    """Seconds the run needs at least: max(total compute, unavoidable link bytes / the fastest link bandwidth)."""
    compute = sum(cost.compute_seconds(p.flops, p.bytes_read, p.launches) for p in passes)
    p = cost.profile
    fastest = max([p.h2d_pinned_bandwidth, *(pt.pinned_gbps * 1e9 for pt in p.h2d_by_size)])
    link = link_bytes / fastest if link_bytes > 0 else 0.0
    return max(compute, link)
