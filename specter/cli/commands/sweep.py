"""`specter sweep`: run a grid of systems and settings in one process (numerics computed once)."""

from __future__ import annotations

import argparse
import json

from specter.cli.arguments import _out, _system_list, _threads, set_threads
from specter.errors import SpecterError

NAME = "sweep"
HELP = ("run a grid of systems and settings in one process (numerics computed once); list-valued options take "
        "comma-separated values")
EXAMPLE = ("specter sweep --systems on-demand,specter --k 2,4,8,auto --model results/models/smollm2-moe --draft "
           "results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
           "--resident-per-layer 2 --out /tmp/sweep.jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its own flags, then every run setting's (`specter.runspec.flags.add_cli_args`)."""
    from specter.runspec.flags import add_cli_args

    p.add_argument("--systems", required=True, metavar="A,B,...", type=_system_list,
                   help="comma-separated names from `specter systems`")
    p.add_argument("--out", metavar="FILE.jsonl", type=_out(".jsonl"), help="every run's records in one JSONL")
    p.add_argument("--memo-out", metavar="FILE.json.gz", type=_out(".json.gz"),
                   help="save the numerics the runs used, for later `--memo`")
    p.add_argument("--arm", action="append", metavar="NAME[:SETTING=VALUE,...]",
                   help="a named set of settings every point of the grid also runs in (prefetch, draft_kernel or "
                        "system options), e.g. 'no prefetch:prefetch=none'; records name their arm (config.arm); "
                        "repeatable, run in order")
    add_cli_args(p, NAME)
    _threads(p)


def main(args: argparse.Namespace) -> int:
    from specter.runs import grid, sweep
    from specter.runspec import Arm
    from specter.runspec.flags import split_list, sweep_from_args

    set_threads(args)
    if args.out is None and args.memo_out is None:
        raise SpecterError("give --out FILE.jsonl (the records), --memo-out FILE (the numerics), or both")
    base, axes, options = sweep_from_args(args, split_list(args.systems, str, "--systems"), args.out or "")
    specs = grid(base, axes, options, [Arm.parse(text) for text in args.arm or ()])
    records = sweep(specs, args.out, args.memo_out)
    ran = len({json.dumps(r.config, sort_keys=True, default=str) for r in records})  # one config a run
    skip = f" ({len(specs) - ran} of {len(specs)} skipped: over budget)" if ran < len(specs) else ""
    print(f"{ran} run{'s' * (ran != 1)}{skip}, {len(records)} records"
          + "".join(f"; wrote {f}" for f in (args.out, args.memo_out) if f))
    return 0
