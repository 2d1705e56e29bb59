"""`mixtral-offloading`: per-layer LRU expert cache plus speculative expert loading.

Source: Eliseev and Mazur, "Fast Inference of Mixture-of-Experts Language Models with Offloading" (arXiv 2312.17238),
github.com/dvmazur/mixtral-offloading. Mechanism: each MoE layer keeps an LRU cache of k experts (the run's budget);
missing experts are copied on demand; and while layer l runs, the gate of the layer `depth` MoE layers ahead is applied
to layer l's hidden state (its router input) and that layer's top choices are prefetched into its cache. The paper tries
1, 2 and 10 layers ahead; `--system-option depth=N` (default 1; 0 turns speculative loading off).
Simplifications: experts stay FP16 instead of HQQ 2/3-bit (every system here commits the target's exact tokens, and
quantized experts would change them); the guess uses the router input of layer l, as the paper's code applies the next
gate to the current layer's normalized hidden states.
"""

from __future__ import annotations

from specter.reference import decode_one_by_one
from specter.systems import PromptContext, PromptResult, System


class MixtralOffloading(System):
    name = "mixtral-offloading"
    options = {"depth": (int, 1, "MoE layers ahead whose gate guesses the experts to prefetch (0: off)")}

    def run(self, ctx: PromptContext) -> PromptResult:
        from specter.spec.forward import GUESS_DEPTH

        if not 0 <= self.depth <= GUESS_DEPTH:
            raise ValueError(f"depth must be between 0 and {GUESS_DEPTH}, got {self.depth}")
        order = list(ctx.work.moe_layers)
        step = {"j": 0}  # 0 during prefill: no guesses there

        def on_route(layer: int, _routes) -> None:
            j = step["j"]
            if not j or not self.depth:
                return
            i = order.index(layer)
            if i + self.depth >= len(order):
                return
            guess = ctx.trace.step_guesses[j - 1].get((layer, self.depth))
            if guess:
                ctx.executor.prefetch(order[i + self.depth], list(guess))

        def before_step(j: int) -> None:
            ctx.cache.unprotect_all()  # a prefetch is protected only until the pass that needed it
            step["j"] = j

        ctx.executor.on_route = on_route
        return decode_one_by_one(ctx, self.prefill(ctx), before_step)
