"""Least frequently used: evict the expert of the layer used in the fewest target passes so far in the prompt's
decode, ties going to the least recently used.

arXiv 2511.05814 ("In-Depth Analysis on Caching and Pre-fetching in MoE Offloading") reports LFU ahead of LRU on
Mixtral's traces; the suite reads its abstract only, which does not say whether a count survives its expert's eviction.
Here it does (the count is of the expert's uses in the decode, resident or not), the form in which frequency is a
property of the routing rather than of the cache's own history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from specter.eviction import LRU


class LFU(LRU):
    name = "lfu"

    def __init__(self, future=None) -> None:
        super().__init__(future)
        self.uses: Counter[tuple[int, int]] = Counter()
        self._counted: set[tuple[int, int]] = set()  # (layer, expert) counted in the current pass
        self._pass = -1

    def used(self, layer: int, expert: int) -> None:
        if self._pass != self.passes:  # one count a pass, however many of its tokens route to the expert
            self._pass, self._counted = self.passes, set()
        if (layer, expert) not in self._counted:
            self._counted.add((layer, expert))
            self.uses[layer, expert] += 1

    def choose(self, layer: int, candidates: Iterable[int]) -> int | None:
        # min keeps the first (least recent) of a tie
        return min(candidates, default=None, key=lambda e: self.uses[layer, e])
