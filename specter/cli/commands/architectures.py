"""`specter architectures`: the published architectures a run can be priced at (--cost-as)."""

from __future__ import annotations

import argparse

from specter.cli.output import fmt_bytes

NAME = "architectures"
HELP = "the published architectures a run can be priced at (--cost-as)"
EXAMPLE = "specter architectures mixtral-8x7b"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("architectures", nargs="*", metavar="NAME|FILE", help="shipped names or config.json paths "
                                                                          "(default: every shipped one)")


def main(args: argparse.Namespace) -> int:
    from specter.models.architectures import architecture_names, load_architecture
    from specter.offload.work import ModelWork

    for name in args.architectures or architecture_names():
        arch = load_architecture(name)
        work = ModelWork.of(arch.meta_model())
        dense = len(work.layers) - len(work.moe_layers)
        print(f"{arch.name}: {arch.title}; {len(work.layers)} layers ({dense} dense), top-{work.top_k} of "
              f"{work.experts_per_layer} routed experts, {fmt_bytes(work.expert_bytes)} per FP16 expert, "
              f"{arch.parameters() / 1e9:.2f}B parameters"
              + (f" (published: {arch.published_parameters / 1e9:g}B)" if arch.published_parameters else ""))
        print(f"  source: {arch.source}")
    return 0
