"""`specter summary --readme`: the README's results table from `main`'s table, on a small hand-made one."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from specter.cli import main
from specter.report.readme import readme_table
from specter.report.tablefile import write_table

PHI = ("smollm2-moe-16x2", "Phi-3.5-MoE", "a100-40gb-pcie4")
OWN = ("smollm2-moe", "", "a100-40gb-pcie4")


def _main_table(path) -> None:
    """Rows as `specter aggregate main` writes them (its columns, fewer of them): two cases, two prompt sets, both
    comparisons; the small case ran one prompt set, and Specter has no same-memory row."""
    rows = []
    for (model, cost_as, hardware), dataset, memory, system, tpot, specter in [
        (PHI, "humaneval", "same slots", "specter", 144.8, 144.8),
        (PHI, "humaneval", "same slots", "on-demand", 271.6, 144.8),
        (PHI, "mtbench", "same slots", "specter", 118.6, 118.6),
        (PHI, "mtbench", "same slots", "on-demand", 287.5, 118.6),
        (PHI, "humaneval", "same memory", "on-demand", 123.1, 144.8),
        (OWN, "humaneval", "same slots", "specter", 2.547, 2.547),
        (OWN, "humaneval", "same slots", "resident", 2.248, 2.547),
    ]:
        rows.append(dict(model=model, cost_as=cost_as or None, dataset=dataset, hardware=hardware, simulated=True,
                         memory=memory, system=system, k=None if system != "specter" else 16, slots_per_layer=2,
                         tpot_ms=tpot, lower_bound_tpot_ms=tpot / 2, n=5, speedup_of_specter=tpot / specter))
    pd.DataFrame(rows).to_csv(path, index=False)


EXPECTED = """\
TPOT in ms (simulated; mean over prompts, per prompt set: humaneval/mtbench) and, in brackets, each system's TPOT over
Specter's in the same comparison (above 1: Specter is faster). Same slots: every system at Specter's expert slots per
layer; same memory: every system in the device memory Specter needs there, its draft charged. -: no record in the table
(a run that does not fit its memory writes none).

|comparison|system|smollm2-moe (own shapes)|Phi-3.5-MoE|
|---|---|---|---|
|same slots|resident|2.248/- (0.88/-)|-|
|same slots|on-demand|-|271.6/287.5 (1.88/2.42)|
|same slots|specter|2.547/- (1.00/-)|144.8/118.6 (1.00/1.00)|
|same memory|on-demand|-|123.1/- (0.85/-)|

Phi-3.5-MoE: the proxy smollm2-moe-16x2's tokens and routes, priced at Phi-3.5-MoE's shapes on a100-40gb-pcie4,
simulated; smollm2-moe (own shapes): its own tokens, routes and shapes on a100-40gb-pcie4, simulated.
"""


def test_the_readme_table_lists_every_system_by_case_with_its_ratio_to_specter_and_its_profile(tmp_path):
    _main_table(tmp_path / "main.csv")
    assert readme_table(tmp_path / "main.csv") == EXPECTED


def test_two_pricings_stand_side_by_side_each_over_specter_at_its_own(tmp_path):
    """A `main` table of two pricings (fused and upstream) gives each case a column per pricing, fused first, each
    ratio over Specter's at the same pricing; the lead says what each pricing is."""
    _main_table(tmp_path / "fused.csv")
    fused = pd.read_csv(tmp_path / "fused.csv").assign(pricing="fused")
    upstream = fused.assign(pricing="upstream", tpot_ms=fused["tpot_ms"] * 2)
    upstream.loc[upstream["system"] == "on-demand", "speedup_of_specter"] *= 0.5  # on-demand cheaper under upstream
    upstream.loc[upstream["system"] == "on-demand", "tpot_ms"] *= 0.5
    pd.concat([upstream, fused]).to_csv(tmp_path / "main.csv", index=False)
    text = readme_table(tmp_path / "main.csv")
    assert ("|comparison|system|smollm2-moe (own shapes), fused|smollm2-moe (own shapes), upstream|Phi-3.5-MoE, fused|"
            "Phi-3.5-MoE, upstream|") in text
    assert "|same slots|on-demand|-|-|271.6/287.5 (1.88/2.42)|271.6/287.5 (0.94/1.21)|" in text
    assert ("|same slots|specter|2.547/- (1.00/-)|5.094/- (1.00/-)|144.8/118.6 (1.00/1.00)|289.6/237.2 (1.00/1.00)|"
            in text)
    lead = " ".join(text.split())
    assert "fused (a modelled runtime of fused kernels" in lead and "upstream (each system" in lead
    assert max(len(line) for line in text.splitlines()) <= 200


def test_the_command_prints_it_from_a_file_or_from_a_results_tree(tmp_path, capsys):
    (tmp_path / "results" / "tables").mkdir(parents=True)
    _main_table(tmp_path / "results" / "tables" / "main.csv")
    assert main(["summary", "--readme", "--from", str(tmp_path / "results" / "tables" / "main.csv")]) == 0
    assert capsys.readouterr().out == EXPECTED
    assert main(["summary", str(tmp_path / "results"), "--readme", "--out", str(tmp_path / "table.md")]) == 0
    assert (tmp_path / "table.md").read_text() == EXPECTED


