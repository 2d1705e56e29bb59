"""The routing statistics of a model card (`specter.models.routing_stats`) on hand-built routes with known answers."""

from __future__ import annotations

import math
import random
import re

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


def test_the_locality_table_sets_each_models_statistics_beside_the_published_figures(tiny_dirs, tmp_path, capsys):
    """`specter routing-stats` measures a checkpoint without a model card on held-out text, and takes a card's own
    statistics where it holds every measure; its rows (repeat measures at three depths and their mean, hit rates by
    slots, means over layers) stand beside the published rows, each with its source and how it was read; statistics
    lacking a measure are refused naming the fix; the figure draws."""
    import json
    import shutil

    from specter.cli import main
    from specter.errors import SpecterError
    from specter.report.figures import plot
    from specter.report.locality import routing_locality_table

    out = tmp_path / "tiny.json"
    assert main(["routing-stats", "--model", tiny_dirs["mixtral"], "--out", str(out), "--threads", "1"]) == 0
    stats = json.loads(out.read_text())
    assert stats["measured_from"] == "the checkpoint" and "8 held-out windows" in stats["routing"]["text"]
    table = routing_locality_table([out])
    mine = table[table["read_in"] == "computed"]
    first = mine[(mine["statistic"] == "repeat_first_choice") & (mine["depth"] == "first")]
    assert float(first["value"].iloc[0]) == pytest.approx(stats["routing"]["repeat_first_choice"][0])
    assert set(mine["depth"]) == {"first", "middle", "last", "mean"}
    assert set(mine.loc[mine["statistic"] == "lfu_hit_rate", "slots"]) == {
        int(s) for s in stats["routing"]["lfu_hit_rate"]}
    mixtral = table[(table["model"] == "mixtral-8x7b") & (table["statistic"] == "repeat_any_choice")]
    assert len(mixtral) == 24 and set(mixtral["read_in"]) == {"transcription"}
    wiki = mixtral[(mixtral["text"] == "Wikipedia (en)") & (mixtral["depth"] == "middle")]
    assert float(wiki["value"].iloc[0]) == pytest.approx(0.621)
    table3 = table[table["model"] == "deepseek-v2-lite"].set_index("slots")["value"]
    assert dict(table3) == pytest.approx({6: 0.292, 16: 0.5094, 32: 0.7656})
    plot("routing_locality", table, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000

    carded = tmp_path / "carded"  # a card holding every measure: its statistics are taken, nothing is measured
    shutil.copytree(tiny_dirs["mixtral"], carded)
    from specter.models.integrity import model_hash

    card = {"name": "carded", "stands_in_for": "mixtral-8x7b", "routing": {**stats["routing"], "text": "the card's"}}
    (carded / "model_card.json").write_text(json.dumps(card))  # no weights' hash: nothing vouches for the card
    assert main(["routing-stats", "--model", str(carded), "--out", str(tmp_path / "c.json")]) == 0
    assert json.loads((tmp_path / "c.json").read_text())["measured_from"] == "the checkpoint"
    (carded / "model_card.json").write_text(json.dumps({**card, "weights_sha256": model_hash(carded)}))
    assert main(["routing-stats", "--model", str(carded), "--out", str(tmp_path / "c.json")]) == 0
    taken = json.loads((tmp_path / "c.json").read_text())
    assert taken["measured_from"] == "model card" and taken["routing"]["text"] == "the card's"
    assert taken["stands_in_for"] == "mixtral-8x7b"
    with pytest.raises(SpecterError, match="both give the routing statistics of 'tiny-mixtral'|both give the routing"):
        routing_locality_table([out, out])
    del stats["routing"]["lfu_hit_rate_mean"]
    out.write_text(json.dumps(stats))
    with pytest.raises(SpecterError, match="lacks the routing measures lfu_hit_rate_mean"):
        routing_locality_table([out])


def _edited(stats: dict, edit) -> dict:
    import copy

    stats = copy.deepcopy(stats)
    edit(stats["routing"], stats)
    return stats


@pytest.mark.parametrize("edit, message", [
    (lambda r, s: r["lru_hit_rate_mean"].update({"2": 1.7}), "lru_hit_rate_mean at 2 slots is 1.7"),
    (lambda r, s: r.update(repeat_any_choice=[3.0] * len(r["layers"])), "outside [0, 1]"),
    (lambda r, s: r.update(repeat_first_choice=[1.0] * len(r["layers"]), repeat_any_choice=[0.5] * len(r["layers"])),
     "a first-choice repeat rate above the any-expert one"),
    (lambda r, s: r.update(routing_entropy_share=[5] * len(r["layers"])), "outside [0, 1]"),
    (lambda r, s: r.update(load_balance_max_over_mean=[0.1] * len(r["layers"])), "load over the mean outside"),
    (lambda r, s: (r["lru_hit_rate"].update({"-3": r["lru_hit_rate"]["1"]}),
                   r["lru_hit_rate_mean"].update({"-3": 0.1})), "slot counts"),
    (lambda r, s: (r["lru_hit_rate"].update({"6": [0.0] * len(r["layers"])}),
                   r["lru_hit_rate_mean"].update({"6": 0.0})), "an LRU hit rate that falls from 4 to 6 slots"),
    (lambda r, s: (r["lfu_hit_rate"].update({"6": [0.0] * len(r["layers"])}),
                   r["lfu_hit_rate_mean"].update({"6": 0.0})), "an LFU hit rate that falls from 4 to 6 slots"),
    (lambda r, s: r["lru_hit_rate_mean"].update({"1": 0.99}), "not its layers' mean"),
    (lambda r, s: r.update(layers=r["layers"][:1]), "values for 1 layers"),
    (lambda r, s: r["random_routing"].update(repeat_first_choice=0.9), "random_routing that is not uniform routing's"),
    (lambda r, s: s.update(model=["a"]), "model is ['a'], not a name"),
    (lambda r, s: s.update(model="tiny|x"), "model is 'tiny|x', not a name (printable, without '|'"),
    (lambda r, s: r.update(experts="8"), "experts '8'"),
    (lambda r, s: r.update(experts=4), "random_routing that is not uniform routing's over its 4 experts"),
    (lambda r, s: r.update(routing_entropy_share=[min(1.0, v + 1e-3) for v in r["routing_entropy_share"]]),
     "routing_entropy_share is not routing_"),
    (lambda r, s: r.update(routing_entropy_share=[0.1] * len(r["layers"])), "a routing entropy below what its busiest"),
    (lambda r, s: r.update(load_balance_max_over_mean=[r["experts"]] * len(r["layers"])),
     "a busiest expert's load over the mean outside 1 to 4"),
    (lambda r, s: (r["lru_hit_rate"].update({"1": [0.9] * len(r["layers"])}),
                   r["lru_hit_rate_mean"].update({"1": 0.9})), "lru_hit_rate at 1 slots above 1/2"),
    (lambda r, s: r.update(token_to_token_reuse=[0.0] * len(r["layers"])), "token_to_token_reuse outside"),
    (lambda r, s: r.update(routing_entropy_bits=[3.5] * len(r["layers"])), "routing_entropy_share is not routing_"),
    (lambda r, s: r.update(layers=[0] * len(r["layers"])), "not distinct layer numbers in order (entry 1 is 0)"),
    (lambda r, s: r.update(set_change_rate=[1.5] * len(r["layers"])), "set_change_rate is not a share"),
    (lambda r, s: r.update(text="two\nlines"), "a text that is not one line"),
    (lambda r, s: r.update(text="two\u2028lines"), "a text that is not one line of printable characters"),
], ids=["hit_rate_above_one", "repeat_above_one", "first_above_any", "entropy_above_one", "load_below_one",
        "slots_negative", "lru_not_monotone", "lfu_not_monotone", "mean_not_the_layers", "layers_short",
        "random_baseline_wrong", "model_not_a_name", "model_with_a_bar", "experts_not_a_count", "experts_changed",
        "entropy_share_not_its_bits", "entropy_below_the_busiest_load", "load_past_e_over_k", "lru_past_slots_over_k",
        "reuse_below_any_over_k", "entropy_bits_past_log2", "layers_repeated", "set_change_above_one",
        "text_two_lines", "text_line_separator"])
def test_routing_statistics_no_routing_gives_are_refused(edit, message, tiny_dirs, tmp_path):
    """Each impossible edit of a model's routing statistics is one SpecterError naming what is wrong."""
    import json

    from specter.cli import main
    from specter.errors import SpecterError
    from specter.report.locality import routing_locality_table

    out = tmp_path / "stats.json"
    assert main(["routing-stats", "--model", tiny_dirs["mixtral"], "--out", str(out), "--threads", "1"]) == 0
    stats = json.loads(out.read_text())
    routing_locality_table([out])  # as written: accepted
    out.write_text(json.dumps(_edited(stats, edit)))
    with pytest.raises(SpecterError, match=re.escape(message)):
        routing_locality_table([out])


def _slow_and_fast(windows: int = 64, length: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Router inputs [windows * length, 8]: four dimensions a window keeps (a random level per window with a small
    drift), four drawn afresh at every token; and their changes between consecutive tokens within each window."""
    g = torch.Generator().manual_seed(seed)
    slow = torch.randn(windows, 1, 4, generator=g) + 0.05 * torch.randn(windows, length, 4, generator=g).cumsum(1)
    fast = torch.randn(windows, length, 4, generator=g)
    x = torch.cat([slow, fast], dim=-1)
    return x.reshape(-1, 8), (x[:, 1:] - x[:, :-1]).reshape(-1, 8)


def _first_choice_repeats(router: torch.Tensor, u: torch.Tensor, length: int = 32) -> float:
    first = (u @ router.T).argmax(-1).reshape(-1, length)
    return float((first[:, 1:] == first[:, :-1]).double().mean())


def test_the_locality_setting_moves_how_often_consecutive_tokens_keep_their_expert():
    """On inputs with known slow and fast parts, a router reading both keeps its first choice between consecutive
    tokens more often as the setting rises above 0 and less often below it; at 0 the router is unchanged."""
    from specter.models.moefy import _set_locality

    u, du = _slow_and_fast()
    router = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_set_locality(router, u, du, 0.0), router, atol=1e-5)
    rates = [_first_choice_repeats(_set_locality(router, u, du, s), u) for s in (-4.0, -1.0, 0.0, 1.0, 4.0)]
    # far below 0 the router reads the fast part alone, whose tokens are independent draws: -4 and -1 differ by noise
    assert rates[1] < rates[2] < rates[3] < rates[4] and rates[4] > 0.9 and max(rates[:2]) < 0.3, rates


@pytest.mark.parametrize("value", ["nan", "inf", "-51"])
def test_a_locality_setting_out_of_range_is_refused_naming_it(value):
    from specter.errors import SpecterError
    from specter.models.proxies import proxy_config

    with pytest.raises(SpecterError, match=r"--set locality=.*must be a number from -50.0 to 50.0"):
        proxy_config("smollm2-moe", overrides={"locality": value})


@pytest.mark.parametrize("key, value, what", [("locality", "1_0", "number"), ("locality", "\uff11", "number"),
                                              ("distill_steps", "3_0", "whole number")])
def test_a_build_setting_is_read_in_ascii_digits_only(key, value, what):
    """Python's number parsers take `1_0` and other scripts' digits; a build setting names its value as typed."""
    from specter.errors import SpecterError
    from specter.models.proxies import proxy_config

    with pytest.raises(SpecterError, match=re.escape(f"--set {key}={value!r}: not a {what} (in ASCII digits)")):
        proxy_config("smollm2-moe", overrides={key: value})


def test_a_matched_proxy_is_its_proxy_with_the_locality_its_statistic_chose():
    """Each matched proxy builds as the proxy it names, with its own setting, and its statistic selects published rows
    of the model that proxy stands in for."""
    from specter.models.proxies import MATCHED, PROXIES, matched_to, proxy_config
    from specter.presets import routing_published

    sources, rows = routing_published()
    for name, (base, locality, selector) in MATCHED.items():
        assert PROXIES[name] == PROXIES[base] and locality != 0
        cfg, plain = proxy_config(name), proxy_config(base)
        assert cfg.locality == locality and plain.locality == 0 and (cfg.experts, cfg.top_k) == (plain.experts,
                                                                                                  plain.top_k)
        assert matched_to(name, cfg) == selector and matched_to(base, plain) is None
        assert matched_to(name, proxy_config(name, overrides={"locality": "0"})) is None  # another setting
        chosen = [r for r in rows if all(r.get(k) == v for k, v in selector.items())]
        assert chosen and {sources[r["source"]]["model"] for r in chosen} == {PROXIES[name][3]}


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_lru_and_lfu_never_hit_less_with_more_slots(policy):
    """Both are stack algorithms (each expert's priority depends on the trace, not on the cache's size), which the
    locality table's check of routing statistics relies on: on random traces, more slots never hit less."""
    rng = random.Random(0)
    for _ in range(400):
        experts, k = rng.randint(3, 8), rng.randint(1, 2)
        seqs = [[tuple(rng.sample(range(experts), k)) for _ in range(rng.randint(5, 30))] for _ in range(2)]
        rates = [hit_rate(seqs, s, policy) for s in range(k, experts)]
        assert all(b >= a for a, b in zip(rates, rates[1:])), (seqs, rates)


def test_a_cards_locality_checks_set_each_published_figure_beside_the_models_own():
    """Each published statistic of the model a proxy stands in for, its mean, range and count over texts, beside the
    proxy's value at the same depth or slots; the matched statistic is marked, the rest held out."""
    from specter.models.routing_stats import locality_checks

    routing = {"repeat_first_choice": [0.1, 0.2, 0.3, 0.4], "repeat_any_choice": [0.5, 0.6, 0.7, 0.8],
               "lru_hit_rate_mean": {"6": 0.25, "16": 0.5}}
    mixtral = locality_checks(routing, "mixtral-8x7b", {"source": "mixtral-table5",
                                                        "statistic": "repeat_first_choice", "depth": "middle"})
    middle = next(c for c in mixtral if c["statistic"] == "repeat_first_choice" and c["depth"] == "middle")
    assert middle["role"] == "matched" and middle["model"] == 0.2 and middle["texts"] == 8  # layer (4 - 1) // 2
    assert middle["published_min"] <= middle["published_mean"] <= middle["published_max"]
    last = next(c for c in mixtral if c["statistic"] == "repeat_any_choice" and c["depth"] == "last")
    assert last["role"] == "held out" and last["model"] == 0.8
    assert {c["role"] for c in mixtral} == {"matched", "held out"} and len(mixtral) == 6
    deepseek = {c["slots"]: c for c in locality_checks(routing, "deepseek-v2-lite")}
    assert deepseek[16]["model"] == 0.5 and deepseek[16]["published_mean"] == 0.5094 and deepseek[32]["model"] is None
    assert {c["role"] for c in deepseek.values()} == {"compared"}
    assert locality_checks(routing, "phi-3.5-moe") == []


@pytest.mark.parametrize("source, edit, card, message", [
    ("mixtral", lambda r: r.update(repeat_first_choice=[1.5] * len(r["layers"])), {}, "outside [0, 1]"),
    ("olmoe", lambda r: None, {}, "and the checkpoint routes top-2 of 8 over"),
    ("mixtral", lambda r: None, {"name": "smollm2-moe", "stands_in_for": "deepseek-v2-lite"},
     "stands_in_for 'deepseek-v2-lite', and smollm2-moe stands in for 'mixtral-8x7b'"),
], ids=["share_past_one", "another_models_statistics", "a_proxy_standing_in_for_another_model"])
def test_a_vouched_cards_statistics_are_checked_before_they_are_written(source, edit, card, message, tiny_dirs,
                                                                        tmp_path, capsys):
    """A card whose weights' hash vouches for it but whose routing statistics no routing gives, that the checkpoint
    contradicts (another model's: its experts, top-k, MoE layers), or that names a proxy standing in for another model
    than that proxy's, is refused by `routing-stats` in one line, and nothing is written."""
    import json
    import shutil

    from specter.cli import main
    from specter.models.integrity import model_hash

    out = tmp_path / "stats.json"
    assert main(["routing-stats", "--model", tiny_dirs[source], "--out", str(out), "--threads", "1"]) == 0
    routing = json.loads(out.read_text())["routing"]
    edit(routing)
    carded = tmp_path / "carded"
    shutil.copytree(tiny_dirs["mixtral"], carded)
    (carded / "model_card.json").write_text(json.dumps({"name": "carded", "stands_in_for": "mixtral-8x7b", **card,
                                                        "routing": routing, "weights_sha256": model_hash(carded)}))
    capsys.readouterr()
    assert main(["routing-stats", "--model", str(carded), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not (tmp_path / "c.json").exists(), err
