"""The routing statistics of a model card (`specter.models.routing_stats`) on hand-built routes with known answers."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specter.eviction import hit_rate
from specter.models.routing_stats import lru_hit_rate, repeat_rates, reuse_distances

A, B, C = 0, 1, 2


def test_reuse_distance_counts_the_distinct_experts_in_between():
    assert reuse_distances([[(A,), (B,), (A,)]]) == [1]
    assert reuse_distances([[(A,), (B,), (C,), (B,), (A,)]]) == [1, 2]
    assert reuse_distances([[(A,), (A,)], [(A,)]]) == [0]  # each sequence starts cold


def test_at_one_expert_a_token_lru_hits_exactly_the_uses_nearer_than_its_slots():
    """LRU's stack property: with S slots, a use hits exactly when its reuse distance is below S."""
    rng = random.Random(3)
    for _ in range(100):
        seqs = [[(rng.randrange(6),) for _ in range(rng.randint(1, 30))] for _ in range(rng.randint(1, 3))]
        uses = sum(len(s) for s in seqs)
        distances = reuse_distances(seqs)
        for slots in (1, 2, 3, 5):
            want = sum(d < slots for d in distances) / uses
            assert lru_hit_rate(seqs, slots) == pytest.approx(want)
            assert hit_rate(seqs, slots, "lru") == pytest.approx(want)


def test_repeat_rates_are_the_mixtral_papers_two_measures():
    """First choices 0, 0, 3: one of two pairs keeps it; sets {0, 1}, {0, 2}, {3, 1}: one of two pairs shares one."""
    idx = torch.tensor([[[0, 1], [0, 2], [3, 1]]])
    assert repeat_rates(idx) == (0.5, 0.5)
    assert repeat_rates(torch.tensor([[[1, 0], [0, 1]]])) == (0.0, 1.0)  # same set, other first choice


def test_a_models_card_statistics_hold_the_locality_measures(tiny_dirs):
    from specter.models.loading import load_moe_model
    from specter.models.routing_stats import routing_statistics

    moe = load_moe_model(tiny_dirs["mixtral"])
    stats = routing_statistics(moe, torch.randint(0, 100, (3, 24), generator=torch.Generator().manual_seed(0)))
    experts, k = moe.moe_layers[0].num_experts, moe.moe_layers[0].top_k
    assert stats["random_routing"] == {"repeat_first_choice": 1 / experts,
                                       "repeat_any_choice": 1 - math.comb(experts - k, k) / math.comb(experts, k)}
    layers = len(stats["layers"])
    for name in ("repeat_first_choice", "repeat_any_choice", "reuse_distance_mean"):
        assert len(stats[name]) == layers
    assert all(0 <= v <= 1 for v in stats["repeat_first_choice"] + stats["repeat_any_choice"])
    assert set(stats["lfu_hit_rate"]) == set(stats["lru_hit_rate"]) and all(
        0 <= v <= 1 for rates in stats["lfu_hit_rate"].values() for v in rates)
