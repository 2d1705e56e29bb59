"""`specter run`: run one system over a prompt set and write one JSON record per prompt."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _out, _SystemNames, _threads, set_threads
from specter.cli.output import timing

NAME = "run"
HELP = "run one system over a prompt set and write one JSON record per prompt"
EXAMPLE = ("specter run --system specter --model results/models/smollm2-moe --draft "
           "results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
           "--resident-fraction 0.25 --out /tmp/specter.jsonl")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Its own flags, then every run setting's (`specter.runspec.flags.add_cli_args`)."""
    from specter.runspec.flags import add_cli_args

    p.add_argument("--system", required=True, metavar="NAME", choices=_SystemNames(),
                   help="one of %(choices)s (`specter systems` says what each does)")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", type=_out(".jsonl"),
                   help="the records, one JSON line per prompt")
    add_cli_args(p, NAME)
    _threads(p)


def main(args: argparse.Namespace) -> int:
    from specter.runs import run, summary
    from specter.runspec.flags import from_args

    set_threads(args)
    records = run(from_args(args, args.system, args.out))
    r = summary(args.system, records)
    prompts = len({record.prompt_index for record in records})
    timed = f" x {len(records) // prompts} timed repeats" if len(records) > prompts else ""
    host = records[0].extra.get("host_layers")  # a system placing whole layers' experts there
    where = (f"{r['slots_per_layer']}/{records[0].experts_per_layer} experts per layer resident" if host is None else
             f"the routed experts of {len(host)} of {records[0].config['memory']['moe_layers']} MoE layers on the host")
    print(f"{args.system}: mean TPOT {r['tpot_ms']:.3f} ms ({timing(r)}; lower bound {r['lower_bound_tpot_ms']:.3f} "
          f"ms) over {prompts} prompt{'s' if prompts > 1 else ''}{timed}, {where}\nwrote {args.out}")
    return 0
