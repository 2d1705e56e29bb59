"""Least-Stale (SpecMD, arXiv 2602.03921): evict an expert last used in an earlier target pass before any expert of
the current pass, first in first out within each of the two groups.

An expert put in a slot and not yet used (a prefetch for the coming verification) counts as of the pass it arrived
in. Within the stale group the order is that of arrival in the cache, not of last use: that is where the policy departs
from LRU, which at one token a pass orders the same two groups by last use.
"""

from __future__ import annotations

from collections.abc import Iterable

from specter.eviction import LRU


class LeastStale(LRU):
    name = "least-stale"

    def __init__(self, future=None) -> None:
        super().__init__(future)
        self.last_pass: dict[tuple[int, int], int] = {}
        self.arrival: dict[tuple[int, int], int] = {}
        self._arrivals = 0

    def used(self, layer: int, expert: int) -> None:
        self.last_pass[layer, expert] = self.passes

    def inserted(self, layer: int, expert: int) -> None:
        self._arrivals += 1
        self.arrival[layer, expert] = self._arrivals
        self.last_pass[layer, expert] = self.passes

    def choose(self, layer: int, candidates: Iterable[int]) -> int | None:
        def key(e: int) -> tuple[bool, int]:
            return self.last_pass.get((layer, e), -1) >= self.passes, self.arrival.get((layer, e), 0)

        return min(candidates, default=None, key=key)
