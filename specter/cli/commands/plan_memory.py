"""`specter plan-memory`: which card holds which published model, at how many expert slots per MoE layer, for a system
without a draft and for Specter (the memory plan every run makes, the whole device its budget)."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _count
from specter.errors import SpecterError

NAME = "plan-memory"
HELP = ("which card holds which published model, at how many expert slots per MoE layer, for a system without a "
        "draft and for Specter (the memory plan every run makes, the whole device its budget)")
EXAMPLE = "specter plan-memory mixtral-8x7b --hardware h100-pcie5 --context 2048"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("architectures", nargs="*", metavar="NAME|FILE", help="shipped names or config.json paths "
                                                                          "(default: every shipped one)")
    p.add_argument("--hardware", action="append", metavar="NAME|FILE",
                   help="a hardware preset or profile; repeat for several (default: every preset)")
    p.add_argument("--context", type=_count(1, 1 << 24), default=2048,
                   help="positions the KV cache holds, prompt and output (default 2048); the window adds --k")
    p.add_argument("--k", type=_count(1, 1024), default=8, help="the draft window's positions (default 8)")
    p.add_argument("--draft-bits", type=int, choices=(2, 3, 4, 8), default=4,
                   help="the draft's bits (default 4, the paper's GPTQ INT4)")
    p.add_argument("--group-size", type=_count(16, 1 << 20), default=128, help="the draft's group size (default 128)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table (docs/gpu.md holds one)")


def main(args: argparse.Namespace) -> int:
    from specter.models.architectures import architecture_names, load_architecture
    from specter.offload.memory import device_fits
    from specter.offload.work import ModelWork
    from specter.timing import load_profile, preset_names

    profiles = [load_profile(name) for name in dict.fromkeys(args.hardware or preset_names())]
    rows = []
    for name in dict.fromkeys(args.architectures or architecture_names()):
        arch = load_architecture(name)
        work = ModelWork.of(arch.meta_model())  # at 2 bytes a weight: bfloat16 or float16, as a GPU runs it
        widths = sorted({in_f for _, in_f in work.expert_shapes})
        if any(w % args.group_size for w in widths):  # as quantize refuses it: groups would straddle the rows
            raise SpecterError(f"--group-size {args.group_size} does not divide {arch.name}'s expert input widths "
                               f"({', '.join(map(str, widths))}); give a divisor of them (the paper's is 128)")
        for profile in profiles:
            for fit in device_fits(work, profile.device_memory_bytes, args.context + args.k,
                                   work.quantized_expert_bytes(args.draft_bits, args.group_size)):
                rows.append((arch.name, profile.name, f"{profile.device_memory_bytes / 1e9:g}", fit.system,
                             f"{fit.resident_bytes / 1e9:.1f}",
                             f"{fit.slots_per_layer} of {fit.experts_per_layer}" if fit.slots_per_layer
                             else "does not fit"))
    header = ("model", "hardware", "device GB", "system", "resident GB, less slots", "slots per MoE layer")
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
        for row in (header, *rows):
            print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0
