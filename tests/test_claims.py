"""The paper's claims judged (`specter.report.claims`): the registry, the verdict rule, and the table on hand-made
records whose answer is known."""

from __future__ import annotations

import copy

import pytest

from conftest import spec
from specter.errors import SpecterError
from specter.report.claims import BAND, claims_table, registry, verdict
from specter.runs import execute
from specter.runspec import Budget


@pytest.mark.parametrize(("rule", "paper", "low", "high", "expected"), [
    ("value", 2.0, 1.7, 2.4, "reproduced"),  # the whole interval within 0.8-1.25x of 2.0 (1.6 to 2.5)
    ("value", 2.0, 1.6, 2.5, "reproduced"),  # the band's edges belong to it
    ("value", 2.0, 1.0, 1.5, "not reproduced"),  # all of it below the band
    ("value", 2.0, 2.6, 3.0, "not reproduced"),  # all of it above
    ("value", 2.0, 1.5, 1.9, "inconclusive"),  # straddles the lower edge
    ("value", 2.0, 2.2, 2.7, "inconclusive"),  # straddles the upper edge
    ("value", 2.0, 1.0, 3.0, "inconclusive"),  # wider than the band
    ("at_least", 0.9, 0.91, 0.99, "reproduced"),
    ("at_least", 0.9, 0.9, 0.95, "reproduced"),
    ("at_least", 0.9, 0.5, 0.89, "not reproduced"),
    ("at_least", 0.9, 0.85, 0.95, "inconclusive"),
    ("value", 2.0, None, None, "not run"),
    ("at_least", 0.9, float("nan"), float("nan"), "not run"),
])
def test_every_verdict_follows_its_stated_rule(rule, paper, low, high, expected):
    assert BAND == (0.8, 1.25)
    assert verdict(rule, paper, low, high) == expected


def test_the_registry_holds_at_least_twelve_claims_each_with_its_source_and_rows():
    claims = registry()
    assert len(claims) >= 12
    for claim in claims:
        assert claim["source"]["version"] in ("v1", "v2") and claim["source"]["where"]
        assert claim["checked"].strip() and claim["short"].strip()
    ids = {c["id"] for c in claims}
    assert {"v1-phi-max", "v2-mean-mo", "v2-max-mo", "tab3-beats-lru", "tab4-prefetch", "tab4-fused",
            "fig6-same-set", "s45-acceptance", "s3-governor"} <= ids
    assert next(c for c in claims if c["id"] == "v1-phi-max")["checked"].startswith("read in the v1 abstract")


def test_a_claim_naming_a_row_no_paper_file_has_is_refused(monkeypatch):
    import specter.report.claims as claims_module

    real = claims_module.yaml.safe_load

    def with_bad_row(text):
        data = real(text)
        if isinstance(data, dict) and "claims" in data:
            data["claims"][0]["rows"] = ["no-such-row"]
        return data

    monkeypatch.setattr(claims_module.yaml, "safe_load", with_bad_row)
    with pytest.raises(SpecterError, match="rows no-such-row are not calibration rows"):
        registry()


# the table on hand-made records ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def template(tiny_dirs) -> dict:
    """One real record (tiny Mixtral priced at Phi-3.5-MoE's shapes) whose settings the tests below rewrite."""
    record, = execute(spec(model=tiny_dirs["mixtral"], dataset="code", out="", num_prompts=1, prefix_tokens=8,
                           resident_per_layer=1, system="mixtral-offloading", max_new_tokens=5,
                           hardware="a100-40gb-pcie4"), progress=False)
    return record.as_dict()


def _record(template: dict, system: str, tpot_ms: float, prompt: int, budget: dict, **extra) -> dict:
    r = copy.deepcopy(template)
    r.update(system=system, cost_as="phi-3.5-moe", tpot_ms=tpot_ms, prompt_index=prompt, **extra)
    for name in Budget.KINDS.values():
        r["config"][name] = budget.get(name)
    if system == "specter":
        r["k"] = 16
        r["config"].update(k=16, prefetch="adaptive", draft_kernel="fused")
    return r


