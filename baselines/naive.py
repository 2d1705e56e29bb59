"""`naive`: HF accelerate's offloading of an MoE model whose experts are one fused module per layer.

Source: huggingface/accelerate, `accelerate/hooks.py` (`AlignDevicesHook.pre_forward` / `post_forward`) on the MoE
blocks of transformers 5.x, which store a layer's routed experts as fused 3D parameters (`gate_up_proj`,
`down_proj` of the experts module, e.g. `MixtralExperts`): the hook on the experts module moves all of its weights
when it runs. Mechanism: every MoE layer's experts live on the host; when the layer runs, all of its experts are
copied to the device, on the compute stream's order (no overlap with the previous layer's compute), and nothing is
kept across tokens. `hf-offload` is the per-expert case (transformers 4.x modules: only the routed experts move),
the paper's "HF" and the accelerate rows of Eliseev and Mazur (arXiv 2312.17238, Table 2).
Departures: experts stay FP16 (lossless comparison); attention and other non-expert weights stay resident, as in
every system here, so only experts cross the link (no option: the suite's budgets give every layer the same slots).
"""

from __future__ import annotations

from collections import Counter

from specter.offload.executor import Executor
from specter.offload.work import Upstream
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


#: The naive baseline's upstream is accelerate's hooks (huggingface/accelerate, `src/accelerate/hooks.py`) on the
#: stock transformers modules of the installed version, whose experts are one fused parameter a layer: the counted
#: figures.
UPSTREAM = Upstream(sources=("huggingface/accelerate v0.26.1: src/accelerate/hooks.py (AlignDevicesHook) on the "
                             "installed transformers' stock modules",))


class Naive(System):
    name = "naive"
    order, colour = 30, "#64b5cd"
    copies_whole_layers = True
    upstream = UPSTREAM

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        return NaiveExecutor(engine, work, cache, stats, device, cost)

    def run(self, ctx: PromptContext) -> PromptResult:
        return decode_one_by_one(ctx, self.prefill(ctx))
