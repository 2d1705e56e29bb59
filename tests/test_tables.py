"""Every run-record table recomputed from the raw records through the one definition of each metric
(`specter.metrics`), independently of the aggregation in `specter.report.tables`: they match, row by row."""

from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from conftest import spec
from specter import experiments, metrics
from specter.errors import SpecterError
from specter.quant.quantize import quantize_draft
from specter.report.frames import records_frame
from specter.report.tables import derive, experiment_table
from specter.runs import grid, sweep
from specter.runspec import Arm, Budget

ARCH = "olmoe"


@pytest.fixture(scope="module")
def records(tiny_dirs, tmp_path_factory) -> list[dict]:
    """One sweep whose records every stats table can read: systems that speculate and not, two K, both comparisons,
    greedy and sampled, arms and options."""
    draft = tmp_path_factory.mktemp("tables_draft") / ARCH
    quantize_draft(tiny_dirs[ARCH], draft, method="rtn", bits=4, group_size=32)
    base = spec(system="on-demand", model=tiny_dirs[ARCH], draft=str(draft), dataset="code",
                hardware="a100-40gb-pcie4", out="", num_prompts=3, prefix_tokens=16, max_new_tokens=14,
                resident_per_layer=2, k=2)
    specs = grid(base, {"system": ["on-demand", "specter", "specter-oracle"], "k": [2, 4], "temperature": [0.0, 1.0],
                        "budget": [Budget("slots", 2), Budget("same_memory", 2)]},
                 {"noise": ["0.0", "0.5"]},
                 [Arm.parse("full"), Arm.parse("no prefetch:prefetch=none,draft-kv=copied")])
    out = tmp_path_factory.mktemp("tables") / "records.jsonl"
    sweep(specs, out, progress=False)
    return [json.loads(line) for line in out.read_text().splitlines()]


def _recomputed(rs: list[dict]) -> dict:
    """A table row's metrics from its raw records, through specter.metrics."""
    def mean(values):
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    counts = [r["extra"]["counts"] for r in rs]
    tpots = [metrics.tpot_seconds([t / 1e3 for t in r["extra"]["commit_ms"]]) * 1e3 for r in rs]
    spec_counts = [c for c in counts if c["proposed"]]
    return {
        "tpot_ms": mean(tpots), "ttft_ms": mean([r["extra"]["commit_ms"][0] for r in rs]),
        "tpot_ms_median": statistics.median(tpots), "tpot_ms_p90": float(np.quantile(tpots, 0.9)),
        "tpot_ms_p99": float(np.quantile(tpots, 0.99)), "tpot_ms_min": min(tpots), "tpot_ms_max": max(tpots),
        "hit_rate": mean([metrics.hit_rate(r["demand_hits"], r["demand_misses"]) for r in rs]),
        "acceptance_rate": mean([metrics.acceptance_rate(c["accepted"], c["checked"]) for c in spec_counts]),
        "window_utilization": mean([metrics.window_utilization(c["accepted"], c["proposed"]) for c in spec_counts]),
        "window_recall": mean([metrics.share(c["window_hits"], c["window_needed"]) for c in spec_counts]),
        "window_working_set": mean([metrics.share(c["window_needed"], c["window_layers"]) for c in spec_counts]),
        "hit_rate_pass": mean([metrics.hit_rate(c["decode_hits"], c["decode_misses"]) for c in counts]),
        "hit_rate_token": mean([metrics.hit_rate(c["decode_token_hits"], c["decode_token_misses"]) for c in counts]),
        "prefetch_precision": mean([metrics.share(c["window_hits"], c["window_placed"]) for c in counts]),
        "prefetch_recall": mean([metrics.share(c["window_hits"], c["window_needed"]) for c in spec_counts]),
        "demand_misses": sum(r["demand_misses"] for r in rs), "n": len(rs),
    }


def _same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b is None or (isinstance(b, float) and math.isnan(b))
    return b is not None and math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)


STATS_TABLES = [name for name, e in experiments.EXPERIMENTS.items() if e.table.kind == "stats"]


def _as_its_sweep(name: str, records: list[dict]) -> list[dict]:
    """The records experiment `name`'s own sweep would hold: of the fixture's runs, one a table row (the first), as a
    sweep over the experiment's axes alone gives (of speculative systems alone, for a table of draft windows)."""
    from specter.records import run_key

    definition = experiments.get(name).table
    if definition.speculative:  # a table of draft windows: its sweep's systems draft them
        records = [r for r in records if r["k"] is not None]
    frame = derive(definition.derive, records_frame(records).assign(_record=range(len(records))))
    keep = set()
    for _, group in frame.groupby([*experiments.SCOPE, *definition.keys], dropna=False):
        first = run_key(records[group["_record"].iloc[0]])
        keep |= {i for i in group["_record"] if run_key(records[i]) == first}
    return [r for i, r in enumerate(records) if i in keep]


