"""`specter routing-stats`: a checkpoint's routing locality (repeat rates, LRU and LFU hit rates, reuse distance) as
JSON: its model card's, else measured on held-out text."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _model_flag, _out, _threads, set_threads

NAME = "routing-stats"
HELP = ("a checkpoint's routing locality (repeat rates, LRU and LFU hit rates, reuse distance) as JSON: its model "
        "card's, else measured on held-out text")
EXAMPLE = "specter routing-stats --model results/models/smollm2-moe --out /tmp/routing.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    _model_flag(p)
    p.add_argument("--out", required=True, metavar="FILE.json", type=_out(".json"), help="the statistics")
    _threads(p)


def main(args: argparse.Namespace) -> int:
    import json

    from specter.io import atomic_write_text
    from specter.models.routing_stats import model_routing

    set_threads(args)
    stats = model_routing(args.model)
    atomic_write_text(args.out, json.dumps(stats, indent=1, sort_keys=True) + "\n")
    print(f"{stats['model']}: routing statistics from {stats['measured_from']}; wrote {args.out}")
    return 0
