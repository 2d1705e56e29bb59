"""The governor: choosing the draft window K.

`auto` (the paper's amortization roofline): K maximizing committed(K) / T_cycle(K) with
T_cycle = max(T_draft(K), T_pcie_init(K)) + T_pcie_new(K) + T_verify(K + 1), where, over profiling windows taken from
the first prompt (numerics only, memoized):
- committed(K) = mean of min(accepted, K) + 1 (the target's own token);
- T_draft(K) = K draft steps, T_verify(K + 1) one target pass over the window's distinct experts, both from the cost
  model of the hardware profile;
- the experts a verification needs that the previous window did not use (up to the slots) must cross the link: those
  the draft's plan predicted are copied while drafting (T_pcie_init), the rest on demand after it (T_pcie_new).
`profile` (the artifact's empirical profiler): schedule the first prompt with Specter for every K in `PROFILE_KS` and
keep the K of the lowest simulated TPOT.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from specter.numerics.forward import ForwardService, PromptTrace
from specter.offload.work import ModelWork
from specter.speculation.lookahead import plan_from_counts
from specter.timing.cost import CostModel

PROFILE_KS = (2, 4, 6, 8, 12, 16, 20, 24, 32)
PROFILE_WINDOWS = 8


@dataclass(frozen=True)
class GovernorChoice:
    k: int
    method: str
    table: list[dict]  # per K: committed, cycle seconds (or TPOT), score


def _profiling_windows(service: ForwardService, trace: PromptTrace, kmax: int):
    p = len(trace.prompt)
    starts = [p + 1 + i * max(1, (len(trace.tokens) - kmax - 2) // PROFILE_WINDOWS) for i in range(PROFILE_WINDOWS)]
    return [service.window(trace, t, kmax) for t in starts if t - p + kmax < len(trace.tokens)]


def choose_k_auto(service: ForwardService, trace: PromptTrace, work: ModelWork, cost: CostModel, slots: int,
                  draft_expert_bytes: int, candidates=PROFILE_KS) -> GovernorChoice:
    windows = _profiling_windows(service, trace, max(candidates))
    if not windows:
        raise ValueError("the profiling prompt is too short for the governor; generate more tokens")
    context = len(trace.prompt) + len(trace.tokens) // 2
    copy_s = cost.copy_seconds(work.expert_bytes)
    table = []
    for k in candidates:
        committed = sum(min(w.accepted(k), k) + 1 for w in windows) / len(windows)
        t_draft = k * cost.total(work.draft_step_ops(context, _top_k(windows[0]), draft_expert_bytes))
        distinct = predicted_new = unpredicted_new = 0.0
        previous: dict[int, set[int]] = {}
        for w in windows:
            counts = {layer: Counter() for layer in work.moe_layers}
            for r in w.draft_routes[:k]:
                for layer in counts:
                    counts[layer].update(r[layer])
            plan = plan_from_counts(counts, slots)
            for layer in work.moe_layers:
                used = {e for r in w.verify_routes[: k + 1] for e in r[layer]}
                kept = set(sorted(used & previous.get(layer, set()))[:slots])
                new = used - kept
                distinct += len(used)
                predicted_new += len(new & set(plan[layer]))
                unpredicted_new += len(new - set(plan[layer]))
                previous[layer] = used
        n = len(windows)
        distinct, predicted_new, unpredicted_new = distinct / n, predicted_new / n, unpredicted_new / n
        t_verify = cost.total([work.attention_op(layer, k + 1, context, "") for layer in work.layers]
                              + [work.head_op(k + 1, "")])
        t_verify += distinct * cost.seconds(work.expert_op(1, ""))
        cycle = max(t_draft, predicted_new * copy_s) + unpredicted_new * copy_s + t_verify
        table.append(dict(k=k, committed=committed, cycle_s=cycle, tokens_per_s=committed / cycle))
    best = max(table, key=lambda row: (row["tokens_per_s"], -row["k"]))
    return GovernorChoice(best["k"], "auto", table)


def _top_k(window) -> int:
    first = window.draft_routes[0]
    return len(next(iter(first.values())))


def choose_k_profile(run_with_k, candidates=PROFILE_KS) -> GovernorChoice:
    """`run_with_k(k)` schedules the profiling prompt and returns its TPOT in seconds; the lowest wins."""
    table = [dict(k=k, tpot_s=run_with_k(k)) for k in candidates]
    best = min(table, key=lambda row: (row["tpot_s"], row["k"]))
    return GovernorChoice(best["k"], "profile", table)
