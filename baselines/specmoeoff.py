"""`specmoeoff`: speculative decoding with a separate INT4 draft, as the Specter artifact configures SpecMoEOff.

Source: "SpecMoEOff: Accelerating Mixture-of-Experts Inference with Hardware-Aware Speculative Decoding and Offloading"
(arXiv 2508.21706), as the Specter artifact (wwwwwf/specter_asplos) runs it: `baselines/specmoeoff/controller.py`
`LegacyPrefetchController` (route-frequency top-M prefetch), `decoder.py` `greedy_decode` (K = 3, separate draft and
target KV caches), `cache.py` `ExpertCache` (per-layer LRU, demand misses on a transfer stream, hits first).
Mechanism: the draft keeps its own copy of the non-expert weights and its own KV cache (device memory for both, fewer
expert slots, and its own prefill of the prompt); its routes are counted per (layer, expert) over the window, and
after draft token `index` (0-based) for each index in {int(0.2 K), int(0.6 K)} (`after_draft_token`; K = 3 gives
indices 0 and 1: after the first and the second draft step) the top-M per layer with a count above zero (M = slots)
are prefetched; before verification the compute stream waits for the prefetch stream (`before_verify`). `--system-option
k=N` (default 3) sets K; `--k` is ignored; `--system-option verify-waits=false` lets the verification start while
prefetches are in flight (each expert then waits only for its own copy).
Departures: the draft is the suite's quantized self-draft (the same quantized experts), run with its own KV; the
paper's EAGLE-style draft heads and CPU chunked attention are not reproduced (the artifact's adaptation has neither
either). The last plan's experts stay protected until the verification ends (the artifact's cache protects a plan's
experts while it is admitted and a demand's hits while it runs). Sampling runs share the target's KV.
"""

from __future__ import annotations

from dataclasses import replace

from specter.speculation.lookahead import WindowPlanner, plan_from_counts
from specter.systems import PromptContext, PromptResult
from specter.systems.specter import SPECTER_ARTIFACT, Specter
from specter.timing.engine import COMPUTE, H2D

FRACTIONS = (0.2, 0.6)  # controller.py's default `fractions`


class _FrequencyPlans(WindowPlanner):
    """Top-M of the draft's route counts so far, after draft tokens int(0.2 K) and int(0.6 K) (0-based); the
    verification waits for them (`verify_waits`)."""

    def __init__(self, ctx: PromptContext, k: int, verify_waits: bool) -> None:
        super().__init__()
        self.ctx, self.verify_waits, self.issued = ctx, verify_waits, False
        self.steps = {int(k * f) + 1 for f in FRACTIONS}  # 1-based draft steps

    def after_step(self, step, counts, step_seconds) -> None:
        if step in self.steps:
            cache = self.ctx.cache
            cache.unprotect_all()  # a plan's experts are kept from eviction while it is admitted, not after
            self.plan = plan_from_counts(counts, cache.slots_per_layer)
            for layer, experts in self.plan.items():
                for e in experts:  # prefetch_experts marks each used: the resident ones become the most recent
                    if (layer, e) in cache:
                        cache.touch(layer, e)
                self.issued |= bool(self.ctx.executor.prefetch(layer, experts))

    def before_verify(self, counts) -> None:
        if self.verify_waits and self.issued:  # the compute stream waits on the prefetch stream's last event
            engine = self.ctx.engine
            engine.wait(COMPUTE, engine.record(H2D))


#: SpecMoEOff as the Specter artifact runs it (github.com/wwwwwf/specter_asplos, `baselines/specmoeoff/`): the
#: artifact's target and fused draft (Specter's counts), and the controller's route counting on the draft, two
#: launches per draft MoE layer a step (`controller.py` 18-25: 9 + 2 per draft MoE layer).
_SOURCE = ("wwwwwf/specter_asplos c0325dcd389f51b7c4ad793d939f8de80238b432: baselines/specmoeoff/controller.py 18-45, "
           "cache.py 117-141")
UPSTREAM = replace(SPECTER_ARTIFACT, draft_experts=SPECTER_ARTIFACT.draft_experts + 2, sources=(_SOURCE,),
                   by_architecture=tuple((a, replace(u, draft_experts=u.draft_experts + 2, sources=(_SOURCE,)))
                                         for a, u in SPECTER_ARTIFACT.by_architecture))


class SpecMoEOff(Specter):
    name = "specmoeoff"
    order, colour = 90, "#8172b3"
    upstream = UPSTREAM
    separate_draft = True
    takes_window = False
    prefetch_in_window = False  # its second plan of a window releases the first's experts (`_FrequencyPlans`)
    window_plans = 2  # one after each of FRACTIONS' draft steps, a layer's top slots each
    options = {"k": (int, 3, "draft window K (the artifact's SpecMoEOff setting: 3)", (1, 1024)),
               "verify-waits": (bool, True, "the verification waits for the window's prefetches to land (the "
                                            "artifact's before_verify)")}

    def window(self, k: int | None) -> int:
        return self.k  # its own option; the run's --k does not apply

    def planner(self, ctx: PromptContext, k: int, state):
        return _FrequencyPlans(ctx, k, self.verify_waits)

    def prefill(self, ctx: PromptContext) -> PromptResult:
        """The target's prefill, then the draft's own prefill of the prompt into its separate KV."""
        result = super().prefill(ctx)
        # The draft reads the prompt into its own KV: one pass, its experts resident. Simulated, the target's prompt
        # routes stand in for the draft's (the costs depend on how many distinct experts run, which the two share
        # closely); live, the draft runs on the prompt and its routes are its own.
        ex = ctx.executor
        if ex.live:
            end = ex.draft_pass(None, context=0, expert_bytes=ctx.config.draft_expert_bytes, tag="draft-prefill",
                                inputs=ctx.trace.prompt)
        else:
            end = ex.draft_pass(ctx.trace.prefill_routes, context=0, expert_bytes=ctx.config.draft_expert_bytes,
                                tag="draft-prefill")
        ctx.engine.synchronize(end)
        return result
