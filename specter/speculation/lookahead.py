"""The lookahead analyzer and the prefetch planner (the artifact's Predictive I/O Orchestrator).

Analyzer: the draft's routing over the window so far, as counts per (layer, expert); the plan of a layer is its top-M
experts with a count of at least one (M = the layer's slots), ties broken by expert id.

Planner policies:
- `adaptive` (the artifact's): the first plan after max(1, int(0.2 K)) draft steps; after each plan, the next comes
  ceil(bytes just issued / (bw_est x t_draft_step)) steps later, with bw_est (initially 12 GB/s) and t_draft_step
  (initially 1 ms) exponential moving averages (0.75 old, 0.25 new) of measured copy bandwidth and draft-step time.
  The bandwidth folds in each plan's copies once they land and each verification's demand copies (one batch per
  verification: bytes over summed copy times). The artifact times the planner's own copies; with those alone an
  estimate by which not even one copy lands in time (the 12 GB/s start against a 352 MB Mixtral expert and a 27 ms
  window on the H200 preset) never issues a copy and so never learns the link: the planner stayed inert. Specter's
  `bandwidth-estimate=prefetches` option keeps the artifact's way.
  As in the artifact's planner, nothing is issued at the end of drafting. The copies of a plan are issued in layer
  order and only while, by those estimates, they land before the verification starts (K draft steps after the window
  began): the link is idle while the draft drafts, and a copy that would still be in flight then would delay the
  verification's own demand copies, which queue behind it on the one copy stream.
- `none`: no prefetch; `early`: one plan after the first draft step; `late`: one cumulative plan just before the
  verification (the artifact's ablation arms; neither is held to the drafting time).
Under every policy a prefetch never evicts an expert the draft forecast for this window (count >= 1), and planned
experts stay protected until the verification ends.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from specter.offload.executor import Executor
from specter.offload.hooks import PassHooks
from specter.runspec import PREFETCH_POLICIES as POLICIES

EMA_OLD = 0.75
INITIAL_BW = 12e9  # bytes/s
INITIAL_STEP = 1e-3  # s


def plan_from_counts(counts: dict[int, Counter], slots: int) -> dict[int, list[int]]:
    """{layer: top-`slots` experts by draft count (count >= 1), most counted first, ties by expert id}."""
    return {layer: [e for e, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))[:slots]]
            for layer, c in counts.items()}


@dataclass
class PlannerState:
    """What the planner learns across cycles of one prompt: the EMAs."""

    bw_est: float = INITIAL_BW
    t_step: float = INITIAL_STEP
    pending: list[tuple[float, int, object]] = field(default_factory=list)  # (host issue time, bytes, last event)

    def observe_step(self, seconds: float) -> None:
        if seconds > 0:
            self.t_step = EMA_OLD * self.t_step + (1 - EMA_OLD) * seconds

    def observe_copies(self, executor: Executor) -> None:
        """Fold in the bandwidth of copy batches that have landed by now (host time). It asks each batch's event
        whether it has completed (`Engine.landed`), never waits for one: drafting goes on while copies are in flight."""
        still = []
        for issued, nbytes, event in self.pending:
            landed = executor.engine.landed(event) if event.time is not None or event.handle is not None else None
            if landed is None:
                still.append((issued, nbytes, event))
            elif landed > issued:
                self.bw_est = EMA_OLD * self.bw_est + (1 - EMA_OLD) * nbytes / (landed - issued)
        self.pending = still

    def observe_demand(self, executor: Executor) -> None:
        """Fold in the bandwidth of the demand copies timed since the last call (`executor.timed_demand`, which a
        planner that learns from them turns on), as one batch: their bytes over their summed copy times. A copy
        starts when the copy stream has passed its waits and the host has issued it, and ends at its event: the
        link's own time, where a plan's batch is timed from its issue and so also counts what it queued behind (at
        drafting time the link is idle). Call it once they have landed (after the verification)."""
        if executor.timed_demand is None:
            return
        timed, executor.timed_demand = executor.timed_demand, []
        engine, seconds = executor.engine, 0.0
        for issued, before, after in timed:
            seconds += max(0.0, engine.event_time(after) - max(issued, engine.event_time(before)))
        if seconds > 0:
            nbytes = len(timed) * executor.work.expert_bytes
            self.bw_est = EMA_OLD * self.bw_est + (1 - EMA_OLD) * nbytes / seconds


class WindowPlanner(PassHooks):
    """One window's prefetch decisions, told of the draft's progress. `plan` is what it last planned
    ({layer: experts}); as a `PassHooks` it may also act after each layer of a draft step."""

    def __init__(self) -> None:
        self.plan: dict[int, list[int]] = {}

    def after_step(self, step: int, counts: dict[int, Counter], step_seconds: float) -> None:
        """After draft step `step` (1-based), with the window's counts per (layer, expert) so far."""

    def before_verify(self, counts: dict[int, Counter]) -> None:
        """Drafting is over; the verification is scheduled next."""


