"""`specter diff`: whether two results directories hold the same records and tables (exit 1 if not)."""

from __future__ import annotations

import argparse

NAME = "diff"
HELP = "whether two results directories hold the same records and tables (exit 1 if not)"
EXAMPLE = "specter diff results /tmp/other-results --ignore config.memo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="DIR", help="a results directory (e.g. results/)")
    p.add_argument("b", metavar="DIR", help="another one")
    p.add_argument("--ignore", action="append", metavar="FIELD",
                   help="a record field to leave out, dotted (e.g. config.memo); repeatable")


def main(args: argparse.Namespace) -> int:
    from specter.report.diff import DEFAULT_IGNORED, diff_results

    ignored = (*DEFAULT_IGNORED, *(args.ignore or ()))
    d = diff_results(args.a, args.b, ignored)
    print(f"compared {d.record_files} record files ({d.records} records) and {d.tables} tables, leaving out "
          f"{', '.join(ignored)}")
    for line in d.differences:
        print(f"  {line}")
    print("identical" if d.identical else f"{len(d.differences)} differences")
    if d.impossible:
        print(f"and {len(d.impossible)} records or tables hold what no run writes (aggregate and summary refuse "
              "them):")
        for line in d.impossible[:20]:
            print(f"  {line}")
    return 0 if d.identical and not d.impossible else 1
