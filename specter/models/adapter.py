"""One interface over the stock transformers 5.x mixture-of-experts classes.

`MoEModel` wraps a loaded causal LM and exposes, per MoE layer (`MoELayer`): the router and its top-k choice as the
model computes it (DeepSeek's group limits and correction bias, PhiMoE's sparsemixer included: we call the model's own
router module, never a re-implementation of top-k), the shared experts, and each routed expert's weights and compute,
whether the experts are stored fused (stock 3D parameters; GPT-OSS transposed and interleaved) or as per-expert linear
modules (the layout GPTQModel quantizes, produced by its `defuser`). Dense layers (DeepSeek's first) are not MoE layers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.activations import ACT2FN

from specter.errors import SpecterError
from specter.models.experts import Activation, ExpertWeights, expert_ffn, expert_param_count, module_ffn


@dataclass(frozen=True)
class ArchSpec:
    """What differs between the supported classes, as attribute and config key names."""

    model_type: str
    name: str  # the family as papers name it
    router_attr: str  # the router module on the MoE block
    intermediate_key: str  # config key of one routed expert's width
    shared_attr: str | None = None  # always-on shared expert(s)
    shared_gate_attr: str | None = None  # Qwen2-MoE's sigmoid gate on the shared expert
    gpt_oss_layout: bool = False  # gate_up [E, H, 2I] interleaved, down [E, I, H], biases


ARCHITECTURES: dict[str, ArchSpec] = {
    s.model_type: s
    for s in (
        ArchSpec("mixtral", "Mixtral", "gate", "intermediate_size"),
        ArchSpec("qwen2_moe", "Qwen2-MoE (Qwen1.5-MoE)", "gate", "moe_intermediate_size", "shared_expert",
                 "shared_expert_gate"),
        ArchSpec("qwen3_moe", "Qwen3-MoE", "gate", "moe_intermediate_size"),
        ArchSpec("phimoe", "PhiMoE (Phi-3.5-MoE)", "router", "intermediate_size"),
        ArchSpec("olmoe", "OLMoE", "gate", "intermediate_size"),
        ArchSpec("deepseek_v2", "DeepSeek-V2", "gate", "moe_intermediate_size", "shared_experts"),
        ArchSpec("deepseek_v3", "DeepSeek-V3", "gate", "moe_intermediate_size", "shared_experts"),
        ArchSpec("gpt_oss", "GPT-OSS", "router", "intermediate_size", gpt_oss_layout=True),
    )
}


def supported_list() -> str:
    return ", ".join(sorted(ARCHITECTURES))


def arch_spec(model_type: str) -> ArchSpec:
    try:
        return ARCHITECTURES[model_type]
    except KeyError:
        raise SpecterError(f"unsupported architecture {model_type!r}; supported: {supported_list()}") from None


@dataclass(frozen=True)
class Routing:
    """The router's decision for T tokens, exactly as the model's own router module returned it."""

    logits: torch.Tensor  # [T, E]
    weights: torch.Tensor  # [T, k]
    indices: torch.Tensor  # [T, k]


class MoELayer:
    """One decoder layer's MoE block: routing, shared experts and per-expert access."""

    def __init__(self, layer_index: int, block: torch.nn.Module, spec: ArchSpec, config) -> None:
        self.layer_index = layer_index
        self.block = block
        self.spec = spec
        self.router: torch.nn.Module = getattr(block, spec.router_attr)
        self.experts: torch.nn.Module = block.experts
        self.num_experts: int = self.router.weight.shape[0]  # router weight [E, H]
        self.top_k: int = self.router.top_k
        self.hidden_size: int = config.hidden_size
        self.intermediate_size: int = getattr(config, spec.intermediate_key)
        self.fused: bool = isinstance(getattr(self.experts, "down_proj", None), torch.nn.Parameter)
        if spec.gpt_oss_layout:
            self.activation = Activation("gpt_oss", alpha=config.swiglu_alpha, limit=config.swiglu_limit)
        else:
            self.activation = Activation("glu", act_fn=ACT2FN[config.hidden_act])
        self.shared: torch.nn.Module | None = getattr(block, spec.shared_attr) if spec.shared_attr else None
        self.shared_gate: torch.nn.Module | None = (getattr(block, spec.shared_gate_attr) if spec.shared_gate_attr
                                                    else None)

    def __repr__(self) -> str:
        return f"MoELayer(layer={self.layer_index}, experts={self.num_experts}, top_k={self.top_k}, fused={self.fused})"

    # Routing -----------------------------------------------------------------------------------------------------
    def route(self, hidden: torch.Tensor) -> Routing:
        """The model's own routing of tokens `hidden` [T, H]."""
        logits, weights, indices = self.router(hidden)
        return Routing(logits, weights, indices)

    # Experts -----------------------------------------------------------------------------------------------------
    def expert_module(self, e: int) -> torch.nn.Module:
        """Expert e as a module with gate_proj, up_proj, down_proj (per-expert storage only)."""
        if self.fused:
            raise TypeError(f"layer {self.layer_index} stores its experts fused; use expert_weights({e})")
        return getattr(self.experts, str(e))

    def expert_weights(self, e: int) -> ExpertWeights:
        """Expert e's weights in [out, in] layout (views into fused storage; dequantized copies for quantized
        modules)."""
        if not 0 <= e < self.num_experts:
            raise IndexError(f"expert {e} out of range 0..{self.num_experts - 1}")
        ex = self.experts
        if self.fused and self.spec.gpt_oss_layout:
            gate_up = ex.gate_up_proj[e]  # [H, 2I], gate and up interleaved on the last axis
            bias = ex.gate_up_proj_bias[e]  # [2I]
            return ExpertWeights(
                gate=gate_up[:, ::2].T,
                up=gate_up[:, 1::2].T,
                down=ex.down_proj[e].T,  # stored [I, H]
                activation=self.activation,
                gate_bias=bias[::2],
                up_bias=bias[1::2],
                down_bias=ex.down_proj_bias[e],
            )
        if self.fused:
            gate, up = ex.gate_up_proj[e].chunk(2, dim=0)  # [2I, H] -> 2 x [I, H]
            return ExpertWeights(gate=gate, up=up, down=ex.down_proj[e], activation=self.activation)
        mod = self.expert_module(e)
        gate, up = _linear_weight(mod.gate_proj), _linear_weight(mod.up_proj)  # [I, H] each
        gate_bias, up_bias = getattr(mod.gate_proj, "bias", None), getattr(mod.up_proj, "bias", None)
        if self.spec.gpt_oss_layout:  # halves of the interleaved gate_up (see module_ffn)
            gate_up, bias = torch.cat([gate, up]), torch.cat([gate_bias, up_bias])  # [2I, H], [2I]
            gate, up, gate_bias, up_bias = gate_up[::2], gate_up[1::2], bias[::2], bias[1::2]
        return ExpertWeights(
            gate=gate,
            up=up,
            down=_linear_weight(mod.down_proj),
            activation=self.activation,
            gate_bias=gate_bias,
            up_bias=up_bias,
            down_bias=getattr(mod.down_proj, "bias", None),
        )

    def defused_projections(self, e: int) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """Expert e as GPTQModel's per-expert linears see it: {gate_proj, up_proj, down_proj: (weight [out, in], bias)}.

        For GPT-OSS, gate_proj and up_proj are the two halves of the interleaved gate_up projection (see module_ffn).
        """
        if not self.fused:
            mod = self.expert_module(e)
            return {n: (_linear_weight(getattr(mod, n)), getattr(getattr(mod, n), "bias", None))
                    for n in ("gate_proj", "up_proj", "down_proj")}
        ex = self.experts
        if self.spec.gpt_oss_layout:
            gate_up, bias = ex.gate_up_proj[e].T, ex.gate_up_proj_bias[e]  # [2I, H] interleaved, [2I]
            first, second = gate_up.chunk(2, dim=0)
            b_first, b_second = bias.chunk(2)
            return {"gate_proj": (first, b_first), "up_proj": (second, b_second),
                    "down_proj": (ex.down_proj[e].T, ex.down_proj_bias[e])}
        w = self.expert_weights(e)
        return {"gate_proj": (w.gate, None), "up_proj": (w.up, None), "down_proj": (w.down, None)}

    def expert_forward(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on tokens `x` [T, H] -> [T, H], with the storage's own kernels (quantized modules run quantized)."""
        if self.fused:
            return expert_ffn(x, self.expert_weights(e))
        return module_ffn(x, self.expert_module(e), self.activation, interleaved=self.spec.gpt_oss_layout)

    def expert_params(self) -> int:
        """Parameters of one routed expert at full precision."""
        return expert_param_count(self.hidden_size, self.intermediate_size, biased=self.spec.gpt_oss_layout)

    def expert_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of one routed expert at `dtype` (full precision, all projections and biases)."""
        return self.expert_params() * _itemsize(dtype)

    def stored_expert_bytes(self, e: int) -> int:
        """Bytes expert e occupies as stored (packed weights, scales and zeros for a quantized expert)."""
        if self.fused:
            return self.expert_weights(e).nbytes()
        mod = self.expert_module(e)
        return sum(t.numel() * t.element_size() for t in [*mod.parameters(), *mod.buffers()])

    # Shared experts and the whole block ----------------------------------------------------------------------------
    def shared_forward(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """The always-on shared expert(s) on `hidden` [T, H], gated as the class gates them; None if there are none."""
        if self.shared is None:
            return None
        out = self.shared(hidden)
        if self.shared_gate is not None:
            out = torch.sigmoid(self.shared_gate(hidden)) * out
        return out

    def compose(self, hidden: torch.Tensor, routing: Routing | None = None) -> torch.Tensor:
        """The block's output [T, H] recomposed from routing and per-expert compute (the reference for executors)."""
        routing = self.route(hidden) if routing is None else routing
        out = torch.zeros_like(hidden)
        for e in routing.indices.unique().tolist():
            token_idx, slot = torch.where(routing.indices == e)
            y = self.expert_forward(e, hidden[token_idx])  # [t, H]
            out.index_add_(0, token_idx, (y * routing.weights[token_idx, slot, None]).to(out.dtype))
        shared = self.shared_forward(hidden)
        return out if shared is None else out + shared


class MoEModel:
    """A loaded causal LM of a supported MoE class, with its MoE layers located."""

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        self.spec = arch_spec(getattr(config, "model_type", None))
        self.model = model
        self.config = config
        self.path: Path | None = None  # the checkpoint directory, when loaded from one
        self.loaded_by: str | None = None  # how the weights were read (`specter.models.loading`, `.streaming`)
        self.experts_on_disk: Path | None = None  # the disk tier's directory, where the experts are memory-mapped
        self.decoder_layers = model.model.layers
        self.moe_layers: list[MoELayer] = [
            MoELayer(i, layer.mlp, self.spec, config)
            for i, layer in enumerate(self.decoder_layers)
            if hasattr(layer.mlp, "experts")
        ]
        if not self.moe_layers:
            raise SpecterError(f"the {config.model_type} model has no MoE layers (every layer is dense)")

    @property
    def model_type(self) -> str:
        return self.spec.model_type

    @property
    def num_layers(self) -> int:
        return len(self.decoder_layers)

    def layer(self, layer_index: int) -> MoELayer:
        """The MoE layer at decoder layer `layer_index`."""
        for moe in self.moe_layers:
            if moe.layer_index == layer_index:
                return moe
        raise KeyError(f"decoder layer {layer_index} is not an MoE layer")

    def routed_expert_parameters(self) -> list[torch.Tensor]:
        """Every tensor that belongs to a routed expert (the part that is offloaded)."""
        return [t for moe in self.moe_layers for t in [*moe.experts.parameters(), *moe.experts.buffers()]]

    def routed_expert_bytes(self) -> int:
        return _nbytes(self.routed_expert_parameters())

    def non_expert_bytes(self) -> int:
        """Every weight that is not a routed expert: embeddings, attention, norms, routers, shared experts, LM head."""
        routed = {id(t) for t in self.routed_expert_parameters()}
        rest = [t for t in [*self.model.parameters(), *self.model.buffers()] if id(t) not in routed]
        return _nbytes(rest)

    @contextlib.contextmanager
    def _router_log(self, pre: bool, take) -> Iterator[dict[int, list[torch.Tensor]]]:
        """{decoder layer: [take(router input or output) per router call]} while the context is open."""
        log: dict[int, list[torch.Tensor]] = {moe.layer_index: [] for moe in self.moe_layers}
        handles = []
        for moe in self.moe_layers:
            if pre:
                hook = lambda _m, inputs, layer=moe.layer_index: log[layer].append(take(inputs))  # noqa: E731
                handles.append(moe.router.register_forward_pre_hook(hook))
            else:
                hook = lambda _m, _i, output, layer=moe.layer_index: log[layer].append(take(output))  # noqa: E731
                handles.append(moe.router.register_forward_hook(hook))
        try:
            yield log
        finally:
            for h in handles:
                h.remove()

    def record_routing(self):
        """Record every router call: {decoder layer: [indices [T, k] per call]} via forward hooks on the routers
        (their output is (logits, weights, indices))."""
        return self._router_log(False, lambda output: output[2].detach().clone())

    def record_router_inputs(self):
        """Record every router's input: {decoder layer: [hidden [T, H] per call]} (forward pre-hooks)."""
        return self._router_log(True, lambda inputs: inputs[0].detach().reshape(-1, inputs[0].shape[-1]).clone())


def _linear_weight(linear: torch.nn.Module) -> torch.Tensor:
    """A linear module's weight [out, in]; quantized modules are dequantized (GPTQModel's `dequantize_weight`)."""
    weight = getattr(linear, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight
    if hasattr(linear, "dequantize_weight"):
        return linear.dequantize_weight().T.contiguous()  # GPTQModel returns [in, out]
    raise TypeError(f"cannot read weights of {type(linear).__name__}")


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)
