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

import torch

from specter.numerics.forward import TraceRecorder
from specter.systems import PassHooks, PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one

GUESS_DEPTH = 10  # the paper tried 1, 2 and 10 layers ahead: the guesses are recorded this deep


class GateGuesses(TraceRecorder):
    """Per decode step, {"layer:d": experts}: the router of the MoE layer d ahead of `layer` applied to `layer`'s
    router input, for d = 1..GUESS_DEPTH where such a layer exists (the target's own routers, so the guesses are the
    model's)."""

    name = "gate_guesses"

    def record(self, moe):
        return moe.record_router_inputs()

    def values(self, moe, log) -> list[dict[str, tuple[int, ...]]]:
        inputs = {layer: calls[-1] for layer, calls in log.items()}  # {layer: router input [T, H]}
        order = [m.layer_index for m in moe.moe_layers]
        tokens = next(iter(inputs.values())).shape[0]
        out: list[dict[str, tuple[int, ...]]] = [{} for _ in range(tokens)]
        with torch.no_grad():
            for i, layer in enumerate(order):
                for d in range(1, min(GUESS_DEPTH, len(order) - 1 - i) + 1):
                    indices = moe.layer(order[i + d]).route(inputs[layer]).indices.tolist()  # [T, k]
                    for t in range(tokens):
                        out[t][f"{layer}:{d}"] = tuple(sorted(indices[t]))
        return out

    def remap(self, values: list, layer_map) -> list:
        """For the architecture's MoE layer at position i and depth d: the proxy's guess from the layer that serves i
        for the proxy layer that serves i + d (at least one layer ahead: where one proxy layer serves two neighbouring
        layers, the guess is for its next one, never the layer's own routing)."""
        position = {layer: i for i, layer in enumerate(layer_map.proxy_layers)}
        arch = layer_map.arch_layers
        keys = []  # (the architecture's key, the proxy's key it reads), the same for every step
        for i, layer in enumerate(arch):
            for d in range(1, min(GUESS_DEPTH, len(arch) - 1 - i) + 1):
                here, there = position[layer_map.source(i)], position[layer_map.source(i + d)]
                keys.append((f"{layer}:{d}", f"{layer_map.source(i)}:{max(1, there - here)}"))
        return [{mine: step[theirs] for mine, theirs in keys if theirs in step} for step in values]


class _SpeculativeLoading(PassHooks):
    """Once layer l's routing is known, prefetch the guess for the layer `depth` MoE layers ahead."""

    def __init__(self, ctx: PromptContext, depth: int) -> None:
        self.ctx, self.depth, self.step = ctx, depth, 0  # step 0: the prefill, where nothing is guessed
        self.order = list(ctx.work.moe_layers)

    def before_step(self, step: int) -> None:
        self.ctx.cache.unprotect_all()  # a prefetch is protected only until the pass that needed it
        self.step = step

    def after_layer(self, layer: int, routes) -> None:
        """After this layer's own demand copies are queued (they are needed first)."""
        if not self.step or not self.depth:
            return
        i = self.order.index(layer)
        if i + self.depth >= len(self.order):
            return
        guess = self.ctx.trace.extras[GateGuesses.name][self.step - 1].get(f"{layer}:{self.depth}")
        if guess:
            self.ctx.executor.prefetch(self.order[i + self.depth], list(guess))


class MixtralOffloading(System):
    name = "mixtral-offloading"
    options = {"depth": (int, 1, "MoE layers ahead whose gate guesses the experts to prefetch (0: off)",
                         (0, GUESS_DEPTH))}
    trace_recorders = (GateGuesses(),)

    def run(self, ctx: PromptContext) -> PromptResult:
        ctx.executor.hooks.append(_SpeculativeLoading(ctx, self.depth))
        return decode_one_by_one(ctx, self.prefill(ctx))
