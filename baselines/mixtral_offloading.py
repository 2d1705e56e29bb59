"""`mixtral-offloading`: per-layer LRU expert cache whose loads swap experts, as Mixtral-Offloading's code runs it.

Source: Eliseev and Mazur, "Fast Inference of Mixture-of-Experts Language Models with Offloading" (arXiv 2312.17238),
github.com/dvmazur/mixtral-offloading, `src/expert_cache.py`: `ExpertCache.load_experts(..., unordered=True)` and
`ExpertCache._swap`, called by `src/custom_layers.py` `SparseMoeWrapper.forward`; as the Specter artifact runs it
(`baselines/mixtral_offloading/`: upstream's cache unchanged, FP16 experts, 4 buffers, `"predictive_prefetch":
False`). Mechanism, per MoE layer of a pass: the host reads the layer's routed experts (`unique().tolist()`), orders
them resident first (a stable sort, ids ascending within each group) and marks every one used (least recently used
first per layer, `OrderedDict.move_to_end`). Each missing expert is swapped in: the least recently used resident expert
is evicted, the missing one copied host to device and the evicted one device to host (a write-back into the freed host
buffer), both `copy_(..., non_blocking=True)` on the current stream, which is the compute stream: the copies and the
experts' compute run one after another in issue order. `buffer_size - 1` swaps (3 of the 4 buffers) are issued before
the first expert computes; each later swap is issued after the expert ahead of it computed.

Departures (the code's behaviour is the default):
- experts stay FP16, as the artifact runs them (upstream quantizes them with HQQ to 2 or 3 bits; quantized experts
  would change the tokens every system here commits);
- the write-back leaves the evicted expert's slot before the load enters it (upstream loads into a spare buffer and
  retires the evicted one's: the same copies, in compute order either way);
- a missing expert with no slot free of this pass's experts streams through a staging buffer without entering the
  cache (upstream evicts one the pass still needs and reloads it next time: only when a pass needs more experts than a
  layer has slots);
- `--system-option depth=N` turns on the paper's speculative loading (gate-ahead prefetch: while layer l runs, the
  gate of the layer N MoE layers ahead is applied to layer l's router input and its top choices are prefetched on
  the copy stream; the paper tries 1, 2 and 10 layers ahead). The public code does not have it (its README lists it
  as not yet released) and the artifact runs with it off, so the default is 0.
"""

from __future__ import annotations

from collections import Counter

import torch

from specter.numerics.forward import TraceRecorder
from specter.offload.executor import Executor
from specter.offload.memory import STAGING_BUFFERS
from specter.offload.work import Upstream
from specter.systems import PassHooks, PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D

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


class SwapExecutor(Executor):
    """`load_experts(unordered=True)` over `_swap`: resident experts first, `buffers - 1` swaps in flight, each swap a
    load and a write-back in the compute stream's order."""

    buffers = STAGING_BUFFERS  # upstream's buffer_size (the artifact's 4)

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = Counter(e for r in routes for e in r)
        needed = sorted(tokens_per_expert)  # unique(): ids ascending
        order = sorted(needed, key=lambda e: (layer, e) not in self.cache)  # resident first (a stable sort)
        resident = [e for e in order if (layer, e) in self.cache]
        to_load = [e for e in order if (layer, e) not in self.cache]
        for e in resident:  # mark_used: each moves to the most recently used end, in this order
            self.cache.touch(layer, e)
        self.stats.demand.hit(layer, len(resident))
        self.stats.demand.miss(layer, len(to_load))
        pending = set(needed)  # experts of this pass not yet computed: a swap never evicts one
        window = min(self.buffers - 1, self.cache.slots_per_layer, len(to_load))
        staged = {e: self._swap(layer, e, pending, tag) for e in to_load[:window]}  # before any expert computes
        for e in resident + to_load:
            if e in resident and self.cache.slot(layer, e).ready is not None:  # a prefetch may still be landing
                self.engine.wait(COMPUTE, self.cache.slot(layer, e).ready)
            self._expert(layer, e, tokens_per_expert[e], f"{tag}.L{layer}.e{e}", staging=staged.get(e))
            pending.discard(e)
            if e in staged and len(staged) < len(to_load):  # the next swap, once the expert ahead has computed
                nxt = to_load[len(staged)]
                staged[nxt] = self._swap(layer, nxt, pending, tag)

    def _swap(self, layer: int, e: int, pending: set[int], tag: str) -> int | None:
        """Load `e` in the compute stream's order, writing the evicted expert back first; returns None (it entered the
        cache) or the staging buffer it streamed through."""
        self.stats.h2d_bytes_demand += self.work.expert_bytes
        label = f"{tag}.L{layer}.demand.e{e}"
        self.engine.wait(H2D, self.engine.record(COMPUTE))  # the current stream: after the compute issued so far
        if not self.cache.has_room(layer, keep=pending):
            ready, staging = self._copy_to_staging(layer, e, label)
        else:
            victim = self.cache.victim(layer, keep=pending)
            if victim is not None:  # the write-back of the evicted expert, from its slot, before the load reuses it
                slot = self.cache.slot(layer, victim)
                if slot.last_use is not None:
                    self.engine.wait(H2D, slot.last_use)
                self.engine.launch(H2D, self.write_back(layer, victim, slot.index,
                                                        f"{tag}.L{layer}.writeback.e{victim}"))
            ready, staging = self._copy_into_slot(layer, e, pending, label), None
        self.engine.wait(COMPUTE, ready)  # the compute after it, in the stream's order
        return staging


