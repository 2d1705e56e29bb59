"""`specter compare`: run several systems on the same prompts and print a table."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _out, _system_list, _threads, set_threads
from specter.cli.output import timing

NAME = "compare"
HELP = "run several systems on the same prompts and print a table"
EXAMPLE = ("specter compare --systems on-demand,specter --model results/models/smollm2-moe --draft "
           "results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
           "--resident-per-layer 2 --out /tmp/compare")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its own flags, then every run setting's (`specter.runspec.flags.add_cli_args`)."""
    from specter.runspec.flags import add_cli_args

    p.add_argument("--systems", required=True, metavar="A,B,...", type=_system_list,
                   help="comma-separated names from `specter systems`")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="directory for one JSONL per system")
    add_cli_args(p, NAME)
    _threads(p)


def main(args: argparse.Namespace) -> int:
    from specter.runs import compare
    from specter.runspec.flags import from_args, split_list

    set_threads(args)
    systems = split_list(args.systems, str, "--systems")
    rows = compare(from_args(args, systems[0]), systems, args.out)
    print(f"{timing(rows[0])}; means over prompts; misses and bytes summed over prompts")
    print("| system | K | slots/layer | TPOT ms | lower bound ms | demand misses | H2D bytes | activation bytes "
          "| acceptance |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.3f}"
        print(f"| {r['system']} | {r['k'] or ''} | {r['slots_per_layer']} | {r['tpot_ms']:.4f} | "
              f"{r['lower_bound_tpot_ms']:.4f} | {r['demand_misses']} | {r['h2d_bytes']} | {r['activation_bytes']} "
              f"| {acc} |")
    print(f"wrote one JSONL per system under {args.out}")
    return 0