class Planner(WindowPlanner):
    """The lookahead analyzer's top-M plans, by policy (Specter's)."""

    def __init__(self, policy: str, k: int, executor: Executor, slots: int, state: PlannerState,
                 demand_copies: bool = True) -> None:
        """`demand_copies`: the adaptive policy's bandwidth estimate also learns from the verifications' demand copies
        (False: from its own copies only, as the artifact's)."""
        super().__init__()
        if policy not in POLICIES:
            raise ValueError(f"unknown prefetch policy {policy!r}; policies: {', '.join(POLICIES)}")
        if policy == "adaptive" and demand_copies and executor.timed_demand is None:
            executor.timed_demand = []  # from now on the executor times demand copies (see observe_demand)
        self.policy, self.k, self.executor, self.slots, self.state = policy, k, executor, slots, state
        self.next_plan = max(1, int(0.2 * k)) if policy == "adaptive" else (1 if policy == "early" else None)
        self.started = executor.engine.now()  # the window's first draft step is launched now
        self.link_free = self.started  # when, by the estimates, the copies issued so far will have landed
        self._step = 0

    def _in_time(self, copy_s: float) -> bool:
        """Whether one more copy lands before the verification is expected to start (adaptive only)."""
        return self.policy != "adaptive" or self.link_free + copy_s <= self.started + self.k * self.state.t_step

    def _issue(self, counts: dict[int, Counter]) -> None:
        self.plan = plan_from_counts(counts, self.slots)
        engine, cache = self.executor.engine, self.executor.cache
        copy_s = self.executor.work.expert_bytes / self.state.bw_est
        issued_at = engine.now()
        self.link_free = max(self.link_free, issued_at)
        issued = 0
        for layer, experts in self.plan.items():  # layer order: the verification needs them in this order
            forecast = set(counts[layer])
            for e in experts:
                if (layer, e) not in cache and not self._in_time(copy_s):
                    break
                if self.executor.prefetch(layer, [e], keep=forecast):
                    issued += 1
                    self.link_free += copy_s
                elif (layer, e) not in cache:  # no slot left that holds an expert outside the forecast
                    break
        if issued:
            from specter.timing.engine import H2D

            nbytes = issued * self.executor.work.expert_bytes
            self.state.pending.append((issued_at, nbytes, engine.record(H2D)))
            if self.policy == "adaptive":
                chunk = math.ceil(nbytes / (self.state.bw_est * self.state.t_step))
                self.next_plan = self._step + max(1, chunk)
        elif self.policy == "adaptive":
            self.next_plan = self._step + 1

    def after_step(self, step: int, counts: dict[int, Counter], step_seconds: float) -> None:
        """Called after draft step `step` (1-based) with the window's counts so far."""
        self._step = step
        self.state.observe_step(step_seconds)
        self.state.observe_copies(self.executor)
        if self.next_plan is not None and step == self.next_plan and step < self.k:
            if self.policy == "early":
                self.next_plan = None
            self._issue(counts)

    def before_verify(self, counts: dict[int, Counter]) -> None:
        """The `late` policy's one plan over the whole window; `plan` stays the last one issued otherwise."""
        self._step = self.k
        if self.policy == "late":
            self._issue(counts)
