"""`specter build-model`: build a model checkpoint offline: smollm2-moe (the default model), smollm2-moe-16x2, -64x6,
-60x4 (proxies of Phi-3.5-MoE, DeepSeek-V2-Lite and Qwen1.5-MoE's routing), smollm2-moe[-64x6]-matched (router locality
set from a published statistic) or tiny-<arch> (a tiny random one)."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _count, _out, _threads, set_threads

NAME = "build-model"
HELP = ("build a model checkpoint offline: smollm2-moe (the default model), smollm2-moe-16x2, -64x6, -60x4 (proxies "
        "of Phi-3.5-MoE, DeepSeek-V2-Lite and Qwen1.5-MoE's routing), smollm2-moe[-64x6]-matched (router locality "
        "set from a published statistic) or tiny-<arch> (a tiny random one)")
EXAMPLE = ("specter build-model smollm2-moe --out results/models/smollm2-moe --threads 1\n"
           "specter build-model tiny-mixtral --out /tmp/tiny-mixtral")


def add_arguments(p: argparse.ArgumentParser) -> None:
    # the builders are named here without importing them: the parser starts without torch
    p.add_argument("name", metavar="NAME", help="smollm2-moe[-16x2|-64x6|-60x4], smollm2-moe[-64x6]-matched or "
                                                "tiny-<arch>, e.g. tiny-mixtral")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="output directory; a model already there is replaced once the new one is complete")
    p.add_argument("--seed", type=_count(0, 2**63 - 1), default=0, help="seed of every random choice (default 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a build setting of a smollm2-moe model (e.g. distill_steps=30, locality=-0.5); "
                        "repeatable")
    _threads(p)


def main(args: argparse.Namespace) -> int:
    from specter.models.builders import build_model
    from specter.runspec.flags import key_values

    set_threads(args)
    path = build_model(args.name, args.out, seed=args.seed, overrides=dict(key_values(args.set, "--set")))
    print(f"wrote {args.name} to {path}")
    return 0
