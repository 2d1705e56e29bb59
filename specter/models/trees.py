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


def _held(module: torch.nn.Module):
    """The tensors `module` itself holds: parameters, buffers and tensors kept as plain attributes."""
    yield from (t for t in module._parameters.values() if t is not None)
    yield from (t for t in module._buffers.values() if t is not None)
    yield from (t for t in vars(module).values() if isinstance(t, torch.Tensor))


def moved_bytes(roots: list[torch.nn.Module], device: torch.device) -> int:
    """The bytes `moved_to(roots, device)` puts on `device` (each shared tensor once; none already there)."""
    seen: dict[int, int] = {}
    for root in roots:
        for module in root.modules():
            for t in _held(module):
                if t.device != device:
                    seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())


def moved_to(roots: list[torch.nn.Module], device: torch.device) -> list[torch.nn.Module]:
    """Copies of the trees `roots` with every parameter, buffer and tensor attribute on `device`: each module is
    copied (its own parameter, buffer and child tables), each tensor moved once, so what the roots share (the draft's
    tree and the target's: attention, routers, norms, embeddings, head) stays shared, on the device once. A tensor
    already on `device` is not copied (on the CPU as device the copies hold the roots' own storage)."""
    modules: dict[int, torch.nn.Module] = {}
    tensors: dict[int, torch.Tensor] = {}

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in tensors:
            moved = t.detach().to(device)
            tensors[id(t)] = torch.nn.Parameter(moved, requires_grad=False) if isinstance(t, torch.nn.Parameter) \
                else moved
        return tensors[id(t)]

    def module(m: torch.nn.Module) -> torch.nn.Module:
        if id(m) not in modules:
            dup = copy.copy(m)
            modules[id(m)] = dup
            for name, value in vars(m).items():
                if isinstance(value, torch.Tensor):  # a tensor kept as a plain attribute (a rotary's inv_freq copy)
                    dup.__dict__[name] = tensor(value)
                elif name.startswith(("_forward", "_backward")) and isinstance(value, dict):
                    dup.__dict__[name] = type(value)(value)  # its own hook tables, as `with_replaced` gives
            dup._parameters = {n: None if p is None else tensor(p) for n, p in m._parameters.items()}
            dup._buffers = {n: None if b is None else tensor(b) for n, b in m._buffers.items()}
            dup._modules = {n: None if c is None else module(c) for n, c in m._modules.items()}
        return modules[id(m)]

    return [module(root) for root in roots]
