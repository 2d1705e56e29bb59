"""`specter inspect`: layers, experts, top-k and bytes of a local checkpoint (no weights are read)."""

from __future__ import annotations

import argparse
import json

from specter.cli.output import fmt_bytes, ranges

NAME = "inspect"
HELP = "layers, experts, top-k and bytes of a local checkpoint (no weights are read)"
EXAMPLE = "specter inspect results/models/smollm2-moe --json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="DIR", help="a checkpoint directory written by save_pretrained")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def main(args: argparse.Namespace) -> int:
    from specter.models.loading import describe_model

    s = describe_model(args.model_dir)
    if args.json:
        print(json.dumps(s.as_dict(), indent=2))
        return 0
    total = s.routed_expert_bytes + s.non_expert_bytes
    rows = [
        ("model", f"{s.path} ({s.family}, model_type {s.model_type}, {s.dtype})"),
        ("layers", f"{s.num_layers} ({len(s.moe_layers)} MoE: {ranges(s.moe_layers)})"),
        ("experts per layer",
         f"{s.experts_per_layer} routed, top-{s.top_k}" + (", plus shared" if s.shared_experts else "")),
        ("bytes per expert", f"{s.bytes_per_expert} ({fmt_bytes(s.bytes_per_expert)}; {s.params_per_expert} params)"),
        ("routed expert bytes", f"{s.routed_expert_bytes} ({fmt_bytes(s.routed_expert_bytes)}, "
                                f"{100 * s.routed_expert_bytes / total:.1f}% of weights)"),
        ("non-expert bytes", f"{s.non_expert_bytes} ({fmt_bytes(s.non_expert_bytes)})"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
