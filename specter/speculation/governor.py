"""The governor: choosing the draft window K.

Every governor profiles on prompts of the calibration split, never an evaluation prompt (`CALIBRATION_PROMPTS` for
the amortization model, `PROFILE_PROMPTS` for the empirical profiler), each decoded for as many
tokens as the run commits: the run's finite horizon matters, since a run of N tokens pays for ceil((N - 1) /
committed(K)) whole cycles, and a long window at the end is partly wasted.

- `auto` (the paper's amortization model, Eqs. 2-5): K minimizing the predicted TPOT
  ceil((N - 1) / committed(K)) x T_cycle(K) / (N - 1), with T_cycle = max(T_draft(K), T_pcie_init(K)) + T_pcie_new(K)
  + T_verify(K + 1). Over windows that do not overlap (each starts after the previous one's last proposal), across the
  calibration prompts:
  - committed(K) = mean of min(accepted, K) + 1 (the target's own token);
  - T_draft(K) = K draft steps (each with the host's read of its proposal), T_verify(K + 1) one target pass over the
    window's distinct experts (with a routing read per MoE layer where the cache can miss), both from the cost model;
  - the experts a verification needs that the previous window did not leave resident must cross the link: those the
    draft's plan predicted are copied while drafting, as many as the drafting time holds (T_pcie_init), the rest on
    demand (T_pcie_new).
- `profile` (the artifact's empirical profiler): schedule the calibration prompts with the run's own system at every K
  of `PROFILE_KS` and keep the K of the lowest mean simulated TPOT.
- `online` (the paper's online variant): the per-token acceptance probability alpha is an EMA of what each
  verification accepted over what it checked, starting from the calibration windows' rate, weighted by the proposals
  the verification checked: a whole window of the calibrated K keeps 0.75 of the old estimate (the paper's 0.75 old,
  0.25 new), a verification that checked c proposals keeps 0.75^(c / K). Before each cycle K is re-chosen within
  `PROFILE_KS` to maximize expected committed tokens (1 - alpha^(K+1)) / (1 - alpha) per predicted T_cycle(K), and never
  beyond the tokens the run still has to commit. (An unweighted EMA, 0.25 for every verification, let one early
  rejection, 1 accepted of 2 checked, pull alpha from 0.97 to 0.85 and K from 32 to 2: measured at Phi-3.5-MoE shapes,
  9% slower than the best fixed K over 5 prompts; weighted, 0.973 of it.)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from specter.numerics.forward import ForwardService, PromptTrace
from specter.offload.work import ModelWork
from specter.runspec import PROFILE_KS
from specter.speculation.lookahead import plan_from_counts
from specter.timing.cost import CostModel

#: K when a run gives none: the artifact's per-model K where it has one, else DEFAULT_K
ARTIFACT_KS = {"deepseek-v2-lite": 16, "phi-3.5-moe": 16, "qwen1.5-moe-a2.7b": 8}
DEFAULT_K = 8


def default_k(architecture: str | None) -> tuple[int, str]:
    """(K, why) for a speculative run without --k, priced at `architecture` (or its own shapes)."""
    if architecture in ARTIFACT_KS:
        return ARTIFACT_KS[architecture], f"the artifact's K for {architecture} (no --k given)"
    return DEFAULT_K, f"the suite's default K = {DEFAULT_K} (no --k given, no artifact K for this model)"
#: calibration prompts the empirical profiler schedules at every K: the artifact's depth sweep profiles K on 3 inputs
#: (protocol.json, supporting_sweeps: "inputs": 3); here the first 3 of the amortization model's calibration prompts
#: (from the calibration split, never an evaluation set), so that the two governors share those prompts' decodes and,
#: at each prompt's first rebase point, their windows
PROFILE_PROMPTS = 3
#: calibration prompts the amortization model (`auto`, and `online`'s start) reads its windows from: it estimates
#: acceptance and copies from non-overlapping windows of the largest K, one or two per prompt at the run's horizon, so
#: it needs more prompts than the profiler (with 3 it had 3 windows, and picked K = 2 at Phi-3.5-MoE shapes: 1.86x the
#: best fixed K, measured; with 8, 0.97x); windows at an even stride over the calibration stream
CALIBRATION_PROMPTS = 8
EMA_OLD = 0.75


@dataclass(frozen=True)
class GovernorChoice:
    k: int
    method: str
    table: list[dict]  # per K: committed, cycle seconds, predicted or measured TPOT
    alpha: float | None = None  # the calibration windows' per-token acceptance (auto, online)


def calibration_windows(service: ForwardService, traces: list[PromptTrace], kmax: int) -> list:
    """Windows of `kmax` proposals that do not overlap: in each trace, one at the first decode position, then one right
    after the previous window's last proposal."""
    requests = []
    for trace in traces:
        t = len(trace.prompt) + 1
        while t - len(trace.prompt) + kmax < len(trace.tokens):
            requests.append((trace, t, kmax))
            t += kmax + 1
    return service.windows(requests) if requests else []


