"""Device slots: the expert slots per MoE layer, the staging buffers, and the copies into and out of them, as the live
engine (`specter.offload.live.LiveRuntime`) holds them on its device; and the device-memory check it makes first.

- a copy of expert e into slot s of layer l: `slots[l][s].copy_(store[l][e], non_blocking=True)` from the host
  `ExpertStore` (page-locked on a GPU), on the copy stream; a slot is a row of one `[slots, numel]` buffer per MoE
  layer at the store's dtype, allocated once;
- a write-back of slot s (Mixtral-Offloading's swap): the slot's row copied, non-blocking, into a host row kept for
  it (the store itself is never written: its rows are the experts' weights).

`check=True` makes every expert kernel assert that the buffer it reads holds the expert it was asked for (tests run
this on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specter.errors import SpecterError
from specter.offload.memory import STAGING_BUFFERS
from specter.offload.store import ExpertStore
from specter.offload.work import ModelWork


class ExpertSlots:
    """Expert slots per MoE layer, staging buffers and the copies into and out of them (the base of
    `specter.offload.live.LiveRuntime`). A slot is a row of one `[slots, numel]` buffer per MoE layer at the store's
    dtype, allocated once. `check=True` makes every expert kernel assert that the buffer it reads holds the expert it
    was asked for."""

    def __init__(self, work: ModelWork, store: ExpertStore, slots_per_layer: int | dict[int, int], device: str,
                 check: bool = False) -> None:
        """`slots_per_layer`: slots in every MoE layer, or each layer's (a system placing whole layers)."""
        self.device = torch.device(device)
        self.work, self.store, self.check = work, store, check
        dev, dt, numel = self.device, store.dtype, store.layout.numel
        rows = slots_per_layer if isinstance(slots_per_layer, dict) else dict.fromkeys(work.moe_layers, slots_per_layer)
        self.slots = {layer: torch.zeros(rows[layer], numel, dtype=dt, device=dev) for layer in work.moe_layers}
        self.slot_holds: dict[tuple[int, int], int] = {}  # (layer, slot) -> expert, kept for `check`
        self.staging = torch.zeros(STAGING_BUFFERS, numel, dtype=dt, device=dev)
        self.staging_holds: dict[int, tuple[int, int]] = {}
        self.host_back = torch.zeros(numel, dtype=dt, pin_memory=self.device.type == "cuda")  # where write-backs land

    def _holds(self, layer: int, index: int, expert: int, when: str = "") -> None:
        if self.check and self.slot_holds.get((layer, index)) != expert:
            raise AssertionError(f"L{layer} slot {index} holds expert {self.slot_holds.get((layer, index))}, "
                                 f"not {expert}{when}")

    def _staged(self, index: int, layer: int, expert: int) -> None:
        if self.check and self.staging_holds.get(index) != (layer, expert):
            raise AssertionError(f"staging {index} holds {self.staging_holds.get(index)}, not L{layer} e{expert}")

    def copy_to_slot(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        def fn() -> None:
            self.slots[layer][index].copy_(self.store.row(layer, expert), non_blocking=True)
            self.slot_holds[layer, index] = expert
        return fn

    def copy_to_host(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        """Copy slot `index` of `layer` (holding `expert`) back to the host."""
        def fn() -> None:
            self._holds(layer, index, expert, " at its write-back")
            self.host_back.copy_(self.slots[layer][index], non_blocking=True)
        return fn

    def staging_rows(self, count: int) -> None:
        """At least `count` staging buffers (a system that streams a whole layer through needs one per expert)."""
        if count > self.staging.shape[0]:
            self.staging = torch.zeros(count, self.store.layout.numel, dtype=self.store.dtype, device=self.device)

    def copy_to_staging(self, layer: int, expert: int, index: int) -> Callable[[], None]:
        def fn() -> None:
            self.staging[index].copy_(self.store.row(layer, expert), non_blocking=True)
            self.staging_holds[index] = (layer, expert)
        return fn

    def place(self, layer: int, expert: int, index: int) -> None:
        """Put `expert` in slot `index` before the run starts (resident and statically placed experts)."""
        self.slots[layer][index].copy_(self.store.row(layer, expert))
        self.slot_holds[layer, index] = expert


def require_device_memory(device: torch.device, parts: dict[str, int]) -> None:
    """Refuse, before anything is allocated, a run whose device buffers (`parts`: {what: bytes}) exceed the device's
    free memory (`torch.cuda.mem_get_info`), in one line that names each part; nothing is checked off CUDA."""
    if device.type != "cuda":
        return
    free, total = torch.cuda.mem_get_info(device)
    need = sum(parts.values())
    if need > free:
        def size(n: float) -> str:
            return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"

        listed = ", ".join(f"{what} {size(n)}" for what, n in sorted(parts.items(), key=lambda p: -p[1]))
        raise SpecterError(f"the run needs {size(need)} on {device} ({listed}), and {size(free)} of its "
                           f"{size(total)} are free; lower --resident-per-layer or the prompt and output lengths, or "
                           "free the device")