def _runs(template, mo_tpots, specter_tpot=150.0, acceptance=0.95):
    """Specter at 2 slots a layer of Phi-3.5-MoE's shapes, K 16, and Mixtral-Offloading in its memory, a prompt per
    TPOT of `mo_tpots`."""
    out = []
    for i, mo in enumerate(mo_tpots):
        out.append(_record(template, "specter", specter_tpot, i, {"resident_per_layer": 2},
                           acceptance_rate=acceptance))
        out.append(_record(template, "mixtral-offloading", mo, i, {"same_memory_as": 2}))
    return out


def _claim(table, claim_id):
    return table[table["id"] == claim_id].iloc[0]


def test_a_speedup_with_a_known_answer_gets_its_verdict(template):
    """Mixtral-Offloading at twice Specter's TPOT on every prompt: 2.0x exactly, a zero-width interval, within the
    band of Fig 13's 2.16x (MO-SM) and of the abstract's 2.34x, and outside that of v2's 1.50x."""
    table = claims_table(_runs(template, [300.0] * 5))
    for claim_id, expected in (("fig13-phi-mo-sm", "reproduced"), ("v1-phi-max", "reproduced"),
                               ("v2-mean-mo", "not reproduced")):
        row = _claim(table, claim_id)
        assert row["suite"] == pytest.approx(2.0) and row["low"] == pytest.approx(2.0) == row["high"]
        assert row["verdict"] == expected, claim_id
        assert row["prompts"] == 5 and "phi-3.5-moe shapes" in row["configuration"]
    assert _claim(table, "fig13-qwen-hf")["verdict"] == "not run"
    assert "not run: no records at qwen1.5-moe-a2.7b at 15 slots" in _claim(table, "fig13-qwen-hf")["configuration"]


def test_an_interval_that_straddles_the_band_is_inconclusive(template):
    """Prompts from 1.33x to 2.67x (a mean of 2.0x): the bootstrap interval reaches across 1.875, the upper edge of
    v2's 1.50x band, so that claim is inconclusive, and the interval holds the point."""
    table = claims_table(_runs(template, [200.0, 250.0, 300.0, 350.0, 400.0]))
    row = _claim(table, "v2-mean-mo")
    assert row["low"] < 1.875 < row["high"] and row["low"] <= row["suite"] <= row["high"]
    assert row["suite"] == pytest.approx(2.0)
    assert row["verdict"] == "inconclusive"


def test_an_at_least_claim_and_the_rows_beside_the_headline(template):
    assert _claim(claims_table(_runs(template, [300.0] * 5, acceptance=0.95)), "s45-acceptance")["verdict"] == \
        "reproduced"
    table = claims_table(_runs(template, [300.0] * 5, acceptance=0.5))
    assert _claim(table, "s45-acceptance")["verdict"] == "not reproduced"
    beside = table[table["beside_of"] == "v2-mean-mo"]
    assert set(beside["short"]) == {"on-demand", "naive", "hf-offload", "moe-infinity", "fiddler", "sp-moe"}
    assert (beside["verdict"] == "").all() and beside["suite"].isna().all()  # none of them ran here


def test_the_governor_is_judged_against_every_fixed_k_even_the_one_it_chose(template):
    """The governor's runs at K 32 and the fixed K 32's are equal runs; the claim still sees both: the best fixed K's
    TPOT over the governor's is 1.0 where the governor chose the best K, and under 1 where it chose a slower one."""
    def runs(auto_k, auto_tpot):
        out = []
        for i in range(5):
            for k, tpot in ((2, 200.0), (16, 150.0), (32, 100.0)):
                r = _record(template, "specter", tpot, i, {"resident_per_layer": 2})
                r["k"] = k
                r["config"]["k"] = k
                out.append(r)
            r = _record(template, "specter", auto_tpot, i, {"resident_per_layer": 2})
            r["k"] = auto_k
            r["config"]["k"] = "auto"
            out.append(r)
        return out

    best = _claim(claims_table(runs(32, 100.0)), "s3-governor")
    assert best["suite"] == pytest.approx(1.0) and best["verdict"] == "reproduced"
    slower = _claim(claims_table(runs(2, 200.0)), "s3-governor")
    assert slower["suite"] == pytest.approx(0.5) and slower["verdict"] == "not reproduced"
