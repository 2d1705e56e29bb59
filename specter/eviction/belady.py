"""Belady's optimal replacement (MIN): evict the expert whose next use lies furthest ahead, one never used again
first, ties going to the least recently used.

The future is the prompt's recorded decode: its routes by position (the prompt's, then each committed token's), read
from the current pass's first position on. On one token a pass (on-demand) this is the classic bound: no policy misses
less on the trace. Under speculation it looks ahead along the committed tokens, not along a verification's rejected
proposals. A live run does not know its decode in advance, so the policy runs in the simulator only.
"""

from __future__ import annotations

from collections.abc import Iterable

from specter.eviction import LRU


class Belady(LRU):
    name = "belady"
    reads_future = True

    def __init__(self, future=None) -> None:
        super().__init__(future)
        if future is None:
            raise ValueError("belady reads the decode's future routes, and none were given")
        self.future = list(future)

    def next_use(self, layer: int, expert: int) -> float:
        """The first position at or after the current pass's that routes to `expert` of `layer` (inf: none)."""
        for position in range(self.position, len(self.future)):
            if expert in self.future[position].get(layer, ()):
                return position
        return float("inf")

    def choose(self, layer: int, candidates: Iterable[int]) -> int | None:
        # max keeps the first (least recent) of a tie
        return max(candidates, default=None, key=lambda e: self.next_use(layer, e))
