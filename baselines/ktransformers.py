"""`ktransformers`: every routed expert kept and computed on the host's threads, attention, routers and shared experts
on the device, the decode step replayed as one CUDA graph, as KTransformers runs a MoE model.

Source: Chen et al., "KTransformers: Unleashing the Full Potential of CPU/GPU Hybrid Inference for MoE Models" (SOSP
'25, doi 10.1145/3731569.3764843), github.com/kvcache-ai/ktransformers at 8729435d85e75bb63e4a794b5a233e2a29229893
(the last commit before `ktransformers/` moved under `archive/`). Placement: the optimize rules
(`ktransformers/optimize/optimize_rules/DeepSeek-V3-Chat.yaml` 20-76) put attention, the router, every linear
including the shared experts, and the LM head on the device, the routed experts (`KExpertsCPU`) and the token
embedding on the host. One MoE layer of a decode step (`ktransformers/operators/experts.py` `KDeepseekV3MoE.forward`
974-1012, `KExpertsCPU` 143-362):
- the router runs on the device; `submit_for_one_decode` copies the hidden state (the model's 16-bit dtype), the k
  expert ids (int64) and weights (float32) into pinned host buffers and queues the layer's routed experts on the host's
  worker threads from the device's stream (`cpuinfer.h` 69-78: `cudaLaunchHostFunc`);
- the device computes the shared experts meanwhile; `sync_for_one_decode` makes the stream wait for the host's
  experts (`cpuinfer.h` 85-91, a host function that waits for the task queue) and copies their sum (16-bit) back;
- the whole decode step is one CUDA graph (`ktransformers/util/cuda_graph_runner.py` 17-79, captured by
  `prefill_and_generate`, `use_cuda_graph=True` by default): the host launches it once a token and waits once, for
  the logits; the token's embedding is looked up on the host and copied in (`cuda_graph_runner.py` 70-73).
The host's experts read only the k routed experts' weights (`operators/llamafile/moe.cpp` `forward_one` 146-205).

Departures (the code's behaviour is the default):
- `--system-option cuda-graph=false` runs the step eagerly as the code does without a graph (`experts.py` 990-992,
  354-362): the shared experts first, then the host copies the inputs out and waits for its experts, layer by layer;
- the prompt's prefill takes the decode's path (the rules give prefill its own operator, `KExpertsTorch` on the
  device); TPOT leaves the prefill out, TTFT does not;
- "expert deferral" (kt-kernel's `max_deferred_experts_per_token`, default 0 there) is not run: it adds some experts'
  outputs to the next layer's and so changes the model's tokens, and every system here is lossless;
- the experts are the model's own at the run's `--expert-bits` (the llamafile kernels' GGUF formats are not run: the
  numerics stay the proxy's); the device's kernels are priced at the stock modules' counts (KTransformers' Marlin and
  MLA kernels were not counted), and the host's experts as one task a layer on all of the host's threads.
"""

from __future__ import annotations

from dataclasses import replace

from specter.offload.executor import Executor, tokens_of
from specter.offload.work import ModelWork, Upstream, in_turn
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D, HOST, Op

HIDDEN, IDS, WEIGHTS = 2, 8, 4  # bytes of the hidden state (16-bit), an expert id (int64) and a weight (float32)