@pytest.mark.parametrize("argv, message", [
    (["summary", "--from", "{dir}/main.csv"], "add --readme"),
    (["summary", "--readme"], "a results DIR or, with --readme, --from FILE.csv"),
    (["summary", "{dir}", "--readme", "--from", "{dir}/main.csv"], "one of the two"),
    (["summary", "--readme", "--from", "{dir}/other.csv"], "lacks the column(s) speedup_of_specter"),
    (["summary", "--readme", "--from", "{dir}/absent.csv"], "does not exist"),
])
def test_a_wrong_request_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    _main_table(tmp_path / "main.csv")
    write_table(pd.read_csv(tmp_path / "main.csv").drop(columns="speedup_of_specter"), tmp_path / "other.csv")
    assert main([a.format(dir=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specter: error: ") and message in err and err.count("\n") == 1


def test_a_governors_run_is_a_row_of_its_own_compared_with_the_fixed_k(tiny_dirs, tmp_path):
    """`main` with governors: Specter at the governor's K is `specter (K auto)` beside Specter at the fixed K, which
    every ratio (its own included) is taken against; a system that does not speculate runs once."""
    from conftest import spec
    from specter.quant.quantize import quantize_draft
    from specter.report.tables import experiment_table, memory_table
    from specter.runs import grid, sweep
    from specter.runspec import Window

    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["olmoe"], draft, method="rtn", bits=4, group_size=32)
    base = spec(system="on-demand", model=tiny_dirs["olmoe"], draft=str(draft), dataset="code",
                hardware="a100-40gb-pcie4", out="", num_prompts=2, prefix_tokens=8, max_new_tokens=6,
                resident_per_layer=2, k=2)
    specs = grid(base, {"system": ["on-demand", "specter"], "k": [Window(2), Window("auto")]})
    assert [(s.system, str(s.k)) for s in specs] == [("on-demand", ""), ("specter", "2"), ("specter", "auto")]
    sweep(specs[:2], tmp_path / "main.jsonl", progress=False)  # the governor's own run is tests/test_governor.py's
    records = [json.loads(line) for line in (tmp_path / "main.jsonl").read_text().splitlines()]
    for r in [r for r in records if r["system"] == "specter"]:  # as a run at `auto` that chose K = 2 writes it
        records.append({**r, "config": {**r["config"], "k": "auto"}, "tpot_ms": 0.8 * r["tpot_ms"]})
    table = experiment_table("main", records)
    assert list(table["system"]) == ["on-demand", "specter", "specter (K auto)"]
    fixed, governed = (table[table["system"] == s].iloc[0] for s in ("specter", "specter (K auto)"))
    assert fixed["k"] == 2 and fixed["speedup_of_specter"] == 1.0
    assert governed["k"] == 2 and governed["speedup_of_specter"] == pytest.approx(0.8)
    assert "specter (K auto)" in set(memory_table(records)["system"])
    write_table(table, tmp_path / "main.csv")
    assert "|same slots|specter (K auto)|" in readme_table(tmp_path / "main.csv")


def test_two_rows_for_one_cell_are_refused(tmp_path, capsys):
    _main_table(tmp_path / "main.csv")
    df = pd.read_csv(tmp_path / "main.csv")
    again = df.iloc[[0]].assign(tpot_ms=df.iloc[0]["tpot_ms"] * 2)  # the same cell, another figure
    pd.concat([df, again]).to_csv(tmp_path / "main.csv", index=False)
    assert main(["summary", "--readme", "--from", str(tmp_path / "main.csv")]) == 2
    assert "2 rows for specter (same slots) on smollm2-moe-16x2 humaneval" in capsys.readouterr().err
    pd.concat([df, df.iloc[[0]]]).to_csv(tmp_path / "main.csv", index=False)  # the same line twice
    assert main(["summary", "--readme", "--from", str(tmp_path / "main.csv")]) == 2
    assert "main.csv:" in (err := capsys.readouterr().err) and "repeats line 2" in err


def test_the_readme_table_reads_what_specter_aggregate_main_writes(tiny_dirs, tmp_path, capsys):
    """On records of a real sweep: both comparisons, every system, Specter's ratio to itself 1, the profile named."""
    from conftest import spec
    from specter.quant.quantize import quantize_draft
    from specter.report.tables import experiment_table
    from specter.runs import grid, sweep
    from specter.runspec import Budget

    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["olmoe"], draft, method="rtn", bits=4, group_size=32)
    base = spec(system="on-demand", model=tiny_dirs["olmoe"], draft=str(draft), dataset="code",
                hardware="a100-40gb-pcie4", out="", num_prompts=2, prefix_tokens=8, max_new_tokens=6,
                resident_per_layer=2, k=2)
    specs = grid(base, {"system": ["on-demand", "specter"], "budget": [Budget("slots", 2), Budget("same_memory", 2)]})
    sweep(specs, tmp_path / "main.jsonl", progress=False)
    records = [json.loads(line) for line in (tmp_path / "main.jsonl").read_text().splitlines()]
    write_table(experiment_table("main", records), tmp_path / "main.csv")
    text = readme_table(tmp_path / "main.csv")
    model = Path(tiny_dirs["olmoe"]).name
    assert f"|comparison|system|{model} (own shapes)|" in text
    assert f"{model} (own shapes): its own tokens, routes and shapes on a100-40gb-pcie4, simulated." in text
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("|same")]
    assert rows == [["same slots", "on-demand"], ["same slots", "specter"], ["same memory", "on-demand"],
                    ["same memory", "specter"]]
    specter = [line for line in text.splitlines() if line.startswith("|same") and "|specter|" in line]
    assert len(specter) == 2 and all(line.endswith("(1.00)|") for line in specter), specter
