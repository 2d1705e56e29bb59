"""`llama-cpp-cpu-moe`: the routed experts of the first N layers kept and computed in host memory, every other layer's
resident on the device, as llama.cpp runs a model with `--n-cpu-moe N` (`--cpu-moe`: every layer).

Source: ggml-org/llama.cpp at 82bb48500a9a6b3374da2cf5811695369278e4d3 (read in the unslothai/llama.cpp fork, which
carries its history). Placement: `common/arg.cpp` 2667-2681 pushes, for each block i < N, a buffer override that keeps
the tensors matching `blk.i.ffn_(up|down|gate|gate_up)_(ch|)exps` (`common/common.h` 1089-1093) in host memory; the
router (`ffn_gate_inp`), shared experts (`ffn_*_shexp`), attention, norms and KV follow `-ngl` (here all on the
device). N counts blocks as the tensors' names do, so a dense first block counts. Per decode token (batch 1):
- a device layer's routed experts run as `MUL_MAT_ID` over the token's k experts, one kernel per projection (gate, up,
  down), then the GLU, the weighting by the router's weights and the sum over the k experts (`src/llama-graph.cpp`
  `build_moe_ffn` 2030-2250): 3 + 1 + 1 + (k - 1) kernels a layer, reading only the routed experts;
- a host layer is a split of its own (`ggml/src/ggml-backend.cpp`: ops run where their weights are, 939-969; a split
  at each change of backend, 1290-1419). `ggml_backend_sched_compute_splits` (1594-1778) synchronizes the device and
  copies the split's inputs to the host with a blocking copy: the normed hidden state (F32) and the k expert ids
  (I32). The host's threads compute gate, up, the GLU and down for the routed experts only (`ggml/src/ggml-cpu/
  ggml-cpu.c` mul_mat_id 1534-1700: experts no token routed to are skipped); the k down projections (F32) cross back
  with a blocking copy (`ggml-cuda.cu` 782-788), and the device weights and sums them. The CPU backend's buffers are
  the device's pinned host buffers (`src/llama-context.cpp` 402-412). Nothing overlaps within a token: pipeline
  parallelism is off when tensors are overridden (`src/llama-context.cpp` 424-429). At batch 1 no expert weight is
  copied to the device (`op_offload` starts at 32 tokens, `ggml-cuda.cu` 5189-5208).
- each GPU split runs as a CUDA graph of its own (PR 18934, merged as 81ab64f, 2026-01-24), so the host launches a
  graph per split and no kernel one by one.

Departures (the code's behaviour is the default):
- `--system-option n-cpu-moe=N` sets N; by default it is the fewest leading blocks whose experts leave every other
  MoE layer's experts within the run's device budget, as a user sizes it (a placement past the budget is refused);
- the prompt's prefill takes the decode's path (from 32 tokens llama.cpp copies the used host experts to the device
  instead, `op_offload`); TPOT leaves the prefill out, TTFT does not;
- `--system-option cuda-graphs=false` prices each kernel as a native launch (llama.cpp before PR 18934 turned its
  graphs off when a model was split, PR 18593);
- the experts are the model's own at the run's `--expert-bits` (GGUF's quantized kernels are not run: the numerics
  stay the proxy's) and llama.cpp's attention and head kernels are priced at the stock modules' counts (its ggml
  graph was not counted kernel by kernel).
"""

from __future__ import annotations

from dataclasses import replace

from specter.errors import BudgetError
from specter.offload.executor import Executor, tokens_of
from specter.offload.work import ModelWork, Upstream, in_turn
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D, HOST, Op

F32, I32 = 4, 4  # bytes of ggml's activations and expert ids
HOST_OPS = 4  # a host layer's ops on the CPU backend: MUL_MAT_ID gate and up, the GLU, MUL_MAT_ID down


def host_blocks(work: ModelWork, slots: int, n_cpu_moe: int) -> frozenset[int]:
    """The MoE layers whose experts stay on the host: those of the first `n_cpu_moe` blocks, or (-1) of the fewest
    leading blocks that leave every other MoE layer's experts within `slots` x MoE layers; a placement past the
    budget is a BudgetError."""
    budget = slots * len(work.moe_layers)
    if n_cpu_moe < 0:
        n_cpu_moe = next(n for n in range(len(work.layers) + 1)
                         if sum(layer >= n for layer in work.moe_layers) * work.experts_per_layer <= budget)
    host = frozenset(layer for layer in work.moe_layers if layer < n_cpu_moe)
    resident = (len(work.moe_layers) - len(host)) * work.experts_per_layer
    if resident > budget:
        raise BudgetError(f"n-cpu-moe={n_cpu_moe} leaves {len(work.moe_layers) - len(host)} MoE layers' experts "
                          f"({resident} experts) on the device, past its {budget} expert slots; give a larger "
                          "n-cpu-moe or leave it out (the fewest blocks that fit)")
    return host


