"""Every metric's single definition, and the run record (one JSON line per prompt).

- TPOT = (t_last_commit - t_first_commit) / (N - 1); TTFT = t_first_commit (the prompt starts at 0).
- acceptance rate = accepted / checked (a proposal is checked when every proposal before it was accepted);
  window utilization = accepted / proposed.
- expert prediction per (layer, lookahead distance d): precision = |P n A| / |P| and recall = |P n A| / |A| with P the
  draft's experts at draft step d and A the target's at verification input d - 1 (they read the same token), summed over
  cycles; window recall = planned experts the verification used / experts the verification used; window working set =
  distinct experts one verification uses per MoE layer, mean over windows and layers.
- lower bound: max(the run's target passes at roofline after the first commit, Belady's fewest expert loads for the
  committed tokens' routes over the link) / (N - 1); see `specter.timing.bounds`.
Field names carry their units.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specter.systems import PromptResult
from specter.timing.bounds import belady_loads, decode_lower_bound_seconds
from specter.timing.cost import CostModel


def tpot_seconds(commit_times: list[float]) -> float:
    n = len(commit_times)
    return (commit_times[-1] - commit_times[0]) / (n - 1) if n > 1 else 0.0


def lower_bound_tpot_seconds(result: PromptResult, decode_routes: list[dict[int, tuple[int, ...]]], slots: int,
                             work, cost: CostModel, host_compute: bool = False) -> float:
    """The fastest the run's decode could be on this hardware with this budget; see the module docstring.

    For a system that may compute a missing expert on the host instead of copying it (`host_compute`), each unavoidable
    load counts at the cheaper of the two ways, halved (the link and the host can work at once)."""
    n = len(result.commit_times)
    if n < 2:
        return 0.0
    passes = result.executor.passes[result.first_decode_pass :]
    loads = 0
    for layer in decode_routes[0] if decode_routes else {}:
        loads += belady_loads([r[layer] for r in decode_routes], slots)
    link_bytes = loads * work.expert_bytes
    if host_compute:
        host_s = cost.host_seconds(2.0 * work.expert_params, work.expert_bytes, 1)
        fastest_bw = max([cost.profile.h2d_pinned_bandwidth, *(p.pinned_gbps * 1e9 for p in cost.profile.h2d_by_size)])
        link_bytes = loads * min(work.expert_bytes, host_s * fastest_bw) / 2
    bound = decode_lower_bound_seconds(passes, link_bytes, cost) / (n - 1)
    return bound * (1 - 1e-12)  # where the run met its bound exactly, summation order must not put the bound above it


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
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def speculative_fields(result: PromptResult) -> dict:
    """acceptance rate, window utilization, histogram, expert prediction and window recall of a speculative run."""
    if not result.proposed:
        return dict(acceptance_rate=None, window_utilization=None, accepted_length_histogram={}, expert_prediction=[],
                    window_recall=None, window_working_set=None)
    prediction = [
        dict(layer=layer, distance=d, precision=c.tp / c.predicted if c.predicted else None,
             recall=c.tp / c.actual if c.actual else None)
        for (layer, d), c in sorted(result.prediction.items())
    ]
    return dict(
        acceptance_rate=result.accepted / result.checked,
        window_utilization=result.accepted / result.proposed,
        accepted_length_histogram={str(a): n for a, n in sorted(result.accepted_lengths.items())},
        expert_prediction=prediction,
        window_recall=result.window_hits / result.window_needed if result.window_needed else None,
        window_working_set=result.window_needed / result.window_layers if result.window_layers else None,
    )
