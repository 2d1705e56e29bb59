"""`moe-infinity`: on-demand expert fetching with a visit-count cache, as MoE-Infinity's released code serves; its
paper's activation-aware prefetching as an option.

Source: Xue et al., "MoE-Infinity: Offloading-Efficient MoE Model Serving" (arXiv 2401.14361),
github.com/EfficientMoE/MoE-Infinity. As its code runs:
- `moe_infinity/models/mixtral.py` and `deepseek.py` (`forward` of the MoE block) hand each layer's routed experts to
  `ExpertDispatcher::dispatch_local`; their calls of `ExpertPredictor.predict` and `ExpertPrefetcher.prefetch_experts`
  are commented out (since the release that added DeepSeek, and in the one whose README publishes the DeepSeek-V2-Lite
  TPOT), so nothing is prefetched: a missing expert is fetched when its layer runs, on a fetch stream of its own (the
  suite's copy stream), and computed once it lands;
- `core/parallel/expert_dispatcher.cpp` `ExpertDispatcher::GPUFetchFunc`: when the cache is full, the resident expert
  with the fewest `incache_visit_count` is evicted (ties to the lowest expert id: the scan's first minimum); every
  dispatch of an expert adds one to its count, and the counts outlive requests (`clear_expert_cache_counts` in
  `entrypoints/big_modeling.py` sits after a `return`), so the suite starts each prompt from the counts of the warm-up
  prompts (the calibration split, never the evaluation prompts), one visit per expert per layer and pass.
With `--system-option prefetch=true`, the paper's activation-aware prefetch as `expert_predictor.py`
`ExpertPredictor.predict` and `expert_prefetcher.py` `ExpertPrefetcher.prefetch_experts` write it: the request's
Expert Activation Matrix so far (EAM, layers x experts token counts) is matched to a store of past requests' EAMs (the
warm-up prompts', `--system-option warmup=N`, default 8) by cosine similarity, the best match's rows of the layers
ahead are weighted by 1 - (x - l) / (L + 1) for layer x ahead of the current layer l, and every expert of positive
score is prefetched, highest first (`per-step=N` caps them per layer step; 0, the default, does not), displacing only an
expert predicted to be used less. `eviction=activation` evicts the expert of lowest predicted activation (the paper's
activation-aware caching) instead of the fewest visits.

Departures: the suite's budgets are per-layer slots (equal capacity for every system), so eviction chooses within a
layer (the code's cache is one pool over every layer); the EAM match is the cosine of the whole flattened matrices
(the tracer's `find_most_similar` compares layer-normalized rows of the layers ahead).
"""

from __future__ import annotations

import torch

from specter.offload.cache import ExpertCache
from specter.offload.work import Upstream
from specter.systems import PassHooks, PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one


def eam_of(trace, experts: int) -> torch.Tensor:
    """[L, E] token counts of a whole trace: its prompt and every decode step (computed once per trace)."""
    return trace.derive(("moe-infinity-eam", experts), lambda t: _count_experts(t, experts)).clone()


def _count_experts(trace, experts: int) -> torch.Tensor:
    layers = sorted(trace.prefill_routes[0])
    counts = [[0] * experts for _ in layers]
    for r in trace.prefill_routes + trace.step_routes:
        for i, layer in enumerate(layers):
            for e in r[layer]:
                counts[i][e] += 1
    return torch.tensor(counts, dtype=torch.float32)


class PriorityCache(ExpertCache):
    """Evicts the expert of lowest priority rather than the least recently used: the fewest visits (the code's), or
    the lowest predicted activation (`eviction=activation`); ties to the lowest expert id."""

    priority = None  # callable (layer, expert) -> float, set by the system

    def victim(self, layer, keep=frozenset()):
        if len(self.entries[layer]) < self.slots_per_layer:
            return None
        candidates = [e for e in self.entries[layer] if e not in self.protected[layer] and e not in keep]
        if not candidates:
            return None
        return min(candidates, key=lambda e: (self.priority(layer, e) if self.priority else 0.0, e))


