"""The live engine's device side: the model itself decodes through the offload runtime.

The target runs as its stock transformers module tree, with each MoE layer's routed experts replaced by an
`OffloadedExperts` module (`specter.models.trees.with_replaced`: every other module, attention, norms, routers, shared
experts, embeddings and head, is the target's own object). When the model reaches an MoE layer, its own router has
chosen; the module hands those choices to the executor (`reach`), which schedules the layer as the simulator does, with
the system's cache, hooks and planners: the copies it issues are real copies from the host `ExpertStore` into device
slots (`ExpertSlots`), and each routed expert computes on the layer's hidden states from the slot or staging buffer the
executor names. The module then sums the experts' weighted outputs in expert order, as the stock experts module does.

A speculative system's draft is the target's tree with the draft's quantized experts (`specter.quant.draft`), here
wrapped so that the executor hears each MoE layer's routing once the draft's experts have run. The draft reads the
target's KV cache and writes its speculative positions into it; every pass first crops the cache to the positions it
comes after, so a verification overwrites them and a rejection drops them. A pass at position 0 starts a new cache.
A system whose draft keeps a KV cache of its own (SpecMoEOff, `own_draft_kv`) gets one: the draft's passes read and
write it alone, and it is cropped the same way. Its draft computes with the target's non-expert weights, the same
values the separate copy the system keeps on its device would hold, so the device holds them once.

The trees are copied onto the device once (`specter.models.trees.moved_to`: what the target and the draft share, once),
and on a GPU an expert computes every token of the pass weighted by its routing, so that the host never waits for a
gather's indices. The draft's 4-bit linears run on PyTorch's fused INT4 kernel for the device, the CPU's or a GPU's
(`specter.quant.kernels`), instead of the simulator's draft modules, unless the run asks for those.

Nothing here is recorded: the tokens and routes are the ones this pass computed (`LivePass`), so a corrupted slot, a
copy into the wrong slot or an expert computed from a stale buffer changes what the model decodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specter.errors import SpecterError
from specter.models.adapter import MoEModel
from specter.models.experts import ExpertWeights, expert_ffn
from specter.models.trees import experts_path, moved_bytes, moved_to, with_replaced
from specter.numerics.passes import new_cache
from specter.offload import grouped
from specter.offload.device import ExpertSlots, require_device_memory
from specter.offload.memory import STAGING_BUFFERS
from specter.offload.store import ExpertStore
from specter.offload.work import ModelWork
from specter.quant.kernels import PACKED_KERNEL, FusedInt4Linear, with_fused_kernels

# (MoE layer, each input's routed experts, or a call that reads them once the host has waited) -> those routes
Reach = Callable[[int, list[tuple[int, ...]] | Callable[[], list[tuple[int, ...]]]], list[tuple[int, ...]]]


@dataclass
class LivePass:
    """What one live pass computed: its logits [T, V] (float32), the argmax after each input, and each input's routes
    {layer: experts}."""

    logits: torch.Tensor
    argmax: list[int]
    routes: list[dict[int, tuple[int, ...]]] = field(default_factory=list)


class OffloadedExperts(torch.nn.Module):
    """Drop-in for a stock experts module: forward(hidden [T, H], top_k_index [T, k], top_k_weights [T, k]), computed
    by the live runtime from the device slots the executor fills."""

    def __init__(self, runtime: LiveRuntime, layer: int) -> None:
        super().__init__()
        self.runtime, self.layer = runtime, layer

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        return self.runtime.target_experts(self.layer, hidden_states, top_k_index, top_k_weights)


class ObservedExperts(torch.nn.Module):
    """A draft's resident experts, computed by the draft's own module; the executor hears the routing after."""

    def __init__(self, runtime: LiveRuntime, layer: int, inner: torch.nn.Module) -> None:
        super().__init__()
        self.runtime, self.layer, self.inner = runtime, layer, inner

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        routes = top_k_index.tolist()  # the host reads the routing once: the executor's hooks and the gathers use it
        self.runtime.host_reads["draft routing"] += 1
        out = self.inner(hidden_states, top_k_index, top_k_weights, routes=routes)
        self.runtime.reached(self.layer, routes)
        return out


def _dequantized_bytes(experts: torch.nn.Module, measured: dict[tuple, int]) -> int:
    """The most bytes one of `experts`' linears that dequantizes its codes on every call (`PackedQuantLinear`)
    allocates while it computes, measured once a shape across the layers (`measured`;
    `specter.quant.packing.dequantize_peak_bytes`); 0 where every linear runs on a fused kernel."""
    from specter.quant.draft import PackedQuantLinear
    from specter.quant.packing import dequantize_peak_bytes

    found = [0]
    for m in experts.modules():
        if isinstance(m, PackedQuantLinear):
            key = (tuple(m.qweight.shape), tuple(m.scales.shape), m.bits, m.dtype)
            if key not in measured:
                measured[key] = dequantize_peak_bytes(m._packed(), m.dtype)
            found.append(measured[key])
    return max(found)


def _routes(index: torch.Tensor | list[list[int]]) -> list[tuple[int, ...]]:
    return [tuple(sorted(row)) for row in (index.tolist() if isinstance(index, torch.Tensor) else index)]


class LiveRuntime(ExpertSlots):
    """The target (and its draft) decoding through `slots_per_layer` slots per MoE layer on `device`, over passes
    that reach at most `max_context` positions (what the device's KV cache is sized for in its memory check)."""

    live = True

    def __init__(self, target: MoEModel, work: ModelWork, store: ExpertStore, slots_per_layer: int | dict[int, int],
                 device: str = "cpu", draft=None, check: bool = False, own_draft_kv: bool = False,
                 max_context: int = 0, draft_kernel: str = "packed") -> None:
        trees = [with_replaced(target.model, {experts_path(target, m): OffloadedExperts(self, m.layer_index)
                                              for m in target.moe_layers})]
        self.draft_kernel = None  # which kernel the draft's experts run on, in words
        transient, measured = 0, {}  # the most a draft linear that dequantizes on every call allocates for it
        if draft is not None:
            observed, kernels, workspace = {}, [], {}
            for m in draft.moe.moe_layers:
                experts = m.experts
                if draft_kernel == "fused":  # the simulator's draft (`draft`) keeps its own modules
                    experts, kernel = with_fused_kernels(experts, torch.device(device), workspace)
                else:
                    kernel = PACKED_KERNEL
                kernels.append(kernel)
                if torch.device(device).type == "cuda":  # where the memory check runs
                    transient = max(transient, _dequantized_bytes(experts, measured))
                observed[experts_path(draft.moe, m)] = ObservedExperts(self, m.layer_index, experts)
            del workspace
            trees.append(with_replaced(draft.model, observed))
            self.draft_kernel = " | ".join(dict.fromkeys(kernels))
        require_device_memory(torch.device(device), self.device_bytes(
            trees, work, store, slots_per_layer, device, max_context, own_draft_kv, transient))
        super().__init__(work, store, slots_per_layer, device, check)
        self.target = target
        moved = moved_to(trees, self.device)  # on the CPU as device, over the target's own tensors
        self.model = moved[0]
        self.draft_model = moved[1] if draft is not None else None
        for m in self.draft_model.modules() if self.draft_model is not None else ():
            if isinstance(m, FusedInt4Linear):
                m.ready()  # a GPU kernel's layout, made on the GPU
        self.cache = None
        # what the host read of the device's results, by kind (each a wait for the device on a GPU): the argmax of a
        # pass, a target MoE layer's routing, a draft MoE layer's routing
        self.host_reads: Counter = Counter()
        # the compute and copy streams every live decode of this runtime runs on (one pair, made once: a warm-up on
        # them warms the timed decodes' allocations); none on the CPU as device
        self.streams = None
        if self.device.type == "cuda":
            from specter.timing.cuda import make_streams

            self.streams = make_streams(self.device)
        # an expert computes its routed tokens gathered (the stock module's way, and bit for bit its result), or, on a
        # GPU, every token of the pass weighted by its routing (0 where it went elsewhere): a gather's indices depend
        # on the routing, so the host would wait for the device at every expert
        self.gathers = self.device.type != "cuda"
        self.own_draft_kv = own_draft_kv
        self.draft_cache = None  # the draft's own KV cache (`own_draft_kv`)
        self._reach: Reach | None = None
        # the MoE layer being computed: (hidden [T, H], top-k index [T, k], top-k weights [T, k], {expert: output},
        # each token's experts as the host read them)
        self._call: tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict] | None = None
        # every expert of a layer resident: its experts computed grouped from the slots, no routing read first
        # (`specter.offload.grouped`); whether the device can, and each placement's expert-to-slot table on it
        self._grouped: bool | None = None
        self._slot_tables: dict[tuple[int, tuple[int, ...]], torch.Tensor] = {}

    def release(self) -> None:
        """Give back what the runtime holds on its device (the slots, staging buffers, the trees' copies, the KV
        caches) before another runtime is built: a sweep's next system checks the device's free memory against its
        own needs. On a GPU the caching allocator's freed blocks go back to the device too."""
        self.model = self.draft_model = self.cache = self.draft_cache = self._call = self.streams = None
        self._slot_tables = {}
        self.slots, self.staging = {}, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    @staticmethod
    def device_bytes(trees: list[torch.nn.Module], work: ModelWork, store: ExpertStore,
                     slots_per_layer: int | dict[int, int], device: str, max_context: int, own_draft_kv: bool = False,
                     draft_transient: int = 0) -> dict[str, int]:
        """What the runtime puts on the device, by part (bytes), before any of it is allocated: the slots and staging
        buffers at the store's dtype, the model's own tensors but its routed experts (the draft's packed experts among
        them), the KV cache of `max_context` positions (twice for a draft with its own), and `draft_transient`, what
        a draft linear dequantized on every call allocates while it computes (`_dequantized_bytes`)."""
        expert = store.expert_bytes
        item = next(trees[0].parameters()).element_size()
        kv = len(work.layers) * work.kv_heads * max_context * (work.qk_dim + work.v_dim) * item
        slots = sum(slots_per_layer.values()) if isinstance(slots_per_layer, dict) else \
            len(work.moe_layers) * slots_per_layer
        parts = {"expert slots": slots * expert,
                 "staging buffers": STAGING_BUFFERS * expert,
                 "the model's non-expert weights" + (" and the draft's experts" if len(trees) > 1 else ""):
                     moved_bytes(trees, torch.device(device)),
                 f"KV cache ({max_context} positions)": kv}
        if own_draft_kv:
            parts["the draft's own KV cache"] = kv
        if draft_transient:
            parts["the draft's codes dequantized on each call (its largest linear's temporaries)"] = draft_transient
        return parts

    # passes ------------------------------------------------------------------------------------------------------
    def forward(self, inputs: list[int], context: int, reach: Reach, draft: bool = False) -> LivePass:
        """One pass of the target (or the draft) over `inputs` after the cache's first `context` positions, calling
        `reach` at each MoE layer as the model gets there."""
        if draft and self.draft_model is None:
            raise RuntimeError("a live draft pass, but the runtime was given no draft; please report this")
        own = draft and self.own_draft_kv
        if context == 0:
            setattr(self, "draft_cache" if own else "cache", new_cache(self.target))
        cache = self.draft_cache if own else self.cache
        held = cache.get_seq_length() if cache is not None else 0
        if held < context:
            raise RuntimeError(f"a live {'draft ' if own else ''}pass after {context} positions, but its KV cache "
                               f"holds {held}; please report this")
        if held > context:
            cache.crop(context - held)  # drop the positions a draft or a rejected verification wrote
        self._reach = reach
        try:
            with torch.no_grad():
                out = (self.draft_model if draft else self.model)(
                    input_ids=torch.tensor([inputs], device=self.device), cache=cache, use_cache=True)
        finally:
            self._reach = None
        if own:
            self.draft_cache = out.cache
        else:
            self.cache = out.cache
        logits = out.logits[0].float()
        # the argmax and whether any logit is NaN or +inf, read in one transfer: a damaged weight (a disk tier's row
        # changed under the run, a checkpoint damaged after it was checked) ends the run before any record
        read = torch.cat([logits.argmax(-1), (logits.isnan() | logits.isposinf()).any().view(1).long()]).tolist()
        self.host_reads["argmax"] += 1
        if read[-1]:
            raise SpecterError(f"the live {'draft' if draft else 'target'} pass produced NaN or infinite logits: its "
                               "weights are damaged (a checkpoint, draft or disk tier changed since it was checked); "
                               "no record was written. Rebuild what changed, or delete the suite's cache "
                               "(SPECTER_CACHE_DIR) to rebuild the disk tier, and run again")
        return LivePass(logits, read[:-1])

    def draft_held(self, committed: int) -> int:
        """How many of the first `committed` positions the draft's own KV cache holds (`own_draft_kv`): the positions
        it wrote over committed tokens; the rest it reads again before it drafts."""
        held = self.draft_cache.get_seq_length() if self.draft_cache is not None else 0
        return min(held, committed)

    def target_experts(self, layer: int, hidden: torch.Tensor, index: torch.Tensor,
                       weights: torch.Tensor) -> torch.Tensor:
        """Target MoE layer `layer` on `hidden`, routed by the model's own router: the executor schedules it (copies,
        then each expert from its buffer); the outputs are summed in expert order."""
        if self._reach is None:
            raise RuntimeError(f"L{layer}: the live model ran outside a scheduled pass; please report this")
        # the routing's copy to the host, issued behind the router (on a GPU it lands once the router has run): the
        # executor waits for it once, in its timed synchronization, then reads it (`read`), so the layer's one wait
        # for the device is the one its timeline shows
        on_host, rows = index.to("cpu", non_blocking=True), []

        def read(after_pass: bool = False) -> list[tuple[int, ...]]:
            rows.extend(on_host.tolist())  # each token's experts in the router's order (a host expert's positions)
            # after the pass: behind its argmax read, waiting for nothing of its own (`specter.offload.grouped`)
            self.host_reads["target routing, read after the pass" if after_pass else "target routing"] += 1
            return _routes(rows)

        self._call = (hidden, index, weights, {}, rows)
        try:
            per_token = self._reach(layer, read)
            outputs = self._call[3]
        finally:
            self._call = None
        if per_token is None:  # every expert resident: computed grouped, the routing read after the pass
            return outputs.pop("grouped")
        missing = sorted({e for r in per_token for e in r} - set(outputs))
        if missing:
            raise RuntimeError(f"L{layer}: the executor computed no output for experts {missing}; please report this")
        out = torch.zeros_like(hidden)
        for e in sorted(outputs):
            token_idx, y = outputs[e]
            if token_idx is None:  # every token through the expert, weighted 0 where it did not route there
                out += y
            else:
                out.index_add_(0, token_idx, y)
        return out

    def reached(self, layer: int, index: list[list[int]]) -> None:
        """The draft's MoE layer `layer` has run, routed as `index` (each token's experts, read by the host); the
        executor schedules its part of the pass."""
        self._reach(layer, _routes(index))

    def _compute(self, layer: int, expert: int, weights: ExpertWeights) -> None:
        """Expert `expert` of the layer being computed, from `weights` (views into a slot, a staging buffer or the
        store's row), into the layer's outputs."""
        if self._call is None:
            raise RuntimeError(f"L{layer} expert {expert} computed outside its layer; please report this")
        hidden, index, top_k_weights, outputs, rows = self._call
        where = weights.gate.device
        if where != hidden.device:  # a host expert beside a GPU (Fiddler): its tokens go to the host and back
            # which tokens, and at which of their top-k places, from the routing the host has read: their rows are
            # gathered on the device and only they cross
            pairs = [(t, j) for t, row in enumerate(rows) for j, e in enumerate(row) if e == expert]
            token_idx, position = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2).T.to(hidden.device)
            x = hidden[token_idx].to(where)
            y = expert_ffn(x, weights) * top_k_weights[token_idx, position, None].to(where)
            outputs[expert] = (token_idx, y.to(hidden.device, hidden.dtype))
        elif not self.gathers:  # no host synchronization (a data-dependent gather would wait for it)
            weight = (top_k_weights * (index == expert)).sum(-1, keepdim=True)  # [T, 1]: 0 where not routed here
            outputs[expert] = (None, (expert_ffn(hidden, weights) * weight).to(hidden.dtype))
        else:  # the routed tokens gathered, as the stock experts module computes them
            token_idx, position = torch.where(index == expert)
            y = expert_ffn(hidden[token_idx], weights) * top_k_weights[token_idx, position, None]
            outputs[expert] = (token_idx, y.to(hidden.dtype))

    # the executor's device work ----------------------------------------------------------------------------------
    def grouped_ready(self, layer: int) -> bool:
        """Whether this device computes a layer's experts grouped over its slots (`specter.offload.grouped`)."""
        if self._grouped is None:
            self._grouped = grouped.supported(self)
        return self._grouped

    def grouped_experts(self, layer: int, slot_of: tuple[int, ...]) -> Callable[[], None]:
        """The layer's experts, every one resident (`slot_of`: each expert's slot), grouped from the slots."""
        def fn() -> None:
            table = self._slot_tables.get((layer, slot_of))
            if table is None:  # made once a placement: a host-to-device copy would wait for the device
                table = self._slot_tables[layer, slot_of] = torch.tensor(slot_of, device=self.device)
            for expert, index in enumerate(slot_of):  # (`check`: each slot holds the expert the table says)
                self._holds(layer, index, expert)
            hidden, index, weights, outputs, _ = self._call
            outputs["grouped"] = grouped.experts(self, layer, table, hidden, index, weights)
        return fn

    def expert_in_slot(self, layer: int, expert: int, index: int, tokens: int) -> Callable[[], None]:
        def fn() -> None:
            self._holds(layer, index, expert)
            self._compute(layer, expert, self.store.layout.views(self.slots[layer][index]))
        return fn

    def expert_in_staging(self, layer: int, expert: int, index: int, tokens: int) -> Callable[[], None]:
        def fn() -> None:
            self._staged(index, layer, expert)
            self._compute(layer, expert, self.store.layout.views(self.staging[index]))
        return fn

    def host_expert(self, layer: int, expert: int, tokens: int) -> Callable[[], None]:
        """An expert computed where the host keeps it (Fiddler): from its row of the store."""
        return lambda: self._compute(layer, expert, self.store.layout.views(self.store.row(layer, expert)))

    def copy_kv(self, start: int, tokens: int) -> Callable[[], None]:
        raise SpecterError("the live engine's draft reads the target's KV cache: draft-kv=copied is an ablation of the "
                           "simulator; drop the option or use --engine sim")

    @staticmethod
    def _model_work(*_args) -> None:
        """Work the model's own modules did as the pass reached this op (attention, the head, the draft's experts)."""
        return None

    attention = lm_head = draft_layer = draft_expert = shared_experts = _model_work
    activations_to_host = activations_to_device = _model_work
