"""The README's results at a glance and the report's front page, from tracked or fresh tables.

`readme_table` (`specter summary --readme`): `main`'s TPOT per system and case, with its TPOT over Specter's, from one
`main.csv` (a results tree's, or the copy tracked in `docs/results/`); from a claims table, `readme_claims`: the run
that wrote it (`run.yaml` beside it), each claim with the suite's figure, its interval, where it ran and its verdict.
`front_page` (`specter summary --front`): the same claims as reStructuredText, which `snakemake --report` shows first.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd
import yaml

from specter.errors import SpecterError
from specter.report.summary import ABSENT, _interval_text, _markdown, _num, _read, _system_key, fmt_ms
from specter.report.tablefile import COMPARISONS
from specter.runspec import PRICINGS

#: the comparisons of `main`, in the order the README's table lists them


def _case_label(model: str, cost_as: str, hardware: str, simulated: bool, pricing: str = "") -> str:
    """A column's header: what priced its runs (and its pricing, where the table has several); its hardware and
    whether it was simulated are in the table's legend (`_case_legend`)."""
    where = cost_as if cost_as else f"{model} (own shapes)"
    return f"{where}, {pricing}" if pricing else where


def _case_legend(model: str, cost_as: str, hardware: str, simulated: bool) -> str:
    """What a case's columns hold: whose tokens and routes, priced at which shapes, on which profile, simulated or
    measured."""
    timed = "simulated" if simulated else "measured"
    if cost_as:
        return f"{cost_as}: the proxy {model}'s tokens and routes, priced at {cost_as}'s shapes on {hardware}, {timed}"
    return f"{model} (own shapes): its own tokens, routes and shapes on {hardware}, {timed}"


