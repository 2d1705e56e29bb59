"""`specter aggregate`: one experiment's tidy table (CSV) from its run records or fidelity summaries."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _out
from specter.cli.output import of_another_shape

NAME = "aggregate"
HELP = "one experiment's tidy table (CSV) from its run records or fidelity summaries"
EXAMPLE = ("specter aggregate main results/experiments/main/*/*.jsonl --out /tmp/main.csv --figure /tmp/main.png "
           "--html /tmp/main.html")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specter.experiments import EXPERIMENTS

    p.add_argument("experiment", choices=EXPERIMENTS, help="the experiment")
    p.add_argument("inputs", nargs="+", metavar="FILE", help="records (.jsonl) or, for fidelity, summaries (.json)")
    p.add_argument("--out", required=True, metavar="FILE.csv", type=_out(".csv"), help="the table")
    p.add_argument("--figure", metavar="FILE.png", type=_out(".png"),
                   help="also draw the experiment's figure from the table")
    p.add_argument("--html", metavar="FILE.html", type=_out(".html"),
                   help="also write the table as an HTML page (units in the headers, sortable; for the report)")


def main(args: argparse.Namespace) -> int:
    from specter.report.tablefile import read_table, write_table
    from specter.report.tables import build_table

    with of_another_shape(f"the inputs of {args.experiment} ({', '.join(map(str, args.inputs))[:200]}) hold a field",
                           "the files are damaged or were edited: run the rules that write them again"):
        table = build_table(args.experiment, args.inputs)
    write_table(table, args.out)
    print(f"{args.experiment}: {len(table)} rows from {len(args.inputs)} files; wrote {args.out}")
    if args.figure or args.html:
        written = read_table(args.out)  # figure and page drawn from the table as written
    if args.figure:
        from specter.report.figures import plot

        with of_another_shape(f"{args.out} holds a cell", f"the records are not {args.experiment}'s: aggregate that "
                               "experiment's records"):
            plot(args.experiment, written, args.figure)
        print(f"wrote {args.figure}")
    if args.html:
        from specter.experiments import EXPERIMENTS
        from specter.report.html import write_table_html

        entry = EXPERIMENTS[args.experiment]
        write_table_html(written, args.html, f"{args.experiment}: {entry.figure.title}", entry.caption,
                         entry.figure.x)
        print(f"wrote {args.html}")
    return 0
