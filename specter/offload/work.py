"""The target's and draft's work in the cost model's terms: FLOPs, bytes read and kernels per op.

Weights are costed at FP16/BF16 (2 bytes a parameter, the paper's targets) whatever dtype the CPU numerics use (a live
run's twin: at its own dtype); the draft's routed experts at their quantized size from the draft's sidecar. Per decoder
layer and pass of n tokens over a context of c tokens:
- attention block (norms, projections, attention, router, shared experts or a dense MLP): FLOPs 2 n P_layer +
  4 n c d_attn, bytes P_layer x 2 + c x KV bytes per token; 8 kernels;
- one routed expert on m tokens: FLOPs 2 m P_expert, bytes = the expert's stored size; 3 kernels;
- LM head and final norm: FLOPs 2 n H V, bytes H V x 2; 2 kernels;
- a copy of n positions of KV into a draft's own cache (device to device): bytes 2 x n x KV bytes per token and layer x
  layers (each byte read and written), no FLOPs; one copy per layer and tensor (K and V, or MLA's latent and rotary
  key: two tensors a layer).
These kernel counts (`Kernels`) and the attention FLOP formula are modelling choices, the same for every system: a
runtime of fused kernels (`--pricing fused`). Priced `counted` (a live run's simulated twin, by default), each op stands
for the kernels the model's own transformers modules dispatch, counted (`specter.numerics.opcount`) on the model, or on
a tiny instance of the priced architecture's class; a live twin's weights are priced at the dtype they decode in
(`weight_bytes`). Priced `upstream`, each op stands for the kernels the system's own public code runs per part and the
host reads it makes per MoE layer, as the system's file declares them (`Upstream`). Each kernel also costs the host its
dispatch (`specter.timing.sim`). KV per token and layer is K and V
of every KV head, or, for multi-head latent attention (DeepSeek's MLA), the compressed latent and the rotary key that
DeepSeek's own inference caches (kv_lora_rank + qk_rope_head_dim values).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specter.models.adapter import MoEModel
from specter.timing.engine import Op

WEIGHT_BYTES = 2  # FP16/BF16 target weights
ATTN_KERNELS, EXPERT_KERNELS, HEAD_KERNELS = 8, 3, 2
KV_TENSORS = 2  # cached tensors per layer: K and V (MLA: the latent and the rotary key)
MODELLED = "modelled: fused kernels (specter.offload.work)"


def in_turn(fns):
    """One op's device work made of several: each of `fns` in turn (a group of experts one op prices)."""
    def fn() -> None:
        for each in fns:
            each()
    return fn


@dataclass(frozen=True)
class Kernels:
    """Kernels per op: a decoder layer's attention block, one routed expert, the head, and one MoE layer's draft experts
    as the fused INT4 kernel runs them; `host_reads`: the host's blocking reads of device values per target MoE layer
    (None: the executor's own, one read of the routing where the system reads it); `pricing` names the pricing
    (`PRICINGS`) and `source` says where the counts come from."""

    attention: int = ATTN_KERNELS
    expert: int = EXPERT_KERNELS
    head: int = HEAD_KERNELS
    draft_experts: int = 1
    source: str = MODELLED
    pricing: str = "fused"
    host_reads: int | None = None
    dispatch: str = "eager"  # how the runtime hands the kernels to the device (`specter.timing.engine.DISPATCH_MODES`)


@dataclass(frozen=True)
class Upstream:
    """A system's kernels and host reads per part as its public code makes them (`--pricing upstream`), declared in
    the system's own file from the upstream files and lines in `sources`. A part left None runs the priced
    architecture's stock transformers modules in the upstream code too: the counted figure stands for it. `host_reads`
    are the blocking reads of device values per target MoE layer (None: the executor's own). `assumption` is set
    where no code is public and the figures are the suite's assumption, saying which. The counts are those of the
    architecture the code was read at (Mixtral-8x7B for the peers), applied unchanged at the others, except where
    `by_architecture` gives the code's own for one. The default declaration is the suite's own implementation,
    counted (`resident`, `on-demand`)."""

    attention: int | None = None
    expert: int | None = None
    head: int | None = None
    draft_experts: int | None = None
    host_reads: int | None = None
    sources: tuple[str, ...] = ()
    assumption: str = ""
    expert_unquantized: int | None = None  # `expert` where the experts are not quantized (--expert-bits 16), if other
    #: (architecture, declaration): where the upstream code runs model code of its own for an architecture, what it
    #: makes there instead
    by_architecture: tuple[tuple[str, Upstream], ...] = ()
    #: how the upstream runtime hands its kernels to the device: eager (Python and a framework per op), native (a
    #: compiled runtime's launch calls) or graph (a captured graph replayed); `specter.timing.engine.DISPATCH_MODES`
    dispatch: str = "eager"

    def kernels(self, counted: Kernels, system: str, quantized_experts: bool = False,
                architecture: str | None = None) -> Kernels:
        """The kernels each op stands for under this declaration, from `counted` (the stock modules' counts) where a
        part runs them; `quantized_experts`: the target's experts are stored quantized (`--expert-bits` below 16);
        `architecture`: the one the run is priced at (`--cost-as`), for what `by_architecture` says of it."""
        own = dict(self.by_architecture).get(architecture)
        if own is not None:
            return own.kernels(counted, system, quantized_experts)
        if not self.sources and not self.assumption:
            return Kernels(counted.attention, counted.expert, counted.head, counted.draft_experts,
                           f"upstream: {system} is the suite's own; {counted.source}", "upstream", counted.host_reads)
        where = f"as its code runs ({'; '.join(self.sources)})" if self.sources else "with no public code"
        expert = self.expert if quantized_experts or self.expert_unquantized is None else self.expert_unquantized
        return Kernels(attention=self.attention or counted.attention, expert=expert or counted.expert,
                       head=self.head or counted.head, draft_experts=self.draft_experts or counted.draft_experts,
                       source=f"upstream: {system} {where}"
                              + (f"; ASSUMED: {self.assumption}" if self.assumption else "")
                              + ("; the other parts " + counted.source if None in (self.attention, self.expert,
                                                                                  self.head) else ""),
                       pricing="upstream", host_reads=self.host_reads, dispatch=self.dispatch)