def _run_line(path: Path) -> str:
    """The run a tracked table came from, as `run.yaml` beside it names it (date, machine, command, config)."""
    run_file = path.parent / "run.yaml"
    if not run_file.is_file():
        return "The run that wrote this table is not named (no run.yaml beside it)."
    try:
        run = yaml.safe_load(run_file.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SpecterError(f"{run_file} is not a YAML mapping ({err}); give it date, machine, command and config") \
            from None
    missing = [k for k in ("date", "machine", "command", "config") if not isinstance(run, dict) or k not in run]
    if missing:
        raise SpecterError(f"{run_file} lacks {', '.join(missing)}; give each, as docs/results/run.yaml does")
    import datetime

    for key in ("date", "machine", "command", "config"):
        value = run[key]
        if not ((isinstance(value, str) and value.strip() and value.isprintable() and "`" not in value)
                or (key == "date" and isinstance(value, datetime.date))):
            raise SpecterError(f"{run_file}: {key} is {value!r:.60}, and it is printed in the README as one line of "
                               "text; give it as a string without backticks, as docs/results/run.yaml does")
    seconds = run.get("seconds")
    if seconds is not None and not (isinstance(seconds, (int, float)) and not isinstance(seconds, bool)
                                    and math.isfinite(seconds) and seconds >= 0):
        raise SpecterError(f"{run_file}: seconds is {seconds!r}, and a run's wall time is a number of seconds, never "
                           "negative; write the time the run took, or leave seconds out")
    return (f"Run: `{run['command']}` on `{run['config']}`, {run['date']}, on {run['machine']}"
            + (f" ({run['seconds']:,} s)" if run.get("seconds") else "") + ".")


def readme_claims(path: str | Path) -> str:
    """The README's claims table from the `claims` table at `path`: the run that wrote it, one row per claim (its
    words, the paper's figure and where it is printed, the suite's figure with its interval, the verdict), and after
    it the headline's statistic over every baseline."""
    from specter.report.claims import figure_text, verdict_counts
    from specter.report.tablefile import read_table

    path = Path(path)
    df = read_table(path)
    missing = [c for c in ("id", "short", "verdict", "paper", "suite", "low", "high", "unit", "source", "beside_of")
               if c not in df]
    if missing:
        raise SpecterError(f"{path} lacks the column(s) {', '.join(missing)}; give the claims table "
                           "(results/tables/claims.csv), written by `specter aggregate claims`")
    df = df.assign(beside_of=df["beside_of"].fillna("").astype(str))
    claims, beside = df[df["beside_of"] == ""], df[df["beside_of"] != ""]
    counts = verdict_counts(df)
    hardware = sorted({h for cell in df["hardware"].dropna().astype(str) for h in cell.split(", ") if h})
    lines = [*textwrap.wrap(_run_line(path), 120), "",
             *textwrap.wrap(
                 f"Each claim of the paper the suite can test, its figure and where it is printed, the suite's figure "
                 f"with a {95}% bootstrap interval over prompts, and the verdict: reproduced where the whole interval "
                 "lies within 0.8-1.25x of the paper's figure (at or above it for a claim of 'over'), not reproduced "
                 "where none of it does, inconclusive where it straddles an edge. Times are simulated on "
                 f"{', '.join(hardware) or 'no profile'} at the paper's shapes with a proxy's routing, each system "
                 "at the kernels and host reads its own code makes (upstream) wherever its runs were priced so. "
                 "'Run at' names the cases a figure comes from, and the paper's where they differ: a mean or a "
                 "maximum over the paper's cases is taken over those the run has. `results/tables/claims.csv` says "
                 "each claim's whole configuration and the calibration rows it rests on. "
                 + ", ".join(f"{n} {v}" for v, n in counts.items() if n) + ".", 120), ""]
    rows = [[r["short"], f"{'over ' if r['rule'] == 'at_least' else ''}{figure_text(r['paper'], r['unit'])} "
             f"({r['source']})", _interval_text(r), r.get("ran_at", ""), r["verdict"]] for _, r in claims.iterrows()]
    lines += _markdown(rows, ["claim", "paper", "suite [95% interval]", "run at", "verdict"], tight=True)
    said = set()
    for claim_id, part in beside.groupby("beside_of", sort=False):
        head = claims[claims["id"] == claim_id]
        others = ", ".join(f"{r['short']} {_interval_text(r)}" for _, r in part.iterrows())
        if head.empty or others in said:  # a maximum over one cell is its mean: said once
            continue
        said.add(others)
        head = head.iloc[0]
        lines += ([""] if lines[-1] else []) + textwrap.wrap(
            f"The same statistic as '{head['short']}', over every other baseline, with no verdict (the paper claims "
            f"nothing about them): {others}.", 120, break_on_hyphens=False)
    return "\n".join(lines).rstrip() + "\n"


def readme_table(path: str | Path) -> str:
    """The README's results table from `main`'s table at `path` (`results/tables/main.csv`): one row per comparison
    and system, one column per case (the architecture whose shapes price the runs, the hardware profile, simulated or
    measured), each cell the mean TPOT per prompt set and, in brackets, the TPOT over Specter's in that comparison. A
    claims table (`results/tables/claims.csv`) gives the README's claims table instead (`readme_claims`)."""
    from specter.report.tablefile import read_table

    path = Path(path)
    df = read_table(path)
    if "verdict" in df and "claim" in df:
        return readme_claims(path)
    needs = ("model", "dataset", "hardware", "simulated", "system", "tpot_ms", "speedup_of_specter")
    missing = [c for c in needs if c not in df]
    if missing:
        raise SpecterError(f"{path} lacks the column(s) {', '.join(missing)}; give `main`'s table "
                           "(results/tables/main.csv), written by `specter aggregate main`")
    if df.empty:
        raise SpecterError(f"{path} holds no rows; run the workflow (snakemake --cores all) first")
    fix = "the table was edited or damaged: write it again with `specter aggregate main`"
    # (a comparison, system or flag no run writes the table's reader refuses)
    df = df.assign(cost_as=df["cost_as"].fillna("").astype(str) if "cost_as" in df else "",
                   memory=df["memory"].fillna("same slots").astype(str) if "memory" in df else "same slots",
                   simulated=df["simulated"].astype(str) == "True",
                   pricing=df["pricing"].fillna("fused").astype(str) if "pricing" in df else "fused")
    several = df["pricing"].nunique() > 1  # a column per case and pricing, side by side
    if not several:
        df = df.assign(pricing="")
    key = ["memory", "system", "model", "cost_as", "hardware", "simulated", "pricing", "dataset"]
    twice = df[df.duplicated(key, keep=False)]
    if not twice.empty:
        r = twice.iloc[0]
        same = df[(df[key] == r[key]).all(axis=1)]
        differ = [c for c in ("dispatch_us", "k", "slots_per_layer", "prefetch") if c in same and same[c].nunique() > 1]
        hint = (f" (they differ in {', '.join(differ)}: give a table of one value of it, e.g. its rows with "
                f"{differ[0]} == {same[differ[0]].iloc[0]})" if differ else "")
        raise SpecterError(f"{path} has {len(same)} rows for {r['system']} ({r['memory']}) on {r['model']} "
                           f"{r['dataset']}{hint}; the README's table takes one per system, comparison, case, pricing "
                           "and prompt set, as `main`'s table gives it")
    datasets = sorted(df["dataset"].astype(str).unique())
    rank = {p: i for i, p in enumerate(PRICINGS)}
    cases = sorted({tuple(c) for c in df[["model", "cost_as", "hardware", "simulated", "pricing"]].itertuples(
        index=False)}, key=lambda c: (*c[:4], rank.get(c[4], len(rank)), c[4]))
    comparisons = [m for m in COMPARISONS if m in set(df["memory"])]
    cells = {tuple(r[k] for k in key): r for _, r in df.iterrows()}
    for at, r in cells.items():  # each ratio is its row's TPOT over Specter's in the same comparison and case (or,
        # where that comparison has no Specter row, another comparison's in the same case and prompt set)
        ours = next((cells[(m, "specter", *at[2:])] for m in (at[0], *comparisons)
                     if (m, "specter", *at[2:]) in cells), None)
        ratio = r["speedup_of_specter"]
        if ours is None and not pd.isna(ratio):
            raise SpecterError(f"{path}: {r['system']}'s speedup_of_specter ({at[0]}, {at[2]}, {at[-1]}) is {ratio:g}, "
                               f"and the table holds no Specter row it could be over; {fix}")
        if ours is not None and not pd.isna(ratio) and not math.isclose(ratio, r["tpot_ms"] / ours["tpot_ms"],
                                                                          rel_tol=1e-6):
            raise SpecterError(f"{path}: {r['system']}'s speedup_of_specter ({at[0]}, {at[2]}, {at[-1]}) is "
                               f"{ratio:g}, and its TPOT over Specter's is {r['tpot_ms'] / ours['tpot_ms']:g}; {fix}")
        keeps_all = r.get("slots_per_layer") == r.get("experts_per_layer")  # `resident`: every expert, at any budget
        same = ("dispatch_us", "n", *(("slots_per_layer",) if at[0] == "same slots" and not keeps_all else ()))
        for column in same if ours is not None else ():  # the same protocol (and slots) as the row it is over
            mine, theirs = r.get(column), ours.get(column)
            if not (pd.isna(mine) and pd.isna(theirs)) and mine != theirs:
                raise SpecterError(f"{path}: {r['system']} ({at[0]}, {at[2]}, {at[-1]}) has {column} {mine}, and the "
                                   f"Specter row it is compared with {theirs}: the table mixes runs of another "
                                   f"protocol; {fix}")
    rows = []
    for memory in comparisons:
        for system in sorted(set(df.loc[df["memory"] == memory, "system"]), key=_system_key):
            row = [memory, system]
            for case in cases:
                found = [cells.get((memory, system, *case, d)) for d in datasets]
                if all(r is None for r in found):
                    row.append(ABSENT)
                    continue
                tpot = "/".join(ABSENT if r is None else fmt_ms(r["tpot_ms"]) for r in found)
                ratio = "/".join(ABSENT if r is None or pd.isna(r["speedup_of_specter"]) else
                                 _num(r["speedup_of_specter"], 2) for r in found)
                row.append(f"{tpot} ({ratio})")
            rows.append(row)
    simulated = "simulated" if all(c[3] for c in cases) else "simulated or measured, as each column says"
    lines = [f"TPOT in ms ({simulated}; mean over prompts, per prompt set: {'/'.join(datasets)}) and, in brackets, "
             "each system's TPOT over Specter's in the same comparison (above 1: Specter is faster). Same slots: "
             "every system at Specter's expert slots per layer; same memory: every system in the device memory "
             f"Specter needs there, its draft charged. {ABSENT}: no record in the table (a run that does not fit its "
             "memory writes none)."]
    if several:
        lines.append("Each case is priced two ways, side by side: fused (a modelled runtime of fused kernels, the same "
                     "for every system: a mechanism alone) and upstream (each system at the kernels and host reads its "
                     "own public code makes, declared in its file with the upstream files and lines; counted for the "
                     "suite's own systems); each ratio is over Specter's at the same pricing.")
    if df["system"].astype(str).str.contains(" (K ", regex=False).any():
        lines.append("A row `<system> (K <governor>)` is that system at the K its governor chose (the K each case "
                     "fixes otherwise), over Specter's at the case's fixed K.")
    lines = [*textwrap.wrap(" ".join(lines), 120), ""]
    lines += _markdown(rows, ["comparison", "system", *(_case_label(*c) for c in cases)], tight=True)
    legend = sorted({_case_legend(*c[:4]) for c in cases})
    lines += textwrap.wrap(f"{'; '.join(legend)}.", 120)
    return "\n".join(lines).rstrip() + "\n"


def _rst_cell(text: str) -> str:
    return str(text).replace("|", "/").replace("*", "\\*").replace("`", "'")


def front_page(results: str | Path) -> str:
    """The report's front page (reStructuredText, Snakemake's report shows it first): what the suite runs, the paper's
    claims with the suite's figures, intervals and verdicts from `results/tables/claims.csv`, and where every other
    result is; the workflow's description alone where the run wrote no claims table."""
    from specter.report.claims import figure_text, verdict_counts

    intro = (Path(__file__).resolve().parents[2] / "workflow" / "report" / "workflow.rst").read_text(encoding="utf-8")
    path = Path(results) / "tables" / "claims.csv"
    df = _read(path)
    if df is None or df.empty:
        return intro
    df = df.assign(beside_of=df["beside_of"].fillna("").astype(str))
    claims = df[df["beside_of"] == ""]
    counts = verdict_counts(df)
    hardware = sorted({h for cell in df["hardware"].dropna().astype(str) for h in cell.split(", ") if h})
    said = ", ".join(f"**{n} {v}**" for v, n in counts.items() if n)
    lines = ["The paper's claims, judged", "==========================", "",
             *textwrap.wrap(
                 f"Of the {len(claims)} claims of the paper the suite can test: {said}. A claim is reproduced where "
                 "the suite's whole 95% bootstrap interval (over prompts) lies within 0.8-1.25x of the paper's figure "
                 "(at or above it for a claim of 'over'), not reproduced where none of it does, and inconclusive where "
                 f"it straddles an edge. Times are simulated on {', '.join(hardware) or 'no profile'} at the paper's "
                 "published shapes with a proxy model's routing, each system priced at the kernels and host reads its "
                 "own code makes where the runs were priced so (each claim's configuration says). The figure and "
                 "the whole table (configuration, the calibration rows each claim rests on, the headline's "
                 "statistic over every baseline) are under Experiments, claims.", 110),
             "", ".. list-table::", "   :header-rows: 1", "   :widths: 34 16 20 18 12", "",
             "   * - claim", "     - paper", "     - suite [95% interval]", "     - run at", "     - verdict"]
    for _, r in claims.iterrows():
        paper = f"{'over ' if r['rule'] == 'at_least' else ''}{figure_text(r['paper'], r['unit'])} ({r['source']})"
        lines += [f"   * - {_rst_cell(r['short'])}", f"     - {_rst_cell(paper)}",
                  f"     - {_rst_cell(_interval_text(r))}", f"     - {_rst_cell(r.get('ran_at', ''))}",
                  f"     - **{r['verdict']}**"]
    return "\n".join([*lines, "", "About this report", "-----------------", "", intro.rstrip(), ""])
