"""`specter summary`: the headline numbers of a results tree as Markdown: hashes of its models, drafts and tables; the
paper's claims, main, ablation, k_sweep, sensitivity and calibration (no wall-clock times); --readme: only the README's
results table (main's or the claims')."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _out
from specter.cli.output import of_another_shape
from specter.errors import SpecterError

NAME = "summary"
HELP = ("the headline numbers of a results tree as Markdown: hashes of its models, drafts and tables; the paper's "
        "claims, main, ablation, k_sweep, sensitivity and calibration (no wall-clock times); --readme: only the "
        "README's results table (main's or the claims')")
EXAMPLE = "specter summary results --out /tmp/summary.md"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", metavar="DIR", nargs="?",
                   help="the results directory (holding tables/, models/, drafts/)")
    p.add_argument("--readme", action="store_true",
                   help="print only the README's results table, from DIR/tables/main.csv or --from")
    p.add_argument("--from", dest="table", metavar="FILE.csv",
                   help="with --readme: main's or the claims' table to read instead of a results tree's "
                        "(docs/results/main.csv, docs/results/claims.csv)")
    p.add_argument("--out", metavar="FILE.md", type=_out(".md"), help="write it there (default: print it)")
    p.add_argument("--front", metavar="FILE.rst", type=_out(".rst"),
                   help="also write the report's front page there (the paper's claims and their verdicts, from "
                        "DIR/tables/claims.csv; `snakemake --report` shows it first)")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specter.io import atomic_write_text
    from specter.report.readme import readme_table
    from specter.report.summary import summary

    if args.table is not None and not args.readme:
        raise SpecterError("--from FILE.csv gives the README's table its figures; add --readme (or give a results "
                           "DIR alone for the whole summary)")
    if (args.results is None) == (args.table is None):
        raise SpecterError("summary takes a results DIR or, with --readme, --from FILE.csv (one of the two): e.g. "
                           "`specter summary results` or `specter summary --readme --from docs/results/main.csv`")
    if args.front and (args.readme or args.results is None):
        raise SpecterError("--front writes the report's front page of a results DIR; give the DIR without --readme "
                           "(e.g. `specter summary results --out results/summary.md --front results/report/front.rst`)")
    with of_another_shape(f"a table of {args.table or args.results} holds a cell",
                           "write it again with `specter aggregate` (or rerun the workflow)"):
        if args.readme:
            text = readme_table(args.table if args.table is not None else Path(args.results) / "tables" / "main.csv")
        else:
            text = summary(args.results)
    if args.front:
        from specter.report.readme import front_page

        atomic_write_text(args.front, front_page(args.results))
        print(f"wrote {args.front}")
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0
