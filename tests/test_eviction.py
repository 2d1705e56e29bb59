"""The expert cache's replacement policies on hand-built traces with known answers (`specter.eviction`)."""

from __future__ import annotations

import random

import pytest

from specter.eviction import NAMES, make, policies
from specter.offload.cache import ExpertCache
from specter.timing.bounds import belady_loads

LAYER = 0


def _decode(policy: str, passes: list[list[int]], slots: int) -> tuple[int, list[int]]:
    """Serve `passes` (each the experts one target pass needs at layer 0) as the executor does: each pass's resident
    experts used, each missing one copied into a slot (evicting the policy's victim among those the pass does not
    need) and used, or streamed past the cache where every slot holds one the pass needs. Returns the misses and the
    evicted experts in order."""
    future = [{LAYER: tuple(p)} for p in passes]
    cache = ExpertCache((LAYER,), slots, make(policy, future))
    misses, evicted = 0, []
    for position, needed in enumerate(passes):
        cache.new_pass(position)
        for e in needed:
            if (LAYER, e) in cache:
                cache.touch(LAYER, e)
        for e in needed:
            if (LAYER, e) not in cache:
                misses += 1
                if not cache.has_room(LAYER, keep=set(needed)):
                    continue
                victim = cache.victim(LAYER, keep=set(needed))
                evicted += [] if victim is None else [victim]
                cache.insert(LAYER, e, keep=set(needed))
                cache.touch(LAYER, e)
    return misses, evicted


A, B, C, D = 1, 2, 3, 4


def test_the_names_are_the_policies():
    assert tuple(policies()) == NAMES


@pytest.mark.parametrize("policy, victims", [("lru", [A]), ("lfu", [B])])
def test_lfu_keeps_the_expert_used_most_where_lru_keeps_the_last_used(policy, victims):
    """A A A B C with two slots: at C, A was used three times and B last; LRU gives up A, LFU gives up B."""
    assert _decode(policy, [[A], [A], [A], [B], [C]], 2)[1] == victims


@pytest.mark.parametrize("policy, victims", [("lru", [B]), ("least-stale", [A])])
def test_least_stale_evicts_the_first_in_among_the_stale_where_lru_evicts_the_least_recent(policy, victims):
    """A B C A D with three slots: at D every resident expert is stale (used in an earlier pass); Least-Stale gives up
    the first to arrive (A), LRU the least recently used (B)."""
    assert _decode(policy, [[A], [B], [C], [A], [D]], 3)[1] == victims


def test_least_stale_counts_a_prefetch_as_of_its_arrival_and_keeps_the_current_pass():
    """Three slots: A, B, then C copied in ahead of its use (a prefetch, not used) during pass 2, then pass 3 needs B
    and D. A and C are stale (C as of pass 2, its arrival); the first in of them (A) goes, and B, needed by the
    current pass, is never a candidate."""
    cache = ExpertCache((LAYER,), 3, make("least-stale"))
    for position, e in enumerate((A, B)):
        cache.new_pass(position)
        cache.insert(LAYER, e)
        cache.touch(LAYER, e)
    cache.new_pass(2)
    cache.insert(LAYER, C)
    cache.new_pass(3)
    cache.touch(LAYER, B)
    assert cache.victim(LAYER, keep={B, D}) == A
    cache.insert(LAYER, D, keep={B, D})
    assert cache.victim(LAYER, keep={B, D}) == C


@pytest.mark.parametrize("policy, misses, victims", [("lru", 5, [A, B, C]), ("belady", 4, [B, C])])
def test_belady_gives_up_the_expert_needed_furthest_ahead(policy, misses, victims):
    """A B C A B with two slots: at C, A is needed next at 3 and B at 4: Belady gives up B, then misses only B again
    (giving up C, never needed again, before A, least recently used among two never needed again); LRU gives up A
    and misses both."""
    assert _decode(policy, [[A], [B], [C], [A], [B]], 2) == (misses, victims)


def test_belady_gives_up_an_expert_never_needed_again_first():
    assert _decode("belady", [[A], [B], [C], [B], [C]], 2) == (3, [A])


def test_on_random_traces_belady_misses_least_and_no_fewer_than_the_bound():
    """On 300 random traces of one expert a pass, Belady's replacement misses no more than any other policy (it is
    the optimum among policies that copy every miss into a slot), and no fewer than the bound with bypass and a
    cold start (`bounds.belady_loads`, which may also stream an expert without caching it)."""
    rng = random.Random(7)
    for _ in range(300):
        experts, slots = rng.randint(2, 8), rng.randint(1, 4)
        passes = [[rng.randrange(experts)] for _ in range(rng.randint(1, 40))]
        best = _decode("belady", passes, slots)[0]
        assert all(best <= _decode(p, passes, slots)[0] for p in NAMES)
        assert best >= belady_loads([set(p) for p in passes], slots, free_initial=False)


def test_belady_without_a_future_is_refused():
    with pytest.raises(ValueError, match="future"):
        make("belady")


def test_each_policy_runs_under_on_demand_and_specter_and_is_its_own_row_of_the_hit_rate_table(tiny_dirs, tmp_path):
    """On the tiny Mixtral (simulated, 4 of 8 slots), each policy is a `replacement` option of on-demand and Specter;
    Belady misses no more than any other under on-demand; the live engine refuses Belady; the hit_rate table names
    each policy's row."""
    from specter.cli import main
    from specter.quant.quantize import quantize_draft
    from specter.records import read_jsonl
    from specter.report.tables import build_table

    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["mixtral"], draft, method="rtn", bits=4, group_size=32)
    common = ["--model", tiny_dirs["mixtral"], "--dataset", "code", "--hardware", "a100-40gb-pcie4", "--num-prompts",
              "2", "--prefix-tokens", "8", "--max-new-tokens", "16", "--resident-per-layer", "4"]
    out = tmp_path / "hit.jsonl"
    assert main(["sweep", "--systems", "on-demand,specter", "--draft", str(draft), "--k", "2", *common,
                 "--system-option", "replacement=lru,lfu,least-stale,belady", "--out", str(out)]) == 0
    misses: dict[str, int] = {}
    for r in read_jsonl(out):
        if r["system"] == "on-demand":
            replacement = r["config"]["system_settings"]["replacement"]
            misses[replacement] = misses.get(replacement, 0) + r["demand_misses"]
    assert set(misses) == set(NAMES) and misses["belady"] == min(misses.values()), misses
    table = build_table("hit_rate", [out])
    assert {"LRU", "LFU", "Least-Stale", "Belady", "speculative", "speculative, LFU", "speculative, Least-Stale",
            "speculative, Belady"} <= set(table["policy"])
    assert main(["run", "--system", "on-demand", "--system-option", "replacement=belady", "--engine", "live",
                 "--device", "cpu", *common, "--out", str(tmp_path / "live.jsonl")]) == 2


def test_the_policy_simulator_counts_what_the_executors_cache_does():
    """`eviction.hit_rate` (the model card's statistics) and the ExpertCache driven as the executor drives it agree
    hit for hit, for every policy, on random traces of up to three experts a token."""
    from specter.eviction import hit_rate

    rng = random.Random(11)
    for _ in range(200):
        experts, slots, k = rng.randint(3, 9), rng.randint(1, 5), rng.randint(1, 3)
        passes = [rng.sample(range(experts), k) for _ in range(rng.randint(1, 30))]
        needed = sum(len(p) for p in passes)
        for policy in NAMES:
            misses = _decode(policy, passes, slots)[0]
            assert hit_rate([[tuple(p) for p in passes]], slots, policy) == pytest.approx(1 - misses / needed)