class CpuMoeExecutor(Executor):
    """A device layer's routed experts from their slots as one MUL_MAT_ID group; a host layer's on the host, with its
    inputs and outputs copied across and the host waiting at each change of backend."""

    host_layers: frozenset[int] = frozenset()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_reads_routes = False  # the routing stays with the device's MUL_MAT_ID or crosses as a split input
        self.host_policy = False  # a static placement: nothing to choose per layer

    def crossing(self) -> tuple[int, int]:
        """Bytes a token's activations cross at a host layer: to the host (its hidden state and expert ids), back (its
        experts' k outputs)."""
        w = self.work
        return w.hidden * F32 + w.top_k * I32, w.top_k * w.hidden * F32

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = tokens_of(routes)
        experts = sorted(tokens_per_expert)
        n, k, w = max(1, len(routes)), self.work.top_k, self.work
        flops = 2.0 * sum(tokens_per_expert.values()) * w.expert_params
        if layer not in self.host_layers:
            self.stats.demand.hit(layer, len(experts))
            self.stats.demand.token_hits += sum(tokens_per_expert.values())
            op = Op(f"{tag}.L{layer}.mul-mat-id", flops=flops, bytes_read=len(experts) * w.expert_bytes,
                    launches=3 + 1 + 1 + max(k - 1, 0))
            if self.device is not None:
                fns = [self.device.expert_in_slot(layer, e, self.cache.slot(layer, e).index, tokens_per_expert[e])
                       for e in experts]
                op.fn = in_turn(fns)
            self._compute(op)
            done = self.engine.record(COMPUTE)
            for e in experts:
                self.cache.slot(layer, e).last_use = done
            return
        self.stats.demand.miss(layer, len(experts))
        self.stats.demand.token_misses += sum(tokens_per_expert.values())
        to_host, to_device = (n * b for b in self.crossing())
        self.stats.link_bytes_activations += to_host + to_device
        # the split's inputs: the host waits for the device, then copies them (a blocking copy)
        self.engine.wait(H2D, self.engine.record(COMPUTE))
        self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.inputs-to-host", bytes_copied=to_host),
                                           "activations_to_host", n))
        self.engine.synchronize(self.engine.record(H2D))
        host = Op(f"{tag}.L{layer}.cpu-experts", flops=flops, bytes_read=len(experts) * w.expert_bytes,
                  launches=HOST_OPS)
        if self.device is not None:
            fns = [self.device.host_expert(layer, e, tokens_per_expert[e]) for e in experts]
            host.fn = in_turn(fns)
        self.engine.launch(HOST, host)
        self.engine.join(self.engine.record(HOST))  # the host's own threads computed it
        # the outputs back: the host waits for its copy to land before the next split runs
        self.engine.wait(H2D, self.engine.record(HOST))
        self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.outputs-to-device", bytes_copied=to_device),
                                           "activations_to_device", n))
        landed = self.engine.record(H2D)
        self.engine.synchronize(landed)
        self.engine.wait(COMPUTE, landed)


#: llama.cpp's host reads and runtime as its code makes them at batch 1: a compiled runtime replaying a CUDA graph per
#: GPU split; the host's waits are the executor's own (one blocking copy each way at each host layer, none at a device
#: layer). The attention block and the head are the stock modules' counts (llama.cpp's ggml graph was not counted).
UPSTREAM = Upstream(
    host_reads=0, dispatch="graph",
    sources=("ggml-org/llama.cpp 82bb48500a9a6b3374da2cf5811695369278e4d3: common/arg.cpp 2667-2681, "
             "ggml/src/ggml-backend.cpp 939-969 1290-1419 1594-1778, src/llama-graph.cpp 2030-2250, "
             "src/llama-context.cpp 402-412 424-429; PR 18934 (81ab64f, a CUDA graph per split)",),
    assumption="the attention block and the head are priced at the stock modules' kernel counts; llama.cpp's ggml "
               "graph fuses some of them")


class LlamaCppCpuMoe(System):
    name = "llama-cpp-cpu-moe"
    order, colour = 75, "#8c613c"
    upstream = UPSTREAM
    host_compute = True
    stall_free = True  # the host synchronizes on each split's copy before the device waits for it
    host_layers_rule = "leading"
    options = {
        "n-cpu-moe": (int, -1, "the first N blocks keep their routed experts on the host (-1: the fewest that leave "
                               "the other layers' experts within the device budget)", (-1, 100_000)),
        "cuda-graphs": (bool, True, "a CUDA graph per GPU split (llama.cpp PR 18934); false: each kernel a "
                                    "native launch"),
    }

    def __init__(self, **options) -> None:
        super().__init__(**options)
        if not self.cuda_graphs:
            self.upstream = replace(UPSTREAM, dispatch="native")

    def layer_slots(self, work: ModelWork, slots: int) -> dict[int, int]:
        host = host_blocks(work, slots, self.n_cpu_moe)
        return {layer: 0 if layer in host else work.experts_per_layer for layer in work.moe_layers}

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        executor = CpuMoeExecutor(engine, work, cache, stats, device, cost)
        executor.host_layers = frozenset(layer for layer, n in cache.capacity.items() if n == 0)
        return executor

    def run(self, ctx: PromptContext) -> PromptResult:
        ctx.executor.place({layer: list(range(ctx.work.experts_per_layer)) if n else []
                            for layer, n in ctx.cache.capacity.items()})
        ctx.extra["host_layers"] = sorted(ctx.executor.host_layers)
        ctx.extra["moe_layers"] = list(ctx.work.moe_layers)
        ctx.extra["activation_bytes"] = {"token": 0, "token_host_layer": sum(ctx.executor.crossing())}
        return decode_one_by_one(ctx, self.prefill(ctx))
