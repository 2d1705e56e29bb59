"""Which resident expert a full layer of the `ExpertCache` gives up: its eviction policy.

A policy sees every use of an expert (`used`), every expert put in a slot (`inserted`) and the start of every target
pass (`new_pass`, with the pass's first position), and chooses a victim among the experts the cache may evict (those
neither protected nor needed by the pass at hand), given least recently used first. `LRU` is the policy of
Mixtral-Offloading, of the Specter artifact and of every system by default; the others are the field's:
- `lfu` (`lfu.py`): the least frequently used;
- `least-stale` (`least_stale.py`): SpecMD's, an expert last used in an earlier pass before one of the current pass;
- `belady` (`belady.py`): the expert next used furthest ahead in the recorded decode, the bound a policy can reach.
"""

from __future__ import annotations

from collections.abc import Sequence


class LRU:
    """Least recently used: the first candidate (the cache keeps its experts in order of use)."""

    name = "lru"
    #: whether the policy reads the decode's future routes (`PromptTrace`), which a live run does not know in advance
    reads_future = False

    def __init__(self, future: Sequence[dict] | None = None) -> None:
        self.position = 0  # the first position of the current target pass
        self.passes = 0  # target passes begun

    def new_pass(self, position: int) -> None:
        self.position = position
        self.passes += 1

    def used(self, layer: int, expert: int) -> None:
        """`expert` of `layer` computed for the current pass."""

    def inserted(self, layer: int, expert: int) -> None:
        """`expert` of `layer` copied into a slot (for the current pass, or prefetched for a coming one)."""

    def choose(self, layer: int, candidates: list[int]) -> int:
        """The victim among `candidates` (non-empty, least recently used first)."""
        return candidates[0]


def policies() -> dict[str, type[LRU]]:
    """Every eviction policy by name."""
    from specter.offload.eviction.belady import Belady
    from specter.offload.eviction.least_stale import LeastStale
    from specter.offload.eviction.lfu import LFU

    return {p.name: p for p in (LRU, LFU, LeastStale, Belady)}


#: the policies' names, for options and flags (kept equal to `policies()` by a test)
NAMES = ("lru", "lfu", "least-stale", "belady")

#: the `replacement` system option of the systems that take another policy than LRU
OPTION = {"replacement": (str, "lru", "the expert cache's replacement policy: lru (the paper's and its artifact's), "
                                      "lfu, least-stale (SpecMD's) or belady (the optimum on the recorded decode; "
                                      "simulator only)", NAMES)}


def make(name: str, future: Sequence[dict] | None = None) -> LRU:
    """The policy `name`; `future`: the decode's routes by position ({MoE layer: experts}), for a policy that reads
    them."""
    return policies()[name](future)