class _ActivationAware(PassHooks):
    """The request's EAM so far, matched to the store before each step; after each layer's routing, prefetch the
    layers ahead by predicted activation x layer distance, displacing only experts predicted to be used less."""

    def __init__(self, ctx: PromptContext, store: list[torch.Tensor], per_step: int) -> None:
        self.ctx, self.store, self.per_step = ctx, store, per_step
        self.order = list(ctx.work.moe_layers)
        self.row = {layer: i for i, layer in enumerate(self.order)}
        self.counts = [[0] * ctx.work.experts_per_layer for _ in self.order]  # the request's EAM so far
        self.pred: torch.Tensor | None = None
        self.pred_rows: list | None = None
        self.step = 0
        n = len(self.order)
        self.weights = [torch.tensor([1 - (ahead - i) / (n + 1) for ahead in range(i + 1, n)], dtype=torch.float64)
                        for i in range(n)]  # layer_decay_func of the layers after row i
        self.priority = lambda layer, e: self.pred_rows[self.row[layer]][e] if self.pred is not None else 0.0

    def predicted(self) -> torch.Tensor | None:
        if not self.store:
            return None
        eam = torch.tensor(self.counts, dtype=torch.float32)
        flat = eam.flatten() / (eam.norm() + 1e-12)
        return max(self.store, key=lambda m: float((m.flatten() * flat).sum()))

    def ranked_ahead(self, i: int) -> list[tuple[int, int]]:
        """(layer row, expert) of the layers after row i with predicted use, by predicted use x layer distance
        (descending; ties by layer, then expert)."""
        experts = self.ctx.work.experts_per_layer
        pred = self.pred.double()[i + 1 :]  # [L - i - 1, E]
        if pred.numel() == 0:
            return []
        score = (pred * self.weights[i][:, None]).flatten()
        candidates = torch.nonzero(pred.flatten() > 0).flatten()
        ranked = candidates[torch.sort(score[candidates], descending=True, stable=True).indices]
        return [(i + 1 + f // experts, f % experts) for f in ranked.tolist()]

    def before_step(self, step: int) -> None:
        self.ctx.cache.unprotect_all()
        self.step = step
        self.pred = self.predicted()
        self.pred_rows = self.pred.tolist() if self.pred is not None else None

    def on_route(self, layer: int, routes) -> None:
        i = self.row[layer]
        for r in routes:
            for e in r:
                self.counts[i][e] += 1

    def after_layer(self, layer: int, routes) -> None:
        """After this layer's own demand copies are queued (they are needed first)."""
        i = self.row[layer]
        if self.pred is None or not self.step:
            return
        cache, issued = self.ctx.cache, 0
        lowest: dict[int, float | None] = {}  # per layer ahead: its victim's priority, until a prefetch changes it
        for ahead, e in self.ranked_ahead(i):
            if self.per_step and issued >= self.per_step:
                break
            target = self.order[ahead]
            if (target, e) in cache:
                continue
            if target not in lowest:
                victim = cache.victim(target)
                lowest[target] = None if victim is None else self.priority(target, victim)
            if lowest[target] is not None and lowest[target] >= self.priority(target, e):
                continue  # only displace an expert predicted to be used less
            done = self.ctx.executor.prefetch(target, [e])
            if done:
                issued += done
                lowest.pop(target)


class _VisitCounts(PassHooks):
    """One visit per routed expert per layer and pass (`incache_visit_count`), from the warm-up prompts' counts on."""

    def __init__(self, counts: dict[tuple[int, int], int]) -> None:
        self.counts = counts

    def on_route(self, layer: int, routes) -> None:
        for e in {e for r in routes for e in r}:
            self.counts[layer, e] = self.counts.get((layer, e), 0) + 1


def _visits(traces, layers) -> dict[tuple[int, int], int]:
    counts: dict[tuple[int, int], int] = {}
    for trace in traces:
        for r in [{layer: {e for t in trace.prefill_routes for e in t[layer]} for layer in layers},
                  *({layer: set(t[layer]) for layer in layers} for t in trace.step_routes)]:
            for layer, experts in r.items():
                for e in experts:
                    counts[layer, e] = counts.get((layer, e), 0) + 1
    return counts


#: MoE-Infinity's kernels and host reads as its public code decodes a token of Mixtral at batch 1
#: (github.com/EfficientMoE/MoE-Infinity at commit d6178017933c3d39f82be99f702d8a3e4ce98f8f, with transformers 4.46.3,
#: the last its earlier pin allowed; eager attention):
#: - attention block 63 (62 to 65): the stock modules (45) and its own MoE block's routing (18: gate, softmax, top-k,
#:   renormalisation, cast, one-hot, the routing mask, its count, a copy of it to the host, the inputs cloned for its
#:   C++ runtime; `moe_infinity/models/mixtral.py` 18-118);
#: - one routed expert on one token 27 (23 to 31): the expert MLP in its C++ runtime (5, `core/` expert_module.cpp
#:   171-174), the tokens selected by mask there (5) and the weighting and accumulation in Python (17,
#:   `models/mixtral.py` 96-101);
#: - head 12 (the final norm 8, the LM head, a clone and cast, the argmax);
#: - host reads 8 a MoE layer: the routing mask copied to the host (`distributed/expert_executor.py` 36), three mask
#:   indexings per routed expert (`models/mixtral.py` 98-100: 6) and the wait for the C++ expert threads (`core/`
#:   expert_dispatcher.cpp 440). Its expert predictor and prefetcher are commented out for Mixtral (`models/mixtral.py`
#:   71-85): the `prefetch` option is the paper's mechanism, not the code's.
UPSTREAM = Upstream(attention=63, expert=27, head=12, host_reads=8, sources=(
    "EfficientMoE/MoE-Infinity d6178017933c3d39f82be99f702d8a3e4ce98f8f: moe_infinity/models/mixtral.py 18-118, "
    "distributed/expert_executor.py 32-58, core/parallel/expert_dispatcher.cpp",
    "transformers 4.46.3 (modeling_mixtral: attention, norms)"))


class MoEInfinity(System):
    name = "moe-infinity"
    order, colour = 60, "#8c8c8c"
    upstream = UPSTREAM
    learns_from_history = True
    options = {
        "prefetch": (bool, False, "the paper's activation-aware prefetch from matched EAMs (off in the released code)"),
        "eviction": (str, "visits", "what the cache evicts: visits (the fewest in-cache visits, the code's) or "
                                    "activation (the lowest predicted activation, the paper's; needs prefetch=true)",
                     ("visits", "activation")),
        "warmup": (int, 8, "warm-up prompts whose EAMs fill the store and whose visits start the counts (0: none)",
                   (0, 1000)),
        "per-step": (int, 0, "prefetches issued per layer step at most (0: every expert of positive score, the "
                             "code's)", (0, 100_000)),
    }

    def make_cache(self, work, slots, future=()) -> ExpertCache:
        return PriorityCache(work.moe_layers, slots)

    def run(self, ctx: PromptContext) -> PromptResult:
        from specter.errors import SpecterError

        if self.eviction == "activation" and not self.prefetch:
            raise SpecterError("moe-infinity --system-option eviction=activation evicts by the prefetch's prediction: "
                               "give prefetch=true too, or eviction=visits")
        warm = ctx.warmup()[: self.warmup] if self.warmup and ctx.warmup else []
        visits = _visits(warm, ctx.work.moe_layers)
        ctx.executor.hooks.append(_VisitCounts(visits))
        ctx.cache.priority = lambda layer, e: visits.get((layer, e), 0)
        if self.prefetch:
            experts = ctx.work.experts_per_layer
            store = [m / m.norm() for m in (eam_of(t, experts) for t in warm)]
            hook = _ActivationAware(ctx, store, self.per_step)
            ctx.executor.hooks.append(hook)
            if self.eviction == "activation":
                ctx.cache.priority = hook.priority
        return decode_one_by_one(ctx, self.prefill(ctx))
