"""A live target layer whose every expert is resident, computed without the host reading its routing.

With every expert in a slot there is nothing to copy, so nothing the host must decide before the experts run: the layer
computes from the router's choices where they are, on the device, as one grouped matrix multiply over the layer's
slots (`torch._grouped_mm`, the kernel transformers' `grouped_mm` experts call; each token's rows sorted by slot, a
group per slot, an empty group reading nothing). The host reads the layer's routing only after the pass, behind the
pass's own argmax read, so it waits for nothing of its own; the executor then books the layer as it books any other
(its hits, the cache's order, each expert's work for the pass's lower bound). The outputs add in each token's expert
order, as the expert-by-expert path adds them.

Where the grouped kernel cannot run (`grouped_ready`: on CUDA it needs bfloat16 slots with 16-byte aligned parts on a
compute capability 8.0 or newer card, as PyTorch's `grouped_mm` says), or a system acts inside the pass (hooks), or an
upstream system's reads are priced (`--pricing upstream` with declared reads), the layer reads its routing first, as
one with experts to copy does.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from specter.timing.engine import COMPUTE, Op

# (the executor and the live runtime are passed in, not imported: each of them imports this module)


def ready(executor, layer: int) -> bool:
    """Whether live target layer `layer` of `executor` (the suite's own executor, not a system's subclass: the caller
    says) computes grouped, its routing read after the pass (module docstring)."""
    return (not executor.hooks and not executor.host_reads_routes
            and executor.work.kernels.host_reads is None
            and len(executor.cache.resident(layer)) == executor.work.experts_per_layer
            and executor.device.grouped_ready(layer))


def schedule(executor, layer: int, n: int, context: int, tag: str) -> None:
    """The layer's attention block, then its experts as one op on the compute stream (after any copy still landing in
    a slot); the pass's work for its lower bound is booked once the routing is read (`account`)."""
    executor._compute(executor._attention(layer, n, context + n, f"{tag}.L{layer}.attn"))
    slots = [executor.cache.slot(layer, e) for e in range(executor.work.experts_per_layer)]
    for slot in slots:
        if slot.ready is not None:
            executor.engine.wait(COMPUTE, slot.ready)
    executor.engine.launch(COMPUTE, executor._with(Op(f"{tag}.L{layer}.experts"), "grouped_experts", layer,
                                                   tuple(slot.index for slot in slots)))
    done = executor.engine.record(COMPUTE)  # one event for every slot the op read
    for slot in slots:
        slot.last_use = done


def account(executor, layer: int, per_token: list[tuple[int, ...]], tag: str) -> list[tuple[int, ...]]:
    """Book a grouped layer once its routing is read: as `Executor.run_experts` books resident experts (hits, the
    cache's order, each expert's work in the pass's ops); returns the routing."""
    tokens = Counter(e for experts in per_token for e in experts)
    used = [e for e in executor.cache.resident(layer) if e in tokens]  # hot-first, in cache order
    for e in used:
        if executor._acc is not None:
            executor._acc.append(executor.work.expert_op(tokens[e], f"{tag}.L{layer}.e{e}"))
        executor.cache.touch(layer, e)
    executor.stats.demand.hit(layer, len(used))
    executor.stats.demand.token_hits += sum(tokens.values())
    return per_token


def supported(runtime) -> bool:
    """Whether `runtime`'s device runs the grouped kernel on its slots (module docstring), checked once."""
    device, dtype = runtime.device, runtime.store.dtype
    if device.type == "cpu":
        return hasattr(torch, "_grouped_mm")
    if device.type != "cuda" or dtype != torch.bfloat16 or torch.cuda.get_device_capability(device) < (8, 0):
        return False
    item = dtype.itemsize
    return (runtime.store.layout.numel * item) % 16 == 0 and all(
        (offset * item) % 16 == 0 and (shape[-1] * item) % 16 == 0 for _, offset, shape in runtime.store.layout.parts)


def experts(runtime, layer: int, slot_of: torch.Tensor, hidden: torch.Tensor, index: torch.Tensor,
            top_k_weights: torch.Tensor) -> torch.Tensor:
    """The layer's routed experts on `hidden` [T, H] routed by `index` [T, k] with `top_k_weights`, from the slots
    (`slot_of` [E]: each expert's slot, on the device), with no host synchronization."""
    tokens, k = index.shape
    buffer = runtime.slots[layer]
    w = {name: buffer[:, offset:offset + math.prod(shape)].unflatten(1, shape)
         for name, offset, shape in runtime.store.layout.parts}
    ranked = index.sort(dim=1)  # each token's experts in id order: the order their outputs add in
    weight = top_k_weights.gather(1, ranked.indices).reshape(-1, 1)
    rows = slot_of[ranked.values.reshape(-1)]  # [T k]: each (token, expert)'s slot
    order = torch.argsort(rows, stable=True)
    counts = torch.zeros(buffer.shape[0], dtype=torch.int32, device=buffer.device)
    offs = counts.scatter_add_(0, rows, torch.ones_like(rows, dtype=torch.int32)).cumsum(0, dtype=torch.int32)
    x, slot = hidden[order // k], rows[order]

    def linear(x: torch.Tensor, name: str) -> torch.Tensor:
        y = torch._grouped_mm(x, w[name].transpose(-2, -1), offs=offs)
        return y + w[f"{name}_bias"][slot] if f"{name}_bias" in w else y

    y = linear(runtime.store.layout.activation(linear(x, "gate"), linear(x, "up")), "down")
    y = torch.empty_like(y).index_copy_(0, order, y)  # back to (token, expert) order
    y = (y * weight).to(hidden.dtype).view(tokens, k, -1)
    out = torch.zeros_like(hidden)
    for j in range(k):
        out += y[:, j]
    return out
