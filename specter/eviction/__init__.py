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

from collections import OrderedDict
from collections.abc import Iterable, Sequence


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

    def choose(self, layer: int, candidates: Iterable[int]) -> int | None:
        """The victim among `candidates` (least recently used first), or None where there is none."""
        return next(iter(candidates), None)


def policies() -> dict[str, type[LRU]]:
    """Every eviction policy by name."""
    from specter.eviction.belady import Belady
    from specter.eviction.least_stale import LeastStale
    from specter.eviction.lfu import LFU

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


def hit_rate(sequences: Sequence[Sequence[tuple[int, ...]]], slots: int, policy: str) -> float:
    """The share of the experts each token needs that one layer's cache of `slots` already holds under `policy`, cold
    at each sequence's start, a token a pass: its missing experts copied in, each evicting the policy's victim among
    the experts the token does not need (where every slot holds one it needs, the expert streams past the cache), as
    the executor's on-demand loading does (`specter.offload.cache.ExpertCache`)."""
    hits = needed = 0
    for seq in sequences:
        chooser = make(policy, [{0: experts} for experts in seq])
        resident: OrderedDict[int, None] = OrderedDict()
        for position, experts in enumerate(seq):
            chooser.new_pass(position)
            need = set(experts)
            for e in experts:
                needed += 1
                if e in resident:
                    hits += 1
                    resident.move_to_end(e)
                    chooser.used(0, e)
            for e in [e for e in experts if e not in resident]:
                if len(resident) >= slots:
                    victim = chooser.choose(0, [x for x in resident if x not in need])
                    if victim is None:
                        continue
                    del resident[victim]
                resident[e] = None
                chooser.inserted(0, e)
                chooser.used(0, e)
    return hits / needed if needed else 0.0
