"""Every metric's single definition, and the run record (one JSON line per prompt).

- TPOT = (t_last_commit - t_first_commit) / (N - 1); TTFT = t_first_commit (the prompt starts at 0).
- acceptance rate = accepted / checked (a proposal is checked when every proposal before it was accepted);
  window utilization = accepted / proposed.
- expert prediction per (layer, lookahead distance d): precision = |P n A| / |P| and recall = |P n A| / |A| with P the
  draft's experts at draft step d and A the target's at verification input d - 1 (they read the same token), summed over
  cycles; window recall = experts the verification used that the window's prefetch had placed on the device (copied,
  or found resident and protected) / experts the verification used, the same for every system; window working set =
  distinct experts one verification uses per MoE layer, mean over windows and layers.
- breakdown: [first commit, last commit] partitioned by what the device was doing (`breakdown`); its parts sum to
  TPOT x (N - 1).
- tables: the mean over prompts of every time and rate (the paper reports means), with the median, p90, p99,
  fastest and slowest of TPOT and n (the runs: prompts x timed repeats) beside; a speedup is a ratio of means
  (`specter.report.tables`).
- hit rates, each named (`HIT_RATES`; the artifact's is `ARTIFACT_HIT_RATE`): `hit_rate` = demand hits / (demand
  hits + demand misses) over every target pass, prefill included (of the distinct experts each MoE layer of a pass
  needs, those already in a slot); `hit_rate_pass`, the same over the decode passes only (the artifact's
  `benchmarks/routing.py`); `hit_rate_token`, per (token, layer) routing over the decode passes (an expert k tokens of
  a pass route to counts k times); for speculative runs the prefetch's `prefetch_precision` = experts a window's
  prefetch placed (copied, or kept and protected) that its verification used / experts it placed, and
  `prefetch_recall` = the same over the experts the verification used (the window recall).
- lower bound: max(the run's passes at roofline after the first commit, Belady's fewest expert loads over the link,
  per pass for speculative systems and per committed token for the others) / (N - 1); see `specter.timing.bounds`.
Field names carry their units. A record keeps the raw values these are computed from (`extra.commit_ms`, every
commit's time, and `extra.counts`: proposals, checked, accepted, window hits, needs and placements, the decode
passes' demand hits and misses per pass and per token, and how many decode passes), so any table can be
recomputed from its records through these definitions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def tpot_seconds(commit_times: list[float]) -> float:
    n = len(commit_times)
    return (commit_times[-1] - commit_times[0]) / (n - 1) if n > 1 else 0.0


def acceptance_rate(accepted: int, checked: int) -> float:
    """Accepted proposals over the proposals checked (a proposal is checked when all before it were accepted)."""
    return accepted / checked


def window_utilization(accepted: int, proposed: int) -> float:
    return accepted / proposed


def hit_rate(hits: int, misses: int) -> float | None:
    """The share of the experts a run's target passes needed that were already in a slot when the pass asked (a
    prefetch still landing counts: its copy was issued before the need). Per pass (distinct experts of each MoE layer
    of a pass) or per token (each token's routings), by what is counted; see `HIT_RATES`."""
    return share(hits, hits + misses)


#: every hit rate a record carries, by name: what it counts over what (the paper's Table 3 does not define its own)
HIT_RATES = {
    "hit_rate": "per pass, every target pass (prefill included): distinct experts of each MoE layer of a pass already "
                "in a slot, over those it needs",
    "hit_rate_pass": "per pass, decode passes only: as hit_rate, after the prompt's prefill (the artifact's: "
                     "benchmarks/routing.py counts the unique expert requests of each target layer invocation over "
                     "completed windows, prefill outside, an in-flight copy a hit)",
    "hit_rate_token": "per token and layer, decode passes: (token, layer) routings to an expert already in a slot, "
                      "over all routings (an expert k tokens of a pass route to counts k times)",
    "prefetch_precision": "placed and used / placed: of the experts a window's prefetch placed on the device (copied, "
                          "or kept and protected), those its verification used (speculative systems)",
    "prefetch_recall": "placed and used / used: of the experts a verification used, those its window's prefetch had "
                       "placed (speculative systems; the window recall)",
}
#: the definition the authors' artifact computes
ARTIFACT_HIT_RATE = "hit_rate_pass"


def decode_demand(target_passes: list) -> tuple[int, int, int, int]:
    """(hits, misses, token hits, token misses) over a prompt's decode passes: every target pass after the first,
    the prompt's prefill (`TransferStats.target_passes`)."""
    return tuple(sum(p[i] for p in target_passes[1:]) for i in range(4))


#: the parts of a run's decode time (`breakdown`), in the order they stack
BREAKDOWN = ("draft", "target compute", "target compute, copies overlapped", "stall on copies", "host compute",
             "host syncs and idle")


def breakdown(spans, start: float, end: float) -> dict[str, float]:
    """Partition [start, end] (a run's first and last commit) by what the device was doing at each instant, in
    seconds per part of `BREAKDOWN`: `draft` (the compute stream runs a draft op: its label names a draft),
    `target compute` (it runs a target op while no copy is on the link), `target compute, copies overlapped` (a target
    op while a copy is), `stall on copies` (no compute, a copy on the link), `host compute` (no compute, no copy, the
    host computes experts: Fiddler) and `host syncs and idle` (the rest: the host reading routes, launch gaps between
    ops). An op spans its first kernel's start to its last's end, the launch gaps between its kernels included, as
    events around it time it live (docs/metrics.md). The parts sum to end - start, that is TPOT x (N - 1)."""
    import numpy as np

    from specter.timing.engine import COMPUTE, H2D, HOST

    times: list[float] = []  # each span's clipped start and end, the kind it changes and by how much
    kinds: list[int] = []
    changes: list[int] = []
    for s in spans:  # kinds: 0 draft, 1 target, 2 link, 3 host
        a = s.start if s.start > start else start
        b = s.end if s.end < end else end
        if b <= a:
            continue
        stream = s.stream
        if stream == COMPUTE:
            kind = 0 if "draft" in s.label else 1
        elif stream == H2D:
            kind = 2
        elif stream == HOST:
            kind = 3
        else:
            continue
        times += (a, b)
        kinds += (kind, kind)
        changes += (1, -1)
    # the instants where anything changes; every event at one instant applies before the next interval is counted
    t = np.asarray(times, dtype=np.float64)
    order = np.argsort(t, kind="stable")
    t = t[order]
    delta = np.zeros((len(t), 4), dtype=np.int64)
    delta[np.arange(len(t)), np.asarray(kinds, dtype=np.int64)[order]] = np.asarray(changes, dtype=np.int64)[order]
    instants, first = np.unique(t, return_index=True)
    after = np.cumsum(delta, axis=0)[np.append(first[1:], len(t)) - 1] if len(t) else np.zeros((0, 4), np.int64)
    active = np.vstack([np.zeros((1, 4), np.int64), after]) > 0  # what runs in each interval, the first before any
    bounds = np.concatenate([[start], instants, [end]])
    lengths = bounds[1:] - bounds[:-1]
    draft, target, link, host = active.T
    part = np.select([draft, target & link, target, link, host], [0, 2, 1, 3, 4], default=5)
    out = dict.fromkeys(BREAKDOWN, 0.0)
    for i, name in enumerate(BREAKDOWN):
        mine = lengths[(part == i) & (lengths > 0)]
        if len(mine):
            out[name] = float(np.cumsum(mine)[-1])  # in time order, one addition at a time, as a running total
    return out


def share(part: int, whole: int) -> float | None:
    """part / whole, None where whole is 0 (precision, recall, window recall)."""
    return part / whole if whole else None


@dataclass
class RunRecord:
    system: str
    model: str
    dataset: str
    prompt_index: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    ttft_ms: float
    tpot_ms: float
    lower_bound_tpot_ms: float
    engine: str
    hardware: str
    simulated: bool
    k: int | None
    slots_per_layer: int
    experts_per_layer: int
    acceptance_rate: float | None
    window_utilization: float | None
    accepted_length_histogram: dict[str, int]
    demand_hits: int
    demand_misses: int
    hit_rate: float | None
    h2d_bytes_prefetch: int
    h2d_bytes_demand: int
    stall_ms: float
    expert_prediction: list[dict]
    window_recall: float | None
    window_working_set: float | None
    config: dict
    seed: int
    versions: dict
    git_commit: str
    wall_s: float = 0.0  # wall-clock metadata: the only field that differs between identical simulated runs
    cost_as: str | None = None  # the architecture whose shapes priced every op (`--cost-as`), else None
    hit_rate_pass: float | None = None  # see HIT_RATES (None where the decode passes needed no expert)
    hit_rate_token: float | None = None
    prefetch_precision: float | None = None  # None for a run that placed nothing ahead (no speculative prefetch)
    prefetch_recall: float | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)