class HostExpertsExecutor(Executor):
    """Every MoE layer's routed experts as one task on the host's workers, the shared experts on the device meanwhile
    (`graph`), or after them with the host waiting (eager)."""

    graph = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_reads_routes = False  # the routing crosses with the inputs; the host thread reads none of it
        self.host_policy = False

    def _attention(self, layer: int, tokens: int, context: int, label: str) -> Op:
        """The attention block without the shared experts, which run beside the host's experts."""
        return self._with(self.work.attention_op(layer, tokens, context, label, shared=False),
                          "attention", layer, tokens, context)

    def target_pass(self, routes, context: int, tag: str, inputs=None):
        n = len(inputs) if routes is None else len(routes)  # the embedding, looked up on the host, copied in
        self.engine.launch(H2D, self._with(Op(f"{tag}.embedding-in", bytes_copied=n * self.embedding_bytes()),
                                           "activations_to_device", n))
        self.engine.wait(COMPUTE, self.engine.record(H2D))
        self.stats.link_bytes_activations += n * self.embedding_bytes()
        return super().target_pass(routes, context, tag, inputs)

    def embedding_bytes(self) -> int:
        """Bytes of a token's embedding, looked up on the host and copied in."""
        return self.work.hidden * HIDDEN

    def crossing(self) -> tuple[int, int]:
        """Bytes a token's activations cross at a MoE layer: to the host (its hidden state, expert ids and weights),
        back (its experts' weighted sum)."""
        w = self.work
        return w.hidden * HIDDEN + w.top_k * (IDS + WEIGHTS), w.hidden * HIDDEN

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = tokens_of(routes)
        experts = sorted(tokens_per_expert)
        n, w = max(1, len(routes)), self.work
        self.stats.demand.miss(layer, len(experts))
        self.stats.demand.token_misses += sum(tokens_per_expert.values())
        out, back = (n * b for b in self.crossing())
        self.stats.link_bytes_activations += out + back
        shared = self._with(w.shared_op(layer, n, f"{tag}.L{layer}.shared"), "shared_experts", layer, n) \
            if w.shared_params.get(layer) else None
        if shared is not None and not self.graph:  # eager: the shared experts first
            self._compute(shared)
        self.engine.wait(H2D, self.engine.record(COMPUTE))
        self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.inputs-to-host", bytes_copied=out),
                                           "activations_to_host", n))
        copied = self.engine.record(H2D)
        if self.graph:  # the stream hands the task to the host's workers and goes on with the shared experts
            self.engine.wait(HOST, copied)
            self.engine.wait(COMPUTE, copied)  # in the stream's order: the copies, then the shared experts
        else:  # eager: the host copies the inputs out and waits for them
            self.engine.synchronize(copied)
        task = Op(f"{tag}.L{layer}.cpu-experts", flops=2.0 * sum(tokens_per_expert.values()) * w.expert_params,
                  bytes_read=len(experts) * w.expert_bytes)
        if self.device is not None:
            task.fn = in_turn([self.device.host_expert(layer, e, tokens_per_expert[e]) for e in experts])
        self.engine.launch(HOST, task)
        done = self.engine.record(HOST)
        if self.graph:
            if shared is not None:
                self._compute(shared)
            self.engine.wait(H2D, self.engine.record(COMPUTE))  # after the shared experts, in the stream's order
            self.engine.wait(H2D, done)  # the stream's host function waits for the task, then the sum comes back
        else:
            self.engine.join(done)
        self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.outputs-to-device", bytes_copied=back),
                                           "activations_to_device", n))
        self.engine.wait(COMPUTE, self.engine.record(H2D))


#: KTransformers' runtime as its code makes it at batch 1: one CUDA graph a decode step, no host read inside it (the
#: step's one wait is for the logits); eager (`cuda-graph=false`), a native dispatch per kernel under Python and a
#: wait at each MoE layer, the executor's own.
UPSTREAM = Upstream(
    host_reads=0, dispatch="graph",
    sources=("kvcache-ai/ktransformers 8729435d85e75bb63e4a794b5a233e2a29229893: ktransformers/operators/experts.py "
             "143-362 974-1012, csrc/ktransformers_ext/cpu_backend/cpuinfer.h 69-91, "
             "ktransformers/util/cuda_graph_runner.py 17-79, "
             "ktransformers/optimize/optimize_rules/DeepSeek-V3-Chat.yaml 20-76",),
    assumption="the device's attention, shared experts and head are priced at the stock modules' kernel counts; "
               "KTransformers runs Marlin linears and its own MLA kernels there")


class KTransformers(System):
    name = "ktransformers"
    order, colour = 74, "#4c4c4c"
    upstream = UPSTREAM
    host_compute = True
    host_layers_rule = "every"
    options = {"cuda-graph": (bool, True, "the decode step as one CUDA graph (the code's default); false: eager, "
                                          "the host waiting for the host experts at each MoE layer")}

    def __init__(self, **options) -> None:
        super().__init__(**options)
        if not self.cuda_graph:
            self.upstream = replace(UPSTREAM, dispatch="eager")

    def layer_slots(self, work: ModelWork, slots: int) -> dict[int, int]:
        return dict.fromkeys(work.moe_layers, 0)  # no routed expert on the device

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        executor = HostExpertsExecutor(engine, work, cache, stats, device, cost)
        executor.graph = self.cuda_graph
        return executor

    def run(self, ctx: PromptContext) -> PromptResult:
        ctx.executor.place(dict.fromkeys(ctx.work.moe_layers, []))
        ctx.extra["host_layers"], ctx.extra["moe_layers"] = list(ctx.work.moe_layers), list(ctx.work.moe_layers)
        ctx.extra["activation_bytes"] = {"token": ctx.executor.embedding_bytes(),
                                         "token_host_layer": sum(ctx.executor.crossing())}
        return decode_one_by_one(ctx, self.prefill(ctx))