@pytest.mark.parametrize("name", STATS_TABLES)
def test_every_row_recomputes_from_its_records(name, records):
    definition = experiments.get(name).table
    records = _as_its_sweep(name, records)
    table = experiment_table(name, records)
    frame = records_frame(records).assign(_record=range(len(records)))
    frame = derive(definition.derive, frame)
    keys = [*experiments.SCOPE, *definition.keys]
    assert len(table) > 0, f"{name}: no rows from a sweep every table can read"
    checked = 0
    for _, row in table.iterrows():
        mask = np.ones(len(frame), dtype=bool)
        for key in keys:
            value = row[key]
            column = frame[key]
            mask &= column.isna().to_numpy() if _missing(value) else (column == value).to_numpy()
        rs = [records[i] for i in frame.loc[mask, "_record"]]
        assert rs, f"{name}: a row no record stands behind: {dict(row[keys])}"
        for metric, value in _recomputed(rs).items():
            if metric in table.columns:
                assert _same(row[metric], value), f"{name} {metric}: table {row[metric]} != recomputed {value}"
                checked += 1
        if "speedup_of_specter" in table.columns and not _missing(row["speedup_of_specter"]):
            scope = [*experiments.SCOPE, *(definition.speedups or ())]
            ref = table[(table["system"] == "specter") & np.all([_eq(table[c], row[c]) for c in scope], axis=0)]
            assert len(ref) == 1 and _same(row["speedup_of_specter"], row["tpot_ms"] / ref["tpot_ms"].iloc[0])
    assert checked >= len(table) * 3


def test_a_row_of_two_runs_is_refused_naming_the_setting_between_them(records):
    """A table row averages one run's prompts: records of runs that differ in a setting the table has no column for
    (here main's rows over the fixture's arms, temperatures and options) are refused, naming the setting."""
    from specter.errors import SpecterError

    with pytest.raises(SpecterError, match=r"would average \d+ runs that differ in config (arm|temperature|system)"):
        experiment_table("main", records)


def test_every_table_of_records_refuses_a_row_of_two_runs(records):
    """The memory and breakdown tables too keep one run a row; and two runs alike in every column of a stats table
    (here only their seed differs) are named as two runs, not as one run written twice."""
    import copy

    from specter.report.tables import memory_table

    with pytest.raises(SpecterError, match=r"would average \d+ runs that differ in config (arm|draft-kv|system)"):
        memory_table(records)
    from specter.records import run_key

    one = [r for r in records if run_key(r) == run_key(records[0])]
    other = copy.deepcopy(one)
    for r in other:
        r["config"]["seed"] = r["seed"] = r["seed"] + 1
    with pytest.raises(SpecterError, match="would average 2 runs that differ in config seed"):
        experiment_table("main", one + other)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _eq(column, value):
    return column.isna().to_numpy() if _missing(value) else (column == value).to_numpy()


def test_breakdown_parts_sum_to_each_systems_time(records):
    from specter.metrics import BREAKDOWN
    from specter.report.tables import breakdown_table

    for r in records:  # per record: the parts cover [first commit, last commit]
        parts = r["extra"]["breakdown_ms"]
        commits = r["extra"]["commit_ms"]
        assert math.isclose(sum(parts[p] for p in BREAKDOWN), commits[-1] - commits[0], rel_tol=1e-9, abs_tol=1e-9)
    with pytest.raises(SpecterError, match="would average 4 runs that differ in config arm"):
        breakdown_table(records)  # the fixture's arms, temperatures and options: runs the table has no column for
    one_each = [r for r in records if r["config"]["arm"] == "full" and r["config"]["temperature"] == 0
                and r["config"]["system_settings"].get("noise", 0.0) == 0.0]
    table = breakdown_table(one_each)
    assert set(table["system"]) == {"on-demand", "specter", "specter-oracle"}
    for _, row in table.iterrows():
        assert math.isclose(sum(row[p] for p in BREAKDOWN), row["tpot_ms"], rel_tol=1e-9)


def test_every_hit_rate_definition_is_named_and_carried_with_its_counts(records):
    """Each definition of `metrics.HIT_RATES` is a record field recomputed from extra.counts; the decode passes'
    counts are part of the run's; at one token a pass (no speculation) a pass's distinct experts are its token's
    routings, so the per-pass and per-token rates agree; only speculative runs place experts ahead."""
    assert set(metrics.HIT_RATES) == {"hit_rate", "hit_rate_pass", "hit_rate_token", "prefetch_precision",
                                      "prefetch_recall"} and metrics.ARTIFACT_HIT_RATE in metrics.HIT_RATES
    for r in records:
        c = r["extra"]["counts"]
        assert c["decode_hits"] <= r["demand_hits"] and c["decode_misses"] <= r["demand_misses"]
        assert c["decode_hits"] + c["decode_misses"] < r["demand_hits"] + r["demand_misses"]  # the prefill's are out
        assert r["hit_rate_pass"] == metrics.hit_rate(c["decode_hits"], c["decode_misses"])
        assert r["hit_rate_token"] == metrics.hit_rate(c["decode_token_hits"], c["decode_token_misses"])
        if r["k"] is None:
            assert r["hit_rate_pass"] == r["hit_rate_token"]
            assert r["prefetch_precision"] is None and r["prefetch_recall"] is None
        else:
            assert c["decode_token_hits"] + c["decode_token_misses"] > c["decode_hits"] + c["decode_misses"]
            assert r["prefetch_recall"] == r["window_recall"]
            placed = r["prefetch_precision"]
            assert placed is None if r["config"]["prefetch"] == "none" and not c["window_placed"] else 0 <= placed <= 1
