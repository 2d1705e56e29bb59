"""The runtime's own host work per MoE layer, measured: the shared executor on a synthetic route trace.

At each MoE layer of a target pass the runtime reads the routing, chooses what to copy, updates its cache and launches
its ops: Python on the host, between the kernels. The simulator prices it as a span of host time per MoE layer
(`host.policy_us`, `SimEngine.policy`); `policy_seconds` measures it on this host by running the executor itself,
as the live engine runs it, over seeded random routes with half of each layer's experts in slots, on an engine that
only keeps the timeline (ops without a function: no kernel runs, so what is timed is the runtime's own work).
"""

from __future__ import annotations

import random
import statistics
import time

from specter.offload.cache import ExpertCache
from specter.offload.executor import Executor
from specter.offload.hooks import TransferStats
from specter.offload.work import ModelWork

LAYERS, EXPERTS, TOP_K, TOKENS = 24, 8, 2, 32  # the synthetic trace: Mixtral's routing (8 experts, top 2)


def synthetic_work(layers: int = LAYERS, experts: int = EXPERTS, top_k: int = TOP_K) -> ModelWork:
    """Work of a model with `layers` MoE layers of `experts` experts (its costs are never read here)."""
    return ModelWork(layers=tuple(range(layers)), moe_layers=tuple(range(layers)), experts_per_layer=experts,
                     layer_params=dict.fromkeys(range(layers), 1), head_params=1, expert_params=1, expert_bytes=1,
                     attn_width=1, heads=1, kv_heads=1, qk_dim=1, v_dim=1, kv_bytes_per_token=1, hidden=1, vocab=1,
                     top_k=top_k, expert_shapes=((1, 1), (1, 1), (1, 1)))


def policy_seconds(repeats: int = 10, warmup: int = 2, seed: int = 0) -> float:
    """Median host seconds the executor spends per target MoE layer of a one-token pass (reading the routing,
    choosing copies, updating its LRU cache of half the experts, launching the layer's ops), over `TOKENS` tokens of
    seeded random routes."""
    from specter.timing.wall import WallEngine

    work = synthetic_work()
    rng = random.Random(seed)
    routes = [{layer: tuple(rng.sample(range(EXPERTS), TOP_K)) for layer in work.moe_layers} for _ in range(TOKENS)]

    def one_run() -> float:
        engine = WallEngine()
        executor = Executor(engine, work, ExpertCache(work.moe_layers, EXPERTS // 2), TransferStats())
        executor.place({layer: list(range(EXPERTS // 2)) for layer in work.moe_layers})
        t0 = time.perf_counter()
        for position, route in enumerate(routes):
            for layer in work.layers:
                executor.layer(layer, [route[layer]], position + 1, f"t{position}")
        return (time.perf_counter() - t0) / (TOKENS * LAYERS)

    for _ in range(warmup):
        one_run()
    return statistics.median(one_run() for _ in range(repeats))
