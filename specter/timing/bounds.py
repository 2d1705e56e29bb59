"""The physical lower bound of a decode run: no schedule of the same work on the same hardware can be faster.

Given the passes the run made (their FLOPs and the device-memory bytes they must read: the target's passes and the
draft's steps) and the expert loads that no cache of the run's size could avoid, a run needs at least `max(sum of
compute times, bytes over the link / bandwidth)`. The max (not a per-pass sum of
maxima) is what stays a bound when copies for one pass overlap compute of another. The unavoidable loads come from
Belady's offline-optimal replacement, with the initial cache content free (the best any warm-up could leave), over one
of two sequences:
- per pass: the experts each target pass used (a verification of K + 1 tokens needs each of its experts once, for all
  of them) - the bound of every run, and the one that applies to speculative systems;
- per token: the experts each committed token used, one token after another - what a system that decodes one token a
  time must load at least; a speculative system legitimately runs below it, and records carry it for comparison.
For a system that decodes one token per pass the two are the same sequence.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from specter.timing.cost import CostModel


def belady_loads(trace: Sequence[Collection[int]], slots: int, free_initial: bool = True) -> int:
    """Fewest loads any replacement policy (prefetching or not) needs to serve `trace` with `slots` cache entries.

    `trace[t]` is the set of experts step t needs at once. An expert may stream through a staging buffer without
    entering the cache (every runtime here has such buffers), so after each step the cache keeps the `slots` experts
    needed soonest (Belady's rule with bypass). With `free_initial`, the first `slots` distinct experts cost nothing.
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
    """One forward pass of a decode run (the target's, or a draft step): its cost inputs on the device, and for a
    target pass the routed experts it used per MoE layer."""

    tokens: int  # tokens the pass processes
    flops: float
    bytes_read: float  # device-memory bytes: resident weights it touches, the experts it runs, the KV it reads
    launches: int  # kernels
    experts: tuple[tuple[int, frozenset[int]], ...] = ()  # (MoE layer, experts used): target passes only
    draft: bool = False


def decode_lower_bound_seconds(passes: Sequence[PassWork], link_bytes: float, cost: CostModel) -> float:
    """Seconds the run needs at least: max(total compute, unavoidable link bytes / the fastest link bandwidth). The
    host's dispatch is left out: it is the software's cost, not the hardware's (a runtime that captures its decode as
    one graph does not pay it)."""
    compute = cost.total(passes)  # a PassWork carries the same cost inputs as an op
    p = cost.profile
    fastest = max([p.h2d_pinned_bandwidth, *(pt.pinned_gbps * 1e9 for pt in p.h2d_by_size)])
    link = link_bytes / fastest if link_bytes > 0 else 0.0
    return max(compute, link)


@dataclass(frozen=True)
class LowerBound:
    """A run's lower bounds on TPOT (seconds): `per_pass` over its passes' expert sets, `per_token` over its committed
    tokens'; `kind` says which applies to the run (its `seconds`)."""

    per_pass: float
    per_token: float
    kind: str

    @property
    def seconds(self) -> float:
        return self.per_pass if self.kind == "per-pass" else self.per_token


def _link_bytes(sequences: dict[int, list], slots: int, expert_bytes: int, expert_params: int, cost: CostModel,
                host_compute: bool) -> float:
    """Bytes that must cross the link to serve every layer's sequence of expert sets with `slots` slots.

    For a system that may compute a missing expert on the host instead of copying it (`host_compute`), each unavoidable
    load counts at the cheaper of the two ways, halved (the link and the host can work at once)."""
    loads = sum(belady_loads(seq, slots) for seq in sequences.values())
    if not host_compute:
        return loads * expert_bytes
    host_s = cost.host_seconds(2.0 * expert_params, expert_bytes, 1)
    fastest_bw = max([cost.profile.h2d_pinned_bandwidth, *(p.pinned_gbps * 1e9 for p in cost.profile.h2d_by_size)])
    return loads * min(expert_bytes, host_s * fastest_bw) / 2


def lower_bound(passes: Sequence[PassWork], commits: int, decode_routes: list[dict[int, tuple[int, ...]]],
                slots: int, expert_bytes: int, expert_params: int, cost: CostModel, host_compute: bool = False,
                speculative: bool = False) -> LowerBound:
    """The fastest a run's decode could be on this hardware with this budget, per token: `passes` are its passes after
    the first commit (target passes and draft steps), `commits` its committed tokens, `decode_routes` the routes of
    the committed decode inputs."""
    if commits < 2:
        return LowerBound(0.0, 0.0, "per-pass" if speculative else "per-token")
    per_pass: dict[int, list] = {}
    for p in passes:
        for layer, experts in p.experts:
            per_pass.setdefault(layer, []).append(experts)
    per_token = {layer: [r[layer] for r in decode_routes] for layer in (decode_routes[0] if decode_routes else {})}
    args = (slots, expert_bytes, expert_params, cost, host_compute)
    # where the run met its bound exactly, summation order must not put the bound above it
    shave = (1 - 1e-12) / (commits - 1)
    return LowerBound(decode_lower_bound_seconds(passes, _link_bytes(per_pass, *args), cost) * shave,
                      decode_lower_bound_seconds(passes, _link_bytes(per_token, *args), cost) * shave,
                      "per-pass" if speculative else "per-token")
