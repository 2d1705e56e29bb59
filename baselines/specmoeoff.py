"""`specmoeoff`: speculative decoding with a separate INT4 draft, as the Specter artifact configures SpecMoEOff.

Source: "SpecMoEOff: Accelerating Mixture-of-Experts Inference with Hardware-Aware Speculative Decoding and Offloading"
(arXiv 2508.21706); its configuration in the Specter artifact (wwwwwf/specter_asplos): INT4 draft, K = 3,
route-frequency top-M prefetch at 0.2 K and 0.6 K draft steps, separate weights and KV for the draft.
Mechanism here: the draft keeps its own copy of the non-expert weights and its own KV cache (device memory for both,
fewer expert slots, and its own prefill of the prompt); after max(1, int(0.2 K)) and max(1, int(0.6 K)) draft steps the
experts most often routed by the draft so far (top-M per layer, M = slots) are prefetched; no cleanup plan before
verification. `--system-option k=N` (default 3) sets K; `--k` is ignored.
Simplifications: the draft is the suite's quantized self-draft (the same quantized experts), run with its own KV; the
paper's EAGLE-style draft heads and CPU chunked attention are not reproduced. Sampling runs share the target's KV.
"""

from __future__ import annotations

from specter.speculation.lookahead import WindowPlanner, plan_from_counts
from specter.systems import PromptContext, PromptResult
from specter.systems.specter import Specter


class _FrequencyPlans(WindowPlanner):
    """Top-M of the draft's route counts so far, at 0.2 K and 0.6 K draft steps; no cleanup plan."""

    def __init__(self, ctx: PromptContext, k: int) -> None:
        super().__init__()
        self.ctx = ctx
        self.steps = sorted({max(1, int(0.2 * k)), max(1, int(0.6 * k))})

    def after_step(self, step, counts, step_seconds) -> None:
        if step in self.steps:
            self.plan = plan_from_counts(counts, self.ctx.cache.slots_per_layer)
            for layer, experts in self.plan.items():
                self.ctx.executor.prefetch(layer, experts)


class SpecMoEOff(Specter):
    name = "specmoeoff"
    separate_draft = True
    takes_window = False
    options = {"k": (int, 3, "draft window K (the artifact's SpecMoEOff setting: 3)", (1, 1024))}

    def window(self, k: int | None) -> int:
        return self.k  # its own option; the run's --k does not apply

    def planner(self, ctx: PromptContext, k: int, state):
        return _FrequencyPlans(ctx, k)

    def prefill(self, ctx: PromptContext) -> PromptResult:
        """The target's prefill, then the draft's own prefill of the prompt into its separate KV."""
        result = super().prefill(ctx)
        # The draft reads the prompt into its own KV: one pass, its experts resident; the target's prompt routes stand
        # in
        # for the draft's (the costs depend on how many distinct experts run, which the two share closely).
        end = ctx.executor.draft_pass(ctx.trace.prefill_routes, context=0, expert_bytes=ctx.config.draft_expert_bytes,
                                      tag="draft-prefill")
        ctx.engine.synchronize(end)
        return result