#: Mixtral-Offloading's kernels and host reads as its public code decodes a token at batch 1, counted from
#: github.com/dvmazur/mixtral-offloading at commit ce545188b804238f0b23a59fc45e6a8f8b390c40 with the HQQ commit its
#: requirements pin (mobiusml/hqq 37502bea31f2969c6680c0c4a88ca74b3bb234a5) and transformers 4.36.1, in its notebook's
#: configuration (4-bit attention, 2-bit experts, quantized scales and zeros):
#: - an HQQ linear (`src/custom_layers.py` 55-92) runs 7 kernels: the 8-bit scale and zero dequantized (3 each) on every
#:   call, then one Triton matmul;
#: - attention block 81 (79 to 86): two RMSNorms (8 each), q/k/v/o as HQQ linears (28), rotary (12), the KV cache's cat
#:   and repeat (4), eager attention (6), two residual adds, and the router before the expert loop (13: gate, softmax,
#:   top-k, renormalisation, cast, one-hot, unique; 276-292);
#: - one routed expert on one token 32 (31 to 34; 295-312): the token's index (nonzero, gather), w1, w3 and w2 as HQQ
#:   linears (21), the activation, the product, the routing weight and `index_add_`; with FP16 experts (the Specter
#:   artifact's configuration) its three linears are one kernel each: 14;
#: - head 10: the final norm (8), the LM head and the cast to float (greedy: the notebook's sampling adds more);
#: - host reads 14 a MoE layer: `unique`'s size and its `.tolist()` (292), and per routed expert the `torch.where` (297)
#:   and two `.tolist()` (301-302): 8 reads; and per routed expert three indexings by a Python list (307-308), each a
#:   blocking host-to-device copy of the list: 6 more.
UPSTREAM = Upstream(attention=81, expert=32, head=10, host_reads=14, expert_unquantized=14, sources=(
    "dvmazur/mixtral-offloading ce545188b804238f0b23a59fc45e6a8f8b390c40: src/custom_layers.py 55-92 (HQQ linear), "
    "253-312 (the MoE block)", "mobiusml/hqq 37502bea31f2969c6680c0c4a88ca74b3bb234a5 (dequantization)",
    "transformers 4.36.1 (modeling_mixtral: attention, norms)"))


class MixtralOffloading(System):
    name = "mixtral-offloading"
    order, colour = 50, "#da8bc3"
    upstream = UPSTREAM
    options = {"depth": (int, 0, "the paper's speculative loading: MoE layers ahead whose gate guesses the experts to "
                                 "prefetch (0: off, as the public code and the artifact run it)", (0, GUESS_DEPTH))}
    trace_recorders = (GateGuesses(),)

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        return SwapExecutor(engine, work, cache, stats, device, cost)

    def cannot_run_live(self) -> str | None:
        if self.depth:
            return (f"depth={self.depth} guesses from the target's recorded gate guesses, which the live engine does "
                    "not compute")
        return super().cannot_run_live()

    def run(self, ctx: PromptContext) -> PromptResult:
        if self.depth:
            ctx.executor.hooks.append(_SpeculativeLoading(ctx, self.depth))
        return decode_one_by_one(ctx, self.prefill(ctx))