@dataclass
class CycleModel:
    """T_cycle(K) on a hardware profile: the amortization model's parts, from the calibration windows."""

    work: ModelWork
    cost: CostModel
    slots: int
    draft_expert_bytes: int
    context: int
    top_k: int
    missable: bool  # the cache can miss: the host reads each MoE layer's routing during a verification
    fused: bool = True  # the run's draft kernel (`--draft-kernel`): its steps priced as the executor runs them

    def cycle_seconds(self, k: int, windows) -> dict:
        work, cost = self.work, self.cost
        sync = cost.profile.host_sync
        t_draft = k * (cost.dispatched(work.draft_step_ops(self.context, self.top_k, self.draft_expert_bytes,
                                                           self.fused)) + sync)
        t_verify = cost.dispatched([work.attention_op(layer, k + 1, self.context, "") for layer in work.layers]
                                   + [work.head_op(k + 1, "")])
        t_verify += sync * ((len(work.moe_layers) if self.missable else 0) + 1)
        distinct = predicted_new = new = 0.0
        previous: dict[int, set[int]] = {}
        for w in windows:
            counts = {layer: Counter() for layer in work.moe_layers}
            for r in w.draft_routes[:k]:
                for layer in counts:
                    counts[layer].update(r[layer])
            plan = plan_from_counts(counts, self.slots)
            for layer in work.moe_layers:
                used = {e for r in w.verify_routes[: k + 1] for e in r[layer]}
                kept = set(sorted(used & previous.get(layer, set()))[: self.slots])
                distinct += len(used)
                new += len(used - kept)
                predicted_new += len((used - kept) & set(plan[layer]))
                previous[layer] = used
        n = len(windows)
        copy_s = cost.copy_seconds(work.expert_bytes)
        prefetched = min(predicted_new / n, t_draft / copy_s)  # the planner copies only what lands while drafting
        t_verify += distinct / n * cost.dispatched([work.expert_op(1, "")])
        cycle = max(t_draft, prefetched * copy_s) + (new / n - prefetched) * copy_s + t_verify
        return dict(cycle_s=cycle, t_draft_s=t_draft, t_verify_s=t_verify, new_experts=new / n)


def _committed(windows, k: int) -> float:
    return sum(min(w.accepted(k), k) + 1 for w in windows) / len(windows)


def acceptance(windows, kmax: int) -> float:
    """Per-token acceptance probability of the windows: accepted proposals over proposals checked."""
    accepted = sum(min(w.accepted(kmax), kmax) for w in windows)
    checked = sum(min(w.accepted(kmax) + 1, kmax) for w in windows)
    return accepted / checked if checked else 0.0


def _finite_tpot(cycle_s: float, committed: float, tokens: int) -> float:
    """Predicted TPOT of a run committing `tokens`: whole cycles until they are committed, over N - 1 intervals."""
    return math.ceil((tokens - 1) / committed) * cycle_s / (tokens - 1)


def candidates_for(tokens: int) -> tuple[int, ...]:
    """The windows worth trying for a run of `tokens`: those of `PROFILE_KS` that leave a token to verify after them
    (at least the smallest)."""
    return tuple(k for k in PROFILE_KS if k <= tokens - 2) or PROFILE_KS[:1]


def choose_k_auto(service: ForwardService, traces: list[PromptTrace], model: CycleModel, tokens: int) -> GovernorChoice:
    candidates = candidates_for(tokens)
    windows = calibration_windows(service, traces, max(candidates))
    if not windows:
        raise ValueError("the calibration prompts are too short for the governor; generate more tokens")
    table = []
    for k in candidates:
        committed, parts = _committed(windows, k), model.cycle_seconds(k, windows)
        table.append(dict(k=k, committed=committed, **parts,
                          predicted_tpot_s=_finite_tpot(parts["cycle_s"], committed, tokens)))
    best = min(table, key=lambda row: (row["predicted_tpot_s"], row["k"]))
    return GovernorChoice(best["k"], "auto", table, acceptance(windows, max(candidates)))


def choose_k_profile(run_with_k, tokens: int) -> GovernorChoice:
    """`run_with_k(k)` schedules the calibration prompts and returns their mean TPOT in seconds; the lowest wins.

    The largest K runs first: a window is memoized per rebase point and serves every smaller K there as its prefix
    (see `specter.numerics.forward`), and every K's first window starts at the same point, so the smaller K's first
    windows cost nothing."""
    tpot = {k: run_with_k(k) for k in sorted(candidates_for(tokens), reverse=True)}
    table = [dict(k=k, tpot_s=tpot[k]) for k in sorted(tpot)]
    best = min(table, key=lambda row: (row["tpot_s"], row["k"]))
    return GovernorChoice(best["k"], "profile", table)


@dataclass
class OnlineGovernor:
    """K re-chosen before every cycle from an EMA of the acceptance seen so far (see the module docstring)."""

    cycle_s: dict[int, float]  # predicted T_cycle(K) per candidate
    alpha: float
    tokens: int  # the run's max_new_tokens
    keep_per_token: float = EMA_OLD  # the EMA's old share per checked proposal (see `observe`)
    chosen: list[int] = field(default_factory=list)

    @classmethod
    def calibrated(cls, choice: GovernorChoice, tokens: int) -> OnlineGovernor:
        return cls({row["k"]: row["cycle_s"] for row in choice.table}, choice.alpha or 0.0, tokens,
                   EMA_OLD ** (1 / choice.k))

    def fresh(self) -> OnlineGovernor:
        """The same governor for a new prompt (every prompt starts from the calibration's acceptance)."""
        return OnlineGovernor(self.cycle_s, self.alpha, self.tokens, self.keep_per_token)

    def next_k(self, committed: int) -> int:
        remaining = max(1, self.tokens - committed)
        a = min(self.alpha, 1 - 1e-9)
        best = max((k for k in self.cycle_s if k <= max(remaining, min(self.cycle_s))),
                   key=lambda k: ((1 - a ** (k + 1)) / (1 - a) / self.cycle_s[k], -k))
        self.chosen.append(best)
        return best

    def observe(self, accepted: int, checked: int) -> None:
        """Fold one verification into the EMA, weighted by the proposals it checked: a whole window of the
        calibrated K keeps EMA_OLD of the old estimate (the paper's 0.75 / 0.25), a verification that checked fewer
        proposals (an early rejection) moves it less, as it says less about the per-token rate."""
        if checked:
            keep = self.keep_per_token ** checked
            self.alpha = keep * self.alpha + (1 - keep) * accepted / checked
