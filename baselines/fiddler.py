"""`fiddler`: compute a missing expert on the host instead of copying its weights; the hottest experts stay resident.

Source: Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-Experts Models"
(arXiv 2402.07033), github.com/efeslab/fiddler. Mechanism: experts are placed once, from calibration: the most
frequently routed experts of each layer (as many as the budget's slots) stay on the device and nothing is evicted. For a
missing expert, the cost model picks, per expert and by its token count, the cheaper of copying its weights to the
device (then computing there) or sending the activations to the host, computing the expert on the CPU and sending the
result back (hidden x tokens x 2 bytes each way instead of 3 x hidden x intermediate x 2). Calibration uses warm-up
prompts of the calibration split, never the evaluation prompts.
Simplifications: the device-to-host activation copy is costed as a host-to-device copy of the same size (the link's
two directions are symmetric in every preset); the host expert runs at the profile's host FLOP/s and memory bandwidth.
"""

from __future__ import annotations

from collections import Counter

from specter.offload.executor import Executor
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D, HOST, Op

ACT_BYTES = 2  # FP16 activations


class FiddlerExecutor(Executor):
    """Misses go to whichever is cheaper by the cost model: weights to the device, or activations to the host."""

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = Counter(e for r in routes for e in r)
        resident = [e for e in self.cache.resident(layer) if e in tokens_per_expert]
        for e in resident:
            self._expert(layer, e, tokens_per_expert[e], f"{tag}.L{layer}.e{e}")
        self.stats.demand.hit(layer, len(resident))
        for e in sorted(set(tokens_per_expert) - set(resident)):
            n = tokens_per_expert[e]
            self.stats.demand.miss(layer)
            device_op = self.work.expert_op(n, f"{tag}.L{layer}.e{e}")
            act = n * self.work.hidden * ACT_BYTES
            gpu_s = self.cost.copy_seconds(self.work.expert_bytes) + self.cost.seconds(device_op)
            cpu_s = 2 * self.cost.copy_seconds(act) + self.cost.host_seconds(device_op.flops, self.work.expert_bytes)
            if cpu_s < gpu_s:  # activations to the host, the expert on the CPU, the result back
                self.engine.wait(H2D, self.engine.record(COMPUTE))  # the activations exist once the router ran
                self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.act-out.e{e}", bytes_copied=act),
                                                   "activations_to_host", n))
                self.engine.wait(HOST, self.engine.record(H2D))
                self.engine.launch(HOST, self._with(Op(f"{tag}.L{layer}.cpu.e{e}", flops=device_op.flops,
                                                       bytes_read=self.work.expert_bytes),
                                                    "host_expert", layer, e, n))
                self.engine.wait(H2D, self.engine.record(HOST))
                self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.act-in.e{e}", bytes_copied=act),
                                                   "activations_to_device", n))
                self.stats.link_bytes_activations += 2 * act
                self.engine.wait(COMPUTE, self.engine.record(H2D))
            else:  # weights through a staging buffer (placement is static: nothing enters the cache)
                ready, buffer = self._copy_to_staging(layer, e, f"{tag}.L{layer}.demand.e{e}")
                self.stats.h2d_bytes_demand += self.work.expert_bytes
                self.engine.wait(COMPUTE, ready)
                self._expert(layer, e, n, f"{tag}.L{layer}.e{e}", staging=buffer)


class Fiddler(System):
    name = "fiddler"
    host_compute = True

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        return FiddlerExecutor(engine, work, cache, stats, device, cost)

    def run(self, ctx: PromptContext) -> PromptResult:
        counts = {layer: Counter() for layer in ctx.work.moe_layers}
        for trace in ctx.warmup() if ctx.warmup else []:
            for r in trace.prefill_routes + trace.step_routes:
                for layer in counts:
                    counts[layer].update(r[layer])
        # the hottest experts, placed once before the run (no copies counted)
        ctx.executor.place({layer: [e for e, _ in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]
                            for layer, c in counts.items()})
        return decode_one_by_one(ctx, self.prefill(ctx))
