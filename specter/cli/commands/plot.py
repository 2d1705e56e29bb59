"""`specter plot`: one experiment's figure (PNG) from its table."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _out
from specter.cli.output import of_another_shape

NAME = "plot"
HELP = "one experiment's figure (PNG) from its table"
EXAMPLE = "specter plot main --table results/tables/main.csv --out /tmp/main.png"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specter.experiments import EXPERIMENTS

    p.add_argument("experiment", choices=EXPERIMENTS, help="the experiment")
    p.add_argument("--table", required=True, metavar="FILE.csv", help="from `specter aggregate`")
    p.add_argument("--out", required=True, metavar="FILE.png", type=_out(".png"), help="the figure")


def main(args: argparse.Namespace) -> int:
    from specter.report.figures import plot
    from specter.report.tablefile import read_table

    table = read_table(args.table)
    with of_another_shape(f"{args.table} holds a cell", "write it again with `specter aggregate`"):
        plot(args.experiment, table, args.out)
    print(f"wrote {args.out}")
    return 0