@dataclass(frozen=True)
class ModelWork:
    layers: tuple[int, ...]  # decoder layer indices, in order
    moe_layers: tuple[int, ...]
    experts_per_layer: int
    layer_params: dict[int, int]  # non-routed-expert parameters of each decoder layer
    head_params: int  # LM head (+ final norm)
    expert_params: int  # one routed expert
    expert_bytes: int  # one routed expert at weight_bytes
    attn_width: int  # heads x head dim (attention FLOPs per context token)
    heads: int  # query heads
    kv_heads: int
    qk_dim: int  # per head, queries and keys
    v_dim: int  # per head, values
    kv_bytes_per_token: int  # per layer, K and V (or MLA's latent) at weight_bytes
    hidden: int
    vocab: int
    top_k: int = 0  # experts routed per token
    expert_shapes: tuple[tuple[int, int], ...] = ()  # one routed expert's projections, (out, in) each
    weight_bytes: int = WEIGHT_BYTES  # bytes a weight (and a KV value) is priced at
    kernels: Kernels = Kernels()
    #: each MoE layer's shared experts (and their gate), a part of its `layer_params`: a system that runs them beside
    #: the routed experts prices them apart (`attention_op(..., shared=False)`, `shared_op`)
    shared_params: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, moe: MoEModel, weight_bytes: int = WEIGHT_BYTES) -> ModelWork:
        cfg = moe.config
        layer_params = {}
        for i, layer in enumerate(moe.decoder_layers):
            routed = {id(p) for p in layer.mlp.experts.parameters()} if hasattr(layer.mlp, "experts") else set()
            layer_params[i] = sum(p.numel() for p in layer.parameters() if id(p) not in routed)
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        v_dim = getattr(cfg, "v_head_dim", None) or head_dim
        qk_dim = (getattr(cfg, "qk_nope_head_dim", 0) or 0) + (getattr(cfg, "qk_rope_head_dim", 0) or 0) or head_dim
        head_params = sum(p.numel() for m in (moe.model.lm_head, moe.model.model.norm) for p in m.parameters())
        first = moe.moe_layers[0]
        latent = getattr(cfg, "kv_lora_rank", None)
        kv_values = latent + (getattr(cfg, "qk_rope_head_dim", 0) or 0) if latent else kv_heads * (qk_dim + v_dim)
        h, i = cfg.hidden_size, first.intermediate_size
        return cls(
            layers=tuple(range(moe.num_layers)),
            moe_layers=tuple(m.layer_index for m in moe.moe_layers),
            experts_per_layer=first.num_experts,
            layer_params=layer_params,
            head_params=head_params,
            expert_params=first.expert_params(),
            expert_bytes=first.expert_params() * weight_bytes,
            attn_width=heads * max(qk_dim, v_dim),
            heads=heads,
            kv_heads=kv_heads,
            qk_dim=qk_dim,
            v_dim=v_dim,
            kv_bytes_per_token=kv_values * weight_bytes,
            hidden=cfg.hidden_size,
            vocab=cfg.vocab_size,
            top_k=first.top_k,
            expert_shapes=((i, h), (i, h), (h, i)),  # gate, up, down
            weight_bytes=weight_bytes,
            shared_params={m.layer_index: sum(p.numel() for part in (m.shared, m.shared_gate) if part is not None
                                              for p in part.parameters()) for m in moe.moe_layers},
        )

    def stored_as(self, bits: int | str) -> tuple[ModelWork, dict]:
        """This work with the target's routed experts stored at `--expert-bits` (copied, held in slots and read at
        their stored size) and what the records say of it: the format, the bytes of one expert, and that the numerics
        are the model's own (the quantized experts' own tokens and routes are not computed)."""
        from dataclasses import replace

        from specter.timing.cost import GGUF_FORMATS, gguf_expert_bytes, hqq_expert_bytes

        if bits == 16:
            fmt = "fp16" if self.weight_bytes == 2 else f"{8 * self.weight_bytes}-bit floats (the live run's dtype)"
            return self, {"bits": 16, "format": fmt, "expert_bytes": self.expert_bytes}
        if bits in GGUF_FORMATS:
            work = replace(self, expert_bytes=gguf_expert_bytes(self.expert_shapes, self.moe_layers, len(self.layers)))
            fmt = "gguf q4_k_m (llama.cpp's mix, the MoE layers' mean; specter.timing.cost)"
        else:
            work = replace(self, expert_bytes=hqq_expert_bytes(self.expert_shapes, bits))
            fmt = "hqq (Mixtral-Offloading's storage; specter.timing.cost)"
        return work, {"bits": bits, "format": fmt, "expert_bytes": work.expert_bytes,
                      "numerics": "the model's own FP weights: tokens and routes are not those of quantized experts"}

    def pricing(self) -> dict:
        """What the records say of how this work is priced: bytes a weight, and kernels per op with their source."""
        k = self.kernels
        return {"pricing": k.pricing, "weight_bytes": self.weight_bytes,
                "kernels": {"attention": k.attention, "expert": k.expert, "head": k.head,
                            "draft_experts": k.draft_experts, "host_reads": k.host_reads, "dispatch": k.dispatch},
                "kernels_source": k.source}

    # ops -----------------------------------------------------------------------------------------------------------
    def attention_op(self, layer: int, tokens: int, context: int, label: str, shared: bool = True) -> Op:
        """The layer's attention block; `shared=False`: without its shared experts (priced by `shared_op`)."""
        p = self.layer_params[layer] - (0 if shared else self.shared_params.get(layer, 0))
        return Op(label, flops=2.0 * tokens * p + 4.0 * tokens * context * self.attn_width,
                  bytes_read=p * self.weight_bytes + context * self.kv_bytes_per_token,
                  launches=self.kernels.attention)

    def expert_op(self, tokens: int, label: str, stored_bytes: int | None = None) -> Op:
        return Op(label, flops=2.0 * tokens * self.expert_params,
                  bytes_read=self.expert_bytes if stored_bytes is None else stored_bytes,
                  launches=self.kernels.expert)

    def fused_experts_op(self, tokens: list[int], label: str, stored_bytes: int) -> Op:
        """Several routed experts as one fused kernel (the draft's INT4 MoE kernel): one launch (or the counted kernels
        of the draft's experts module); each expert read once at its stored size, on its tokens."""
        return Op(label, flops=2.0 * sum(tokens) * self.expert_params, bytes_read=stored_bytes * len(tokens),
                  launches=self.kernels.draft_experts)

    def shared_op(self, layer: int, tokens: int, label: str) -> Op:
        """The MoE layer's shared experts on `tokens` tokens (the kernels of one expert MLP)."""
        p = self.shared_params.get(layer, 0)
        return Op(label, flops=2.0 * tokens * p, bytes_read=p * self.weight_bytes, launches=self.kernels.expert)

    def head_op(self, tokens: int, label: str) -> Op:
        return Op(label, flops=2.0 * tokens * self.head_params, bytes_read=self.head_params * self.weight_bytes,
                  launches=self.kernels.head)

    def kv_copy_op(self, tokens: int, label: str) -> Op:
        """`tokens` positions of every layer's KV copied on the device (into a draft's own cache)."""
        return Op(label, bytes_read=2.0 * self.kv_bytes(tokens), launches=KV_TENSORS * len(self.layers))

    def copy_op(self, label: str, pinned: bool = True) -> Op:
        return Op(label, bytes_copied=self.expert_bytes, pinned=pinned)

    def draft_step_ops(self, context: int, top_k: int, expert_bytes: int, fused: bool = True) -> list[Op]:
        """One draft step (one token after `context` cached ones), as a latency model sees it: every layer's attention
        block, `top_k` quantized experts per MoE layer and the LM head; `fused`: each MoE layer's experts as one fused
        INT4 kernel, as the executor runs a fused draft (else one kernel group per expert)."""
        experts = ([self.fused_experts_op([1] * top_k, "", expert_bytes)] * len(self.moe_layers) if fused
                   else [self.expert_op(1, "", expert_bytes)] * (len(self.moe_layers) * top_k))
        return [self.attention_op(layer, 1, context, "") for layer in self.layers] + experts + [self.head_op(1, "")]

    # sizes ---------------------------------------------------------------------------------------------------------
    def quantized_expert_bytes(self, bits: int, group_size: int) -> int:
        """One routed expert as a GPTQ-packed draft stores it at these shapes (codes, zeros, scales, group index)."""
        from specter.quant.packing import packed_bytes

        return sum(packed_bytes(in_f, out_f, bits, group_size) for out_f, in_f in self.expert_shapes)

    def non_expert_bytes(self) -> int:
        return (sum(self.layer_params.values()) + self.head_params + self.hidden * self.vocab) * self.weight_bytes

    def kv_bytes(self, tokens: int) -> int:
        return tokens * self.kv_bytes_per_token * len(self.layers)
