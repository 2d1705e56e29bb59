"""`moe-infinity`: activation-aware prefetching and caching from a store of past expert activation matrices.

Source: Xue et al., "MoE-Infinity: Offloading-Efficient MoE Model Serving" (arXiv 2401.14361),
github.com/EfficientMoE/MoE-Infinity. Mechanism: each request keeps an Expert Activation Matrix (EAM, layers x experts
token counts). A bounded store holds the EAMs of past requests; during decoding the request's EAM so far is matched to
the store by cosine similarity, and the best match predicts which experts the coming layers will use. After each layer's
routing, experts of the layers ahead are prefetched in order of predicted activation weighted by 1 - (i - l) / L for a
layer i ahead of the current layer l (nearer layers first). Eviction drops the cached expert of lowest predicted
activation instead of the least recently used. The store is filled from warm-up prompts of the calibration split, never
from the evaluation prompts (`--system-option warmup=N`, default 8; 0 leaves it empty).
Simplifications: the suite's budgets are per-layer slots (equal capacity for every system), so eviction chooses within
a layer and the paper's preference for keeping earlier layers' experts, which arbitrates between layers of a global
cache, does not arise; prefetches per step are capped at `per_step` (default 2 x top-k) so they do not flood the link.
"""

from __future__ import annotations

import torch

from specter.offload.cache import ExpertCache
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
    """Evicts the expert of lowest priority (predicted activation) rather than the least recently used."""

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
        self.weights = [torch.tensor([1 - (ahead - i) / n for ahead in range(i + 1, n)], dtype=torch.float64)
                        for i in range(n)]  # layer distance weights of the layers after row i
        ctx.cache.priority = lambda layer, e: self.pred_rows[self.row[layer]][e] if self.pred is not None else 0.0

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
            if issued >= self.per_step:
                break
            target = self.order[ahead]
            if (target, e) in cache:
                continue
            if target not in lowest:
                victim = cache.victim(target)
                lowest[target] = None if victim is None else cache.priority(target, victim)
            if lowest[target] is not None and lowest[target] >= cache.priority(target, e):
                continue  # only displace an expert predicted to be used less
            done = self.ctx.executor.prefetch(target, [e])
            if done:
                issued += done
                lowest.pop(target)


class MoEInfinity(System):
    name = "moe-infinity"
    options = {
        "warmup": (int, 8, "warm-up prompts whose EAMs fill the store (0: empty store)", (0, 1000)),
        "per-step": (int, 0, "prefetches issued per layer step at most (0: 2 x top-k)", (0, 100_000)),
    }

    def make_cache(self, work, slots) -> ExpertCache:
        return PriorityCache(work.moe_layers, slots)

    def run(self, ctx: PromptContext) -> PromptResult:
        experts = ctx.work.experts_per_layer
        store = [eam_of(t, experts) for t in (ctx.warmup()[: self.warmup] if self.warmup and ctx.warmup else [])]
        store = [m / m.norm() for m in store]
        top_k = len(ctx.trace.prefill_routes[0][ctx.work.moe_layers[0]])
        ctx.executor.hooks.append(_ActivationAware(ctx, store, self.per_step or 2 * top_k))
        return decode_one_by_one(ctx, self.prefill(ctx))
