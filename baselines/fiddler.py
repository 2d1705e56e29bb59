"""`fiddler`: compute a missing expert on the host instead of copying its weights; the hottest experts stay resident.

Source: Kamahori et al., "Fiddler: CPU-GPU Orchestration for Fast Inference of Mixture-of-Experts Models"
(arXiv 2402.07033), github.com/efeslab/fiddler, `src/fiddler/mixtral.py`: `FiddlerMixtral.__init__` (placement) and
`mixtral_forward` (the `cpu_offload` path, which serves prefill and decode alike). Placement: experts are placed once,
by popularity from a profile (`set_expert_loc`), as many as fit the device (`calc_n_expert_on_gpu`), and nothing is
evicted; here the most frequently routed experts of each layer in the warm-up prompts of the calibration split (never
the evaluation prompts), as many as the budget's slots. Per MoE layer the host reads the routing; each expert gets a
cost on the host of `latency_cpu` = 7 per token and on the device of `latency_gpu` = 70, or 0 if it is resident (the
code's constants; its comment: "TODO: find this value based on device config"), and the cheaper side runs it (the
search over every CPU/GPU split of the experts minimises the summed cost, which splits expert by expert; a tie stays
on the device). The device experts run first, in id order: a resident one from its slot, a missing one after its
weights are loaded into one placeholder module (`load_state_dict` from the host's pageable copy: a synchronous copy in
the compute stream's order). Then each host expert, in id order: its tokens' activations copied to the host (pageable,
after the device work before it), the expert computed on the CPU, the result copied back (hidden x tokens x 2 bytes
each way instead of 3 x hidden x intermediate x 2).

Departures (the code's behaviour is the default):
- placement is per layer (the suite's budgets give every layer the same slots; the code places by a global
  popularity order until the device is full);
- `--system-option decide=cost-model` chooses each missing expert's side by the hardware profile's cost model instead
  of the code's constants (copy and compute on the device, against both activation copies and the host's compute);
- the device-to-host activation copy is priced on the link as every copy is (the presets give one bandwidth for both
  directions); the host expert runs at the profile's host FLOP/s and memory bandwidth.
"""

from __future__ import annotations

from collections import Counter

from specter.offload.executor import Executor
from specter.offload.work import Upstream
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import COMPUTE, H2D, HOST, Op

ACT_BYTES = 2  # FP16 activations
LATENCY_CPU, LATENCY_GPU = 7, 70  # mixtral.py's cost of an expert on the host per token, and on the device


class FiddlerExecutor(Executor):
    """The device experts first (resident ones, then loaded ones through one placeholder), then the host experts."""

    decide = "constants"

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = Counter(e for r in routes for e in r)
        resident = {e for e in self.cache.resident(layer) if e in tokens_per_expert}
        self.stats.demand.hit(layer, len(resident))
        on_host = sorted(e for e in set(tokens_per_expert) - resident if self._on_host(tokens_per_expert[e]))
        self.stats.demand.miss(layer, len(tokens_per_expert) - len(resident))
        for e in sorted(set(tokens_per_expert) - set(on_host)):  # the device's experts, in id order
            n = tokens_per_expert[e]
            if e in resident:
                self._expert(layer, e, n, f"{tag}.L{layer}.e{e}")
                continue
            # load_state_dict into the placeholder: a synchronous pageable copy (placement is static: no cache entry)
            self.stats.h2d_bytes_demand += self.work.expert_bytes
            if self.staging_last_use[0] is not None:
                self.engine.wait(H2D, self.staging_last_use[0])
            self.copy_in_compute_order(self._with(self.work.copy_op(f"{tag}.L{layer}.demand.e{e}", pinned=False),
                                                  "copy_to_staging", layer, e, 0))
            self._expert(layer, e, n, f"{tag}.L{layer}.e{e}", staging=0)
        for e in on_host:  # activations to the host, the expert on the CPU, the result back
            n = tokens_per_expert[e]
            act = n * self.work.hidden * ACT_BYTES
            self.engine.wait(H2D, self.engine.record(COMPUTE))  # .to("cpu") waits for the device work before it
            self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.act-out.e{e}", bytes_copied=act, pinned=False),
                                               "activations_to_host", n))
            self.engine.wait(HOST, self.engine.record(H2D))
            self.engine.launch(HOST, self._with(Op(f"{tag}.L{layer}.cpu.e{e}", flops=2.0 * n * self.work.expert_params,
                                                   bytes_read=self.work.expert_bytes),
                                                "host_expert", layer, e, n))
            self.engine.wait(H2D, self.engine.record(HOST))
            self.engine.launch(H2D, self._with(Op(f"{tag}.L{layer}.act-in.e{e}", bytes_copied=act, pinned=False),
                                               "activations_to_device", n))
            self.stats.link_bytes_activations += 2 * act
            self.engine.wait(COMPUTE, self.engine.record(H2D))

    def _on_host(self, tokens: int) -> bool:
        """Whether a missing expert on `tokens` tokens runs on the host: the code's constants, or the cost model."""
        if self.decide == "constants":
            return LATENCY_CPU * tokens < LATENCY_GPU
        device_op = self.work.expert_op(tokens, "")
        act = tokens * self.work.hidden * ACT_BYTES
        gpu_s = self.cost.copy_seconds(self.work.expert_bytes, pinned=False) + self.cost.seconds(device_op)
        cpu_s = (2 * self.cost.copy_seconds(act, pinned=False)
                 + self.cost.host_seconds(device_op.flops, self.work.expert_bytes))
        return cpu_s < gpu_s


#: Fiddler's kernels and host reads as its public code decodes a token at batch 1 (github.com/efeslab/fiddler at commit
#: 227715bfd6e8c731b29548eab01d9919c4fe9564, `src/fiddler/mixtral.py`, with the transformers 4.36.2 its requirements
#: pin):
#: - attention block 68 (68 to 70): the stock modules' norms, attention, gate and residual adds (49), and its own MoE
#:   dispatch (19: zeros, one-hot, and one `torch.where` per expert of the layer, 8 at Mixtral's 8);
#: - one routed expert on one token, on the device 9 (the token's index 2, the stock expert MLP 6, `index_add_`); a host
#:   expert's device side is its index and `index_add_` (3), its arithmetic the host's;
#: - head 9 (the final norm 8, the LM head; sampling runs on the host after the logits are copied there);
#: - host reads 18 a MoE layer: the 8 `torch.where` (562), two `.tolist()` per routed expert (603-604, 624-625: 4), and
#:   three indexings by a Python list per routed expert, each a blocking host-to-device copy (6).
UPSTREAM = Upstream(attention=68, expert=9, head=9, host_reads=18, sources=(
    "efeslab/fiddler 227715bfd6e8c731b29548eab01d9919c4fe9564: src/fiddler/mixtral.py 550-637 (mixtral_forward, "
    "the cpu_offload path)",
    "transformers 4.36.2 (modeling_mixtral: attention, norms, the expert MLP)"))


class Fiddler(System):
    name = "fiddler"
    order, colour = 70, "#ccb974"
    upstream = UPSTREAM
    host_compute = True
    learns_from_history = True
    options = {"decide": (str, "constants", "how a missing expert's side is chosen: constants (the code's 7 per "
                                            "token on the host against 70 on the device) or cost-model (the hardware "
                                            "profile's)", ("constants", "cost-model"))}

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        executor = FiddlerExecutor(engine, work, cache, stats, device, cost)
        executor.decide = self.decide
        return executor

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
