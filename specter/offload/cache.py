"""The device ExpertCache: a fixed number of slots per MoE layer, a replacement policy, protection, events.

Each resident expert occupies one numbered slot (`Slot.index`: the row of the layer's device buffer its weights are
copied into, when a `LiveRuntime` backs the run), and has a `ready` event (its copy landed) and a `last_use` event
(its last compute finished). A copy into a slot waits on the evicted expert's `last_use`, so a slot is never overwritten
while an expert that uses it still runs. Experts prefetched for the coming verification are protected from eviction
until it ends. The cache is one OrderedDict per layer (least recently used first), as Mixtral-Offloading and the Specter
artifact keep theirs; which expert a full layer gives up is its eviction policy's choice (`specter.eviction`:
LRU unless a system is set otherwise).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from specter.eviction import LRU
from specter.timing.engine import Event


@dataclass
class Slot:
    index: int  # which of the layer's slots (0 .. slots_per_layer - 1) holds the expert
    ready: Event | None = None  # the copy that brought the expert in
    last_use: Event | None = None  # the last compute that read it


class ExpertCache:
    def __init__(self, layers: tuple[int, ...], slots_per_layer: int, eviction: LRU | None = None,
                 capacity: dict[int, int] | None = None) -> None:
        """`capacity`: slots of each layer where a system places whole layers (llama.cpp's CPU experts: 0 on a layer
        whose experts stay on the host, every expert on one the device holds); else `slots_per_layer` each."""
        if slots_per_layer < 1:
            raise ValueError(f"slots_per_layer must be >= 1, got {slots_per_layer}")
        self.slots_per_layer = slots_per_layer
        self.capacity = dict(capacity) if capacity is not None else {layer: slots_per_layer for layer in layers}
        if set(self.capacity) != set(layers) or min(self.capacity.values(), default=0) < 0:
            raise ValueError(f"capacity {capacity} must give every layer of {layers} 0 or more slots")
        self.eviction = eviction if eviction is not None else LRU()
        self.entries: dict[int, OrderedDict[int, Slot]] = {layer: OrderedDict() for layer in layers}
        self.protected: dict[int, set[int]] = {layer: set() for layer in layers}

    def __contains__(self, key: tuple[int, int]) -> bool:
        layer, expert = key
        return expert in self.entries[layer]

    def resident(self, layer: int) -> list[int]:
        return list(self.entries[layer])

    def slot(self, layer: int, expert: int) -> Slot:
        return self.entries[layer][expert]

    def touch(self, layer: int, expert: int) -> None:
        """`expert` of `layer` used by the current pass: the most recently used now."""
        self.entries[layer].move_to_end(expert)
        self.eviction.used(layer, expert)

    def new_pass(self, position: int) -> None:
        """A target pass begins at `position` (the tokens before it)."""
        self.eviction.new_pass(position)

    def victim(self, layer: int, keep: set[int] = frozenset()) -> int | None:
        """The expert the eviction policy gives up among those neither protected nor in `keep`; None if the layer has
        a free slot or every slot is pinned."""
        if len(self.entries[layer]) < self.capacity[layer]:
            return None
        return self.eviction.choose(  # a lazy scan: LRU stops at the first candidate, others read them all
            layer, (e for e in self.entries[layer] if e not in self.protected[layer] and e not in keep))

    def has_room(self, layer: int, keep: set[int] = frozenset()) -> bool:
        return len(self.entries[layer]) < self.capacity[layer] or self.victim(layer, keep) is not None

    def insert(self, layer: int, expert: int, keep: set[int] = frozenset()) -> Slot | None:
        """Make room (evicting the policy's victim) and add `expert`; returns the evicted slot (its `last_use` must be
        waited on before the copy), or None if nothing was evicted. Raises if no slot can be freed."""
        evicted = None
        if len(self.entries[layer]) >= self.capacity[layer]:
            victim = self.victim(layer, keep)
            if victim is None:
                raise RuntimeError(f"layer {layer}: every slot is protected or in use")
            evicted = self.entries[layer].pop(victim)
            index = evicted.index
        else:
            index = self._free_index(layer)
        self.entries[layer][expert] = Slot(index)
        self.eviction.inserted(layer, expert)
        return evicted

    def _free_index(self, layer: int) -> int:
        taken = {s.index for s in self.entries[layer].values()}
        return next(i for i in range(self.capacity[layer]) if i not in taken)

    def protect(self, layer: int, experts: set[int]) -> None:
        self.protected[layer] |= experts

    def unprotect_all(self) -> None:
        for s in self.protected.values():
            s.clear()

    def clear(self, layer: int) -> None:
        """Empty a layer's slots (before the run: see `Executor.place`)."""
        self.entries[layer].clear()
        self.protected[layer].clear()

    def fill(self, layer: int, experts: list[int]) -> list[int]:
        """Warm-start a layer with `experts` as far as its slots go, before the run (no copies are scheduled: see
        `Executor.place`); returns the experts placed."""
        placed = [e for e in experts[: self.capacity[layer] - len(self.entries[layer])] if e not in self.entries[layer]]
        for e in placed:
            self.entries[layer][e] = Slot(self._free_index(layer))
            self.eviction.inserted(layer, e)
        return placed
