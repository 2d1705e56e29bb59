"""Module trees over a loaded model that replace some of its modules and share every other one.

The draft (`specter.quant.draft`) is the target with its routed experts replaced by quantized ones; the live engine's
model (`specter.offload.live`) is the target with its routed experts replaced by ones that compute from device slots.
Both are built by `with_replaced`: every module on the path from the root to a replaced one is shallow-copied, every
other module is the original object, so the two trees share their tensors.
"""

from __future__ import annotations

import copy

import torch

from specter.models.adapter import MoELayer, MoEModel


def experts_path(target: MoEModel, layer: MoELayer) -> str:
    """The dotted path of MoE layer `layer`'s experts module from the causal LM's root."""
    for name, child in target.decoder_layers[layer.layer_index].named_children():
        if child is layer.block:
            return f"model.layers.{layer.layer_index}.{name}.experts"
    raise AssertionError("MoE block not found under its decoder layer")


def with_replaced(root: torch.nn.Module, replacements: dict[str, torch.nn.Module]) -> torch.nn.Module:
    """A new tree equal to `root` but for `replacements` (dotted path -> module); modules off those paths are shared."""
    copies: dict[int, torch.nn.Module] = {}

    def own(module: torch.nn.Module) -> torch.nn.Module:
        if id(module) not in copies:
            dup = copy.copy(module)  # shares parameters and buffers; gets its own child table and hook tables
            dup._modules = dict(module._modules)
            for name, value in vars(module).items():
                if name.startswith(("_forward", "_backward")) and isinstance(value, dict):
                    setattr(dup, name, type(value)(value))
            copies[id(module)] = dup
        return copies[id(module)]

    new_root = own(root)
    for path, new in replacements.items():
        *parents, leaf = path.split(".")
        node = new_root
        for name in parents:
            child = own(node._modules[name])
            node._modules[name] = child
            node = child
        node._modules[leaf] = new
    return new_root
