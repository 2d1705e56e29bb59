"""`naive`: offloading as HF accelerate does it, the "naive accelerate" row of Eliseev and Mazur (2023), Table 2.

Source: Eliseev and Mazur, "Fast Inference of Mixture-of-Experts Language Models with Offloading" (arXiv 2312.17238),
github.com/dvmazur/mixtral-offloading; HF accelerate's `cpu_offload` hooks. Mechanism: every MoE layer's experts live
on the host; when the layer runs, all of its experts are copied to the device (accelerate moves the whole module), on
the compute stream's order (no overlap with the previous layer's compute), and nothing is kept across tokens.
Simplifications: experts stay FP16 (lossless comparison); attention and other non-expert weights stay resident, as in
every system here, so only experts cross the link.
"""

from __future__ import annotations

from collections import Counter

from specter.offload.executor import Executor
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D


class NaiveExecutor(Executor):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_reads_routes = False  # it copies every expert, so it needs no routing on the host
        self.use_staging(self.work.experts_per_layer)  # the whole layer's experts at once, as accelerate moves it

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        self.engine.wait(H2D, self.engine.record(COMPUTE))  # accelerate's copies are in the compute stream's order
        buffer = {e: self._copy_to_staging(layer, e, f"{tag}.L{layer}.load.e{e}")[1]
                  for e in range(self.work.experts_per_layer)}
        self.stats.h2d_bytes_demand += self.work.experts_per_layer * self.work.expert_bytes
        self.engine.wait(COMPUTE, self.engine.record(H2D))
        tokens_per_expert = Counter(e for r in routes for e in r)
        self.stats.demand.miss(layer, len(tokens_per_expert))
        for e, n in sorted(tokens_per_expert.items()):
            self._expert(layer, e, n, f"{tag}.L{layer}.e{e}", staging=buffer[e])


class Naive(System):
    name = "naive"

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        return NaiveExecutor(engine, work, cache, stats, device, cost)

    def run(self, ctx: PromptContext) -> PromptResult:
        return decode_one_by_one(ctx, self.prefill(ctx))
