"""How many ops a model's own modules run per part of a decode step: what the live engine executes, counted.

The cost model prices each op as kernels x launch overhead + a roofline. Its default kernel counts (8 per attention
block, 3 per routed expert, 2 for the head: `specter.offload.work.Kernels`) describe a runtime of fused kernels. The
live engine runs the stock transformers modules eagerly, which dispatch many more. `count_decode_ops` counts them: one
token decoded after a short prefix, every aten op the modules dispatch attributed to the part whose module was running
(the routed experts, the head and final norm, everything else per decoder layer). Views and other ops that launch no
kernel on a device are not counted; reads of a device value into Python (`aten._local_scalar_dense`, what `.item()` and
`.tolist()` run) are counted apart, as host syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specter.models.adapter import MoEModel
from specter.models.trees import experts_path
from specter.numerics.passes import new_cache
from specter.timing.dispatch import PREFIX_TOKENS, KernelCounter


@dataclass(frozen=True)
class DecodeOps:
    """Kernels (and host syncs) one decode step dispatched, per part: each decoder layer's part outside its routed
    experts (attention, norms, router, shared experts; the embedding's share too), each routed expert a token reached,
    the head (final norm and LM head), and one MoE layer's draft experts on one token, where a draft was counted."""

    attention: int
    expert: int
    head: int
    draft_experts: int | None
    syncs_per_layer: float
    source: str


def _attributed(moe: MoEModel) -> tuple[list, list[str]]:
    """Hooks that keep a stack of the part each running module belongs to; (handles, the stack)."""
    stack: list[str] = []
    parts = {experts_path(moe, m): "experts" for m in moe.moe_layers}
    parts.update({"lm_head": "head", "model.norm": "head"})
    handles = []

    def leave(_module, _args, _output) -> None:  # a forward hook that returns something replaces the output
        stack.pop()

    for path, part in parts.items():
        module = moe.model.get_submodule(path)
        handles.append(module.register_forward_pre_hook(lambda _m, _a, part=part: stack.append(part)))
        handles.append(module.register_forward_hook(leave))
    return handles, stack


def count_decode_ops(moe: MoEModel, draft_experts: torch.nn.Module | None = None) -> DecodeOps:
    """Count one greedy decode step of `moe` (its own modules, on their device) after `PREFIX_TOKENS` positions, and
    one call of `draft_experts` (one MoE layer's draft experts module, as the live engine runs it) on one token."""
    device = next(moe.model.parameters()).device
    handles, stack = _attributed(moe)
    counter = KernelCounter(lambda: stack[-1] if stack else "layers")
    try:
        with torch.no_grad():
            cache = new_cache(moe)
            out = moe.model(input_ids=torch.arange(1, PREFIX_TOKENS + 1, device=device)[None], cache=cache,
                            use_cache=True)
            step = torch.tensor([[PREFIX_TOKENS + 1]], device=device)
            with counter:
                moe.model(input_ids=step, cache=out.cache, use_cache=True)
    finally:
        for h in handles:
            h.remove()
    layers, moe_layers = moe.num_layers, len(moe.moe_layers)
    routed = moe_layers * moe.moe_layers[0].top_k  # routed experts one token reaches
    kernels = counter.kernels
    draft = None
    if draft_experts is not None:
        draft = count_experts_call(draft_experts, moe, device)
    syncs = sum(counter.syncs.values()) / layers
    return DecodeOps(attention=max(1, round(kernels.get("layers", 0) / layers)),
                     expert=max(1, round(kernels.get("experts", 0) / routed)),
                     head=max(1, kernels.get("head", 0)), draft_experts=draft, syncs_per_layer=syncs,
                     source=f"counted: the non-view aten ops of one decode step of this model's transformers modules "
                            f"after {PREFIX_TOKENS} positions on {device.type} (torch {torch.__version__})")


def count_experts_call(experts: torch.nn.Module, moe: MoEModel, device: torch.device) -> int:
    """Kernels of one call of an experts module on one token routed to its first top-k experts."""
    first = moe.moe_layers[0]
    dtype = next(moe.model.parameters()).dtype
    hidden = torch.zeros(1, first.hidden_size, dtype=dtype, device=device)
    index = torch.arange(first.top_k, device=device)[None]
    weights = torch.full((1, first.top_k), 1.0 / first.top_k, dtype=dtype, device=device)
    counter = KernelCounter(lambda: "draft")
    with torch.no_grad(), counter:
        experts(hidden, index, weights)
    return max(1, counter.kernels.get("draft", 0))
