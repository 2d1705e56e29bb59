"""`sp-moe`: speculative decoding whose draft routing prefetches the target's experts layer by layer, up to a cutoff.

Source: "SP-MoE: Speculative Decoding and Prefetching for Accelerating MoE-based Model Inference" (arXiv 2510.10302);
no public code of it was found, so this follows the paper. Mechanism: draft and target correspond layer by layer, so
once the draft has routed layer l in a draft step, the target's layer-l experts it chose are prefetched by an
asynchronous prefetch thread (batched per layer); prefetching is bounded to the first `cutoff` MoE layers, chosen from
an analytical latency model: the layers whose per-step expert copies fit in one draft step's time (deeper prefetch
delays the loads verification needs first; the paper finds more than about 5 layers hurts). `--system-option
cutoff=N` overrides it (0 turns prefetch off). Experts prefetched are protected until verification ends.
Causality: the prefetch thread reads a draft layer's routing once that layer's router has run (the executor's
`routed` for `on_draft_layer` is the router's compute, not the launch of its kernels) and pays the host's read of it
(a host worker waiting on a device event: the profile's host synchronization) before its copies are issued; the
main thread goes on launching the draft.
Departures: the draft is the suite's quantized self-draft (the same as Specter's), so the comparison isolates the
prefetch policy; K comes from `--k`.
"""

from __future__ import annotations

from dataclasses import replace

from specter.speculation.lookahead import WindowPlanner
from specter.systems import PromptContext
from specter.systems.specter import SPECTER_ARTIFACT, Specter


class _LayerwisePrefetch(WindowPlanner):
    """Prefetch a draft layer's experts into the target's same layer as the draft routes them (during drafting only:
    the verification itself prefetches nothing)."""

    def __init__(self, ctx: PromptContext, cutoff_layers: set[int]) -> None:
        super().__init__()
        self.ctx, self.cutoff_layers = ctx, cutoff_layers

    def on_draft_layer(self, layer: int, experts: tuple[int, ...]) -> None:
        if layer in self.cutoff_layers:
            self.plan.setdefault(layer, [])
            self.plan[layer] += [e for e in experts if e not in self.plan[layer]]
            self.ctx.executor.prefetch(layer, list(experts))


#: No code of SP-MoE was public to the suite: its kernels and host reads are assumed to be those of the Specter
#: artifact's runtime (the same kind of system: an eager target over an expert cache beside a fused INT4 draft).
_ASSUMED = "no public code: priced as the Specter artifact's runtime"
UPSTREAM = replace(SPECTER_ARTIFACT, sources=(), assumption=_ASSUMED, by_architecture=tuple(
    (a, replace(u, sources=(), assumption=_ASSUMED)) for a, u in SPECTER_ARTIFACT.by_architecture))


class SPMoE(Specter):
    name = "sp-moe"
    order, colour = 80, "#55a868"
    upstream = UPSTREAM
    options = {"cutoff": (int, -1, "MoE layers prefetched from the draft (-1: from the latency model, 0: off)",
                          (-1, 100_000))}

    def cutoff_layers(self, ctx: PromptContext) -> int:
        """The MoE layers to prefetch: the option, or those whose per-step copies fit in one draft step's time."""
        if self.cutoff >= 0:
            return self.cutoff
        cost, work = ctx.cost, ctx.work
        top_k = len(ctx.trace.prefill_routes[0][work.moe_layers[0]])
        step_s = cost.dispatched(work.draft_step_ops(len(ctx.trace.prompt), top_k, ctx.config.draft_expert_bytes,
                                                     ctx.config.draft_kernel == "fused"))
        per_layer = top_k * cost.copy_seconds(work.expert_bytes)
        return max(1, min(len(work.moe_layers), int(step_s // per_layer)))

    def planner(self, ctx: PromptContext, k: int, state):
        n = self.cutoff_layers(ctx)
        return _LayerwisePrefetch(ctx, set(ctx.work.moe_layers[:n]))
