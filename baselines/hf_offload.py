"""`hf-offload`: HF accelerate's offloading as its hooks run an MoE model with per-expert modules (the paper's "HF").

Source: huggingface/accelerate, `accelerate/hooks.py` (`AlignDevicesHook.pre_forward` / `post_forward`, attached by
`attach_align_device_hook_on_blocks` when `dispatch_model` / `device_map` offloads a block to the CPU) on the MoE blocks
of transformers 4.x (`MixtralSparseMoeBlock.forward` and its Phi-3.5-MoE / Qwen2-MoE siblings: one `nn.Module` per
expert, and a loop over the experts that skips an expert no token was routed to). Mechanism: the hook on an offloaded
module copies its weights from the CPU state dict to the device when the module runs (`set_module_tensor_to_device`
with the weights map's tensor: pageable host memory, a synchronous copy on the current stream, one copy per weight
tensor) and drops them after its forward (`offload=True`: back to the meta device, nothing kept). In the MoE block
only the routed experts run, so only they cross the link, each on every pass that routes a token to it, one after
another in expert order, the compute stream waiting on each copy (nothing overlaps). The block reads the routing on
the host before it loops (the suite's host synchronization per MoE layer).

Departures, each an option where the behaviour can be chosen (the code's is the default):
- every layer's experts are offloaded and non-expert weights stay resident, as in every system here: accelerate's
  `device_map="auto"` places whole decoder blocks on the device until its memory is used and offloads the rest,
  attention included; the suite's budgets give every layer the same slots, so no option keeps whole layers;
- the copies are priced at the profile's pageable bandwidth; live on a GPU they read the suite's page-locked store, so
  a measured hf-offload copy runs at the pinned rate (the suite keeps one host copy of the experts);
- one host read of a layer's routing (the block's loop over experts reads each expert's token list on the host;
  the suite prices one synchronization per MoE layer for every system that reads routes).
`naive` is the fused-experts case (transformers 5: one parameter per layer's experts, every expert copied).
"""

from __future__ import annotations

from collections import Counter

from specter.offload.executor import Executor
from specter.offload.work import Upstream
from specter.systems import PromptContext, PromptResult, System
from specter.systems.decode import decode_one_by_one
from specter.timing.engine import Op


class HFOffloadExecutor(Executor):
    """Each routed expert's weights copied (pageable, in compute order, one copy per weight tensor) when it runs, and
    dropped after (through the staging ring: nothing enters the cache)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host_reads_routes = True  # the block's loop skips experts no token was routed to: it reads the routing

    def run_experts(self, layer: int, routes: list[tuple[int, ...]], tag: str) -> None:
        tokens_per_expert = Counter(e for r in routes for e in r)
        shapes = self.work.expert_shapes or ((1, self.work.expert_params),)
        total = sum(o * i for o, i in shapes)
        for e, n in sorted(tokens_per_expert.items()):  # the block's loop: experts in id order, the routed ones
            self.stats.demand.miss(layer)
            self.stats.h2d_bytes_demand += self.work.expert_bytes
            i = self._next_staging
            self._next_staging = (i + 1) % len(self.staging_last_use)
            for k, (out_f, in_f) in enumerate(shapes):  # one pageable copy per weight tensor, as the hook moves them
                op = Op(f"{tag}.L{layer}.load.e{e}.w{k}", bytes_copied=self.work.expert_bytes * out_f * in_f / total,
                        pinned=False)
                if k == 0:  # the device runtime copies the expert's row whole, into one staging buffer
                    op = self._with(op, "copy_to_staging", layer, e, i)
                self.copy_in_compute_order(op)
            self._expert(layer, e, n, f"{tag}.L{layer}.e{e}", staging=i)


#: HF offloading's kernels and host reads at batch 1: the stock transformers 4.36.2 Mixtral modules (the version
#: Fiddler's and Mixtral-Offloading's requirements pin) under accelerate's hooks (huggingface/accelerate v0.26.1,
#: `hooks.py`), which add copies (one per weight tensor, priced as copies) and no kernels:
#: - attention block 69 (68 to 71): norms, attention, gate and residual adds (49), and the MoE block before its
#:   expert loop (`MixtralSparseMoeBlock.forward`, modeling_mixtral.py 712-736: softmax in float32 and the cast back,
#:   top-k, renormalisation, zeros, one-hot, and one `torch.where` per expert of the layer);
#: - one routed expert on one token 9 (the token's index 2, the expert MLP 6, `index_add_`; 742-753);
#: - head 9 (the final norm 8, the LM head);
#: - host reads 18 a MoE layer: the 8 `torch.where` (736), two `.tolist()` per routed expert (742-743) and three
#:   indexings by a Python list per routed expert (748-749), each a blocking host-to-device copy. Counted from the
#:   same stock block as Fiddler's dispatch, which copies it (efeslab/fiddler, above).
UPSTREAM = Upstream(attention=69, expert=9, head=9, host_reads=18, sources=(
    "transformers 4.36.2 modeling_mixtral.py 688-755 (MixtralSparseMoeBlock)",
    "huggingface/accelerate v0.26.1: src/accelerate/hooks.py (AlignDevicesHook), utils/modeling.py "
    "(set_module_tensor_to_device)"))


class HFOffload(System):
    name = "hf-offload"
    order, colour = 40, "#006374"
    upstream = UPSTREAM

    def make_executor(self, engine, work, cache, stats, device=None, cost=None) -> Executor:
        return HFOffloadExecutor(engine, work, cache, stats, device, cost)

    def run(self, ctx: PromptContext) -> PromptResult:
        return decode_one_by_one(ctx, self.prefill(ctx))
