"""`specter fidelity`: how well a draft predicts its target: expert sets, top-1, acceptance vs K."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _count, _model_flag, _out, _prompt_flags, _threads, set_threads

NAME = "fidelity"
HELP = "how well a draft predicts its target: expert sets, top-1, acceptance vs K"
EXAMPLE = ("specter fidelity --model results/models/smollm2-moe --draft results/drafts/smollm2-moe/gptq-int4-g64 "
           "--out /tmp/fidelity.csv")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specter.runspec import DTYPES

    _model_flag(p)
    p.add_argument("--draft", required=True, metavar="DIR", help="a draft made by `specter quantize` from it")
    _prompt_flags(p)
    p.add_argument("--new-tokens", type=_count(2, 1 << 20), default=64,
                   help="tokens the target generates per prompt (default 64)")
    p.add_argument("--stride", type=_count(1, 1 << 20), default=4,
                   help="speculate from every STRIDE-th position (default 4)")
    p.add_argument("--dtype", choices=DTYPES, default="float32",
                   help="precision of the target's and the draft's forwards (default float32)")
    _threads(p)
    p.add_argument("--out", required=True, metavar="FILE.csv", type=_out(".csv"),
                   help="tidy CSV; the JSON summary goes beside it")


def main(args: argparse.Namespace) -> int:
    import torch

    from specter.data.prompts import load_prompts
    from specter.models.loading import load_moe_model, load_tokenizer, read_model_config
    from specter.quant.draft import load_draft
    from specter.quant.fidelity import fidelity, write_fidelity
    from specter.runspec import check_positions

    set_threads(args)
    check_positions(read_model_config(args.model), {"--prefix-tokens": args.prefix_tokens,
                                                    "--new-tokens": args.new_tokens})  # as `run` checks its own
    target = load_moe_model(args.model, dtype=getattr(torch, args.dtype))
    draft = load_draft(target, args.draft)
    tokenizer = load_tokenizer(args.model)
    prompts = load_prompts(args.dataset, tokenizer, args.num_prompts, args.prefix_tokens)
    summary, rows = fidelity(target, draft.moe, prompts, new_tokens=args.new_tokens, stride=args.stride)
    meta = {"model": str(args.model), "draft": str(args.draft), "method": draft.meta.method, "bits": draft.meta.bits,
            "group_size": draft.meta.group_size, "dataset": args.dataset, "num_prompts": args.num_prompts,
            "prefix_tokens": args.prefix_tokens, "new_tokens": args.new_tokens, "stride": args.stride,
            "dtype": args.dtype}
    json_path = write_fidelity(summary, rows, args.out, meta)
    a8 = summary.acceptance[7]
    print(f"experts hard {summary.expert_hard:.1%} + soft {summary.expert_soft:.1%} (mismatch "
          f"{summary.expert_mismatch:.1%}; sets partial {summary.expert_partial:.1%}, none {summary.expert_none:.1%}); "
          f"top-1 agreement {summary.top1_agreement:.1%}; K=8: mean accepted {a8['mean_accepted']:.2f}, acceptance "
          f"rate {a8['acceptance_rate']:.1%}, window utilization {a8['window_utilization']:.1%}")
    print(f"wrote {args.out} and {json_path}")
    return 0
