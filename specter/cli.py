"""The `specter` command line: parse, call one library function, print. Bad input exits 2 with a one-line error."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from specter import __version__
from specter.errors import SpecterError


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def cmd_models(args: argparse.Namespace) -> int:
    from specter.models.adapter import ARCHITECTURES

    width = max(len(k) for k in ARCHITECTURES)
    for model_type, spec in sorted(ARCHITECTURES.items()):
        print(f"{model_type:<{width}}  {spec.name}")
    return 0


def cmd_systems(args: argparse.Namespace) -> int:
    import inspect

    from specter.systems import registry

    for name, cls in sorted(registry().items()):
        own = cls.__dict__.get("__doc__")  # the class's own docstring (not System's), else its module's
        doc = inspect.cleandoc(own) if own else inspect.getdoc(inspect.getmodule(cls)) or ""
        summary = " ".join(doc.split("\n\n")[0].split()).removeprefix(f"`{name}`: ")  # a module docstring names it
        kind = ("speculative" + (", own draft and KV" if cls.separate_draft else "")) if cls.speculative else \
            "one token a pass"
        print(f"{name}: {summary} [{kind}]")
        for option, (_kind, default, text, *_bounds) in cls.options.items():
            print(f"  --system-option {option}=...  {text} (default {default})")
    return 0


def cmd_architectures(args: argparse.Namespace) -> int:
    from specter.models.architectures import architecture_names, load_architecture
    from specter.offload.work import ModelWork

    for name in args.architectures or architecture_names():
        arch = load_architecture(name)
        work = ModelWork.of(arch.meta_model())
        dense = len(work.layers) - len(work.moe_layers)
        print(f"{arch.name}: {arch.title}; {len(work.layers)} layers ({dense} dense), top-{work.top_k} of "
              f"{work.experts_per_layer} routed experts, {_fmt_bytes(work.expert_bytes)} per FP16 expert, "
              f"{arch.parameters() / 1e9:.2f}B parameters"
              + (f" (published: {arch.published_parameters / 1e9:g}B)" if arch.published_parameters else ""))
        print(f"  source: {arch.source}")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from specter.models.loading import describe_model

    s = describe_model(args.model_dir)
    if args.json:
        print(json.dumps(s.as_dict(), indent=2))
        return 0
    total = s.routed_expert_bytes + s.non_expert_bytes
    rows = [
        ("model", f"{s.path} ({s.family}, model_type {s.model_type}, {s.dtype})"),
        ("layers", f"{s.num_layers} ({len(s.moe_layers)} MoE: {_ranges(s.moe_layers)})"),
        ("experts per layer",
         f"{s.experts_per_layer} routed, top-{s.top_k}" + (", plus shared" if s.shared_experts else "")),
        ("bytes per expert", f"{s.bytes_per_expert} ({_fmt_bytes(s.bytes_per_expert)}; {s.params_per_expert} params)"),
        ("routed expert bytes", f"{s.routed_expert_bytes} ({_fmt_bytes(s.routed_expert_bytes)}, "
                                f"{100 * s.routed_expert_bytes / total:.1f}% of weights)"),
        ("non-expert bytes", f"{s.non_expert_bytes} ({_fmt_bytes(s.non_expert_bytes)})"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_build_model(args: argparse.Namespace) -> int:
    from specter.models.builders import build_model
    from specter.runspec.flags import key_values

    _threads_set(args)
    path = build_model(args.name, args.out, seed=args.seed, overrides=dict(key_values(args.set, "--set")))
    print(f"wrote {args.name} to {path}")
    return 0


def cmd_profile_bandwidth(args: argparse.Namespace) -> int:
    from specter.offload.policy import policy_seconds
    from specter.timing.hardware import load_profile, profile_summary
    from specter.timing.profiler import default_sizes, profile_bandwidth

    _threads_set(args)  # the CPU's figures (its matmul, its copies) are those of the threads the runs will use
    csv_path, yaml_path = profile_bandwidth(
        args.out, device=args.device, sizes=default_sizes(args.max_bytes), repeats=args.repeats, name=args.name,
        policy=lambda repeats, warmup: policy_seconds(repeats, warmup),
    )
    print(profile_summary(load_profile(yaml_path)))
    print(f"wrote {csv_path} and {yaml_path} (pass it as --hardware {yaml_path})")
    return 0


def cmd_quantize(args: argparse.Namespace) -> int:
    from specter.quant.quantize import quantize_draft

    _threads_set(args)
    calibration = {"num_sequences": args.calibration_sequences, "seq_len": args.calibration_length}
    meta = quantize_draft(args.model, args.out, method=args.method, bits=args.bits, group_size=args.group_size,
                          calibration=calibration, third_party_log=args.gptq_log, device=args.device,
                          dtype=args.dtype)
    print(f"wrote {meta.method} INT{meta.bits} draft (group {meta.group_size}) of {meta.source_model} to {args.out}: "
          f"{meta.quantized_bytes_per_expert} bytes per expert, {meta.seconds:.1f} s")
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from specter.data.prompts import load_prompts
    from specter.models.loading import load_moe_model, read_model_config
    from specter.quant.draft import load_draft
    from specter.quant.fidelity import fidelity, write_fidelity
    from specter.runspec import check_positions

    _threads_set(args)
    check_positions(read_model_config(args.model), {"--prefix-tokens": args.prefix_tokens,
                                                    "--new-tokens": args.new_tokens})  # as `run` checks its own
    target = load_moe_model(args.model, dtype=getattr(torch, args.dtype))
    draft = load_draft(target, args.draft)
    tokenizer = AutoTokenizer.from_pretrained(args.model, local_files_only=True)
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


def _timing(row: dict) -> str:
    return f"{'simulated' if row['simulated'] else 'measured'} on {row['hardware']}"


def _threads_set(args: argparse.Namespace) -> None:
    from specter import determinism

    determinism.use(args.threads)


def cmd_compare(args: argparse.Namespace) -> int:
    from specter.runs import compare
    from specter.runspec.flags import from_args, split_list

    _threads_set(args)
    systems = split_list(args.systems, str, "--systems")
    rows = compare(from_args(args, systems[0]), systems, args.out)
    print(f"{_timing(rows[0])}; means over prompts; misses and bytes summed over prompts")
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


def cmd_run(args: argparse.Namespace) -> int:
    from specter.runs import run, summary
    from specter.runspec.flags import from_args

    _threads_set(args)
    records = run(from_args(args, args.system, args.out))
    r = summary(args.system, records)
    print(f"{args.system}: mean TPOT {r['tpot_ms']:.3f} ms ({_timing(r)}; lower bound {r['lower_bound_tpot_ms']:.3f} "
          f"ms) over {len(records)} prompts, {r['slots_per_layer']}/{records[0].experts_per_layer} experts per layer "
          f"resident\nwrote {args.out}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from specter.errors import SpecterError
    from specter.runs import grid, sweep
    from specter.runspec import Arm
    from specter.runspec.flags import split_list, sweep_from_args

    _threads_set(args)
    if args.out is None and args.memo_out is None:
        raise SpecterError("give --out FILE.jsonl (the records), --memo-out FILE (the numerics), or both")
    base, axes, options = sweep_from_args(args, split_list(args.systems, str, "--systems"), args.out or "")
    specs = grid(base, axes, options, [Arm.parse(text) for text in args.arm or ()])
    records = sweep(specs, args.out, args.memo_out)
    print(f"{len(specs)} runs, {len(records)} records"
          + (f"; wrote {args.out}" if args.out else "") + (f"; wrote {args.memo_out}" if args.memo_out else ""))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from specter.report.tables import build_table, read_table, write_table

    table = build_table(args.experiment, args.inputs)
    write_table(table, args.out)
    print(f"{args.experiment}: {len(table)} rows from {len(args.inputs)} files; wrote {args.out}")
    if args.figure or args.html:
        written = read_table(args.out)  # figure and page drawn from the table as written
    if args.figure:
        from specter.report.figures import plot

        plot(args.experiment, written, args.figure)
        print(f"wrote {args.figure}")
    if args.html:
        from specter.experiments import EXPERIMENTS
        from specter.report.html import write_table_html

        entry = EXPERIMENTS[args.experiment]
        write_table_html(written, args.html, f"{args.experiment}: {entry.figure.title}", entry.caption)
        print(f"wrote {args.html}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from specter.report.figures import plot
    from specter.report.tables import read_table

    plot(args.experiment, read_table(args.table), args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specter.io import atomic_write_text
    from specter.report.summary import readme_table, summary

    if args.table is not None and not args.readme:
        raise SpecterError("--from FILE.csv gives the README's table its figures; add --readme (or give a results "
                           "DIR alone for the whole summary)")
    if (args.results is None) == (args.table is None):
        raise SpecterError("summary takes a results DIR or, with --readme, --from FILE.csv (one of the two): e.g. "
                           "`specter summary results` or `specter summary --readme --from docs/results/main.csv`")
    if args.readme:
        text = readme_table(args.table if args.table is not None else Path(args.results) / "tables" / "main.csv")
    else:
        text = summary(args.results)
    if args.out:
        atomic_write_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    from specter.report.diff import DEFAULT_IGNORED, diff_results

    ignored = (*DEFAULT_IGNORED, *(args.ignore or ()))
    d = diff_results(args.a, args.b, ignored)
    print(f"compared {d.record_files} record files ({d.records} records) and {d.tables} tables, leaving out "
          f"{', '.join(ignored)}")
    for line in d.differences:
        print(f"  {line}")
    print("identical" if d.identical else f"{len(d.differences)} differences")
    return 0 if d.identical else 1


def cmd_hardware(args: argparse.Namespace) -> int:
    from specter.timing.hardware import load_profile, preset_names, profile_summary

    for name in args.profiles or preset_names():
        print(profile_summary(load_profile(name)))
    return 0


def _ranges(xs: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def _count(low: int, high: int):
    """An argparse type: a whole number in [low, high] (the message names the bound it breaks)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {low} to {high}")
        return value
    parse.__name__ = "count"
    return parse


def _out(suffixes: str = "", directory: bool = False):
    """An argparse type for an output path: a file ending in one of `suffixes` (space-separated), or a directory, that
    can be written; checked before any work so a bad path costs nothing."""
    from specter.io import writable_problem

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("the path is empty")
        if suffixes and not text.endswith(tuple(suffixes.split())):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(suffixes.split())}")
        problem = writable_problem(text, directory)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text
    parse.__name__ = "output directory" if directory else "output file"
    return parse


def _model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="the target checkpoint")


def _prompt_flags(p: argparse.ArgumentParser) -> None:
    """The held-out prompts of a fidelity report (the artifact's protocol: 5 prompts of 16 tokens)."""
    from specter.data.prompts import DATASETS

    p.add_argument("--dataset", default="code", help=f"a shipped prompt set: {', '.join(DATASETS)} (default: code)")
    p.add_argument("--num-prompts", type=_count(1, 100_000), default=5,
                   help="prompts (default 5, the artifact's protocol)")
    p.add_argument("--prefix-tokens", type=_count(1, 1 << 20), default=16, help="prompt length in tokens (default 16)")


def _cores() -> int:
    """The cores this process may run on (its CPU affinity, which a batch scheduler sets), not the machine's."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_count(1, 1024), default=_cores(), metavar="N",
                   help="torch threads for the numerics (default: the cores available, here %(default)s); part of "
                        "the numerics, so records and model cards state it and the workflow fixes it")


class _SystemNames:
    """The registered systems' names as argparse `choices`, looked up when first needed: the registry imports torch,
    which `specter --help` and the torch-free commands should not wait for."""

    def _names(self) -> list[str]:
        from specter.systems import registry

        return sorted(registry())

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


def _system_list(text: str) -> str:
    """An argparse type for --systems: comma-separated registered names (the message names the first unknown one)."""
    names = _SystemNames()._names()
    for name in (n.strip() for n in text.split(",")):
        if name not in names:
            raise argparse.ArgumentTypeError(f"unknown system {name!r}: give comma-separated names from "
                                             f"{', '.join(names)}")
    return text


#: one worked example per subcommand, shown at the end of its --help (paths as the workflow lays them out)
EXAMPLES = {
    "models": "specter models",
    "systems": "specter systems",
    "architectures": "specter architectures mixtral-8x7b",
    "inspect": "specter inspect results/models/smollm2-moe --json",
    "build-model": "specter build-model smollm2-moe --out results/models/smollm2-moe --threads 1\n"
                   "specter build-model tiny-mixtral --out /tmp/tiny-mixtral",
    "quantize": "specter quantize --model results/models/smollm2-moe --method gptq --bits 4 --group-size 64 "
                "--out results/drafts/smollm2-moe/gptq-int4-g64",
    "fidelity": "specter fidelity --model results/models/smollm2-moe "
                "--draft results/drafts/smollm2-moe/gptq-int4-g64 --out /tmp/fidelity.csv",
    "run": "specter run --system specter --model results/models/smollm2-moe "
           "--draft results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
           "--resident-fraction 0.25 --out /tmp/specter.jsonl",
    "compare": "specter compare --systems on-demand,specter --model results/models/smollm2-moe "
               "--draft results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
               "--resident-per-layer 2 --out /tmp/compare",
    "sweep": "specter sweep --systems on-demand,specter --k 2,4,8,auto --model results/models/smollm2-moe "
             "--draft results/drafts/smollm2-moe/gptq-int4-g64 --dataset humaneval --hardware a100-40gb-pcie4 "
             "--resident-per-layer 2 --out /tmp/sweep.jsonl",
    "aggregate": "specter aggregate main results/experiments/main/*/*.jsonl --out /tmp/main.csv "
                 "--figure /tmp/main.png --html /tmp/main.html",
    "plot": "specter plot main --table results/tables/main.csv --out /tmp/main.png",
    "summary": "specter summary results --out /tmp/summary.md",
    "diff": "specter diff results /tmp/other-results --ignore config.memo",
    "hardware": "specter hardware a100-40gb-pcie4 my-profile.yaml",
    "profile-bandwidth": "specter profile-bandwidth --out /tmp/bandwidth --max-bytes 268435456",
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specter", description="Offloaded mixture-of-experts inference benchmark suite.",
                     epilog="`specter COMMAND --help` shows a command's options and an example.")
    parser.add_argument("--version", action="version", version=f"specter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _model_commands(sub)
    _run_commands(sub)
    _report_commands(sub)
    _hardware_commands(sub)
    for name, p in sub.choices.items():
        noise = p.add_mutually_exclusive_group()
        noise.add_argument("-q", "--quiet", action="store_const", dest="verbosity", const=-1, default=0,
                           help="warnings and errors only: no phases or progress")
        noise.add_argument("-v", "--verbose", action="store_const", dest="verbosity", const=1,
                           help="debug lines too")
        p.formatter_class = _HelpFormatter  # keeps the example's lines as written
        p.epilog = "example:\n" + "\n".join(f"  {line}" for line in EXAMPLES[name].split("\n"))
    return parser


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The example's lines as written, and option help wrapped between words only (a name such as moe-infinity is
    never split at its hyphen)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def _model_commands(sub) -> None:
    p = sub.add_parser("models", help="list the supported MoE architectures")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("systems", help="the systems `run --system` takes: what each does and its options")
    p.set_defaults(func=cmd_systems)

    p = sub.add_parser("architectures", help="the published architectures a run can be priced at (--cost-as)")
    p.add_argument("architectures", nargs="*", metavar="NAME|FILE", help="shipped names or config.json paths "
                                                                          "(default: every shipped one)")
    p.set_defaults(func=cmd_architectures)

    p = sub.add_parser("inspect", help="layers, experts, top-k and bytes of a local checkpoint (no weights are read)")
    p.add_argument("model_dir", metavar="DIR", help="a checkpoint directory written by save_pretrained")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)

    # (builders are named here without importing them: the CLI starts without torch for the commands that need none)
    p = sub.add_parser("build-model", help="build a model checkpoint offline: smollm2-moe (the default model), "
                                           "smollm2-moe-16x2, -64x6, -60x4 (proxies of Phi-3.5-MoE, DeepSeek-V2-Lite "
                                           "and Qwen1.5-MoE's routing) or tiny-<arch> (a tiny random one)")
    p.add_argument("name", metavar="NAME", help="smollm2-moe[-16x2|-64x6|-60x4] or tiny-<arch>, e.g. tiny-mixtral")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="output directory; a model already there is replaced once the new one is complete")
    p.add_argument("--seed", type=_count(0, 2**63 - 1), default=0, help="seed of every random choice (default 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a build setting of a smollm2-moe model (e.g. distill_steps=30); repeatable")
    _threads(p)
    p.set_defaults(func=cmd_build_model)

    from specter.quant.meta import METHODS
    from specter.runspec import DTYPES

    p = sub.add_parser("quantize", help="quantize the routed experts into a draft (GPTQ via GPTQModel, or RTN)")
    _model_flag(p)
    p.add_argument("--method", default="gptq", choices=METHODS,
                   help="gptq (GPTQModel, calibrated) or rtn (round-to-nearest); default gptq")
    p.add_argument("--bits", type=int, default=4, choices=(2, 3, 4, 8), help="bits per weight (default 4)")
    p.add_argument("--group-size", type=_count(1, 1 << 20), default=128, metavar="N",
                   help="inputs per quantization group (default 128; it must divide the experts' input widths)")
    p.add_argument("--calibration-sequences", type=_count(1, 100_000), default=64, metavar="N",
                   help="GPTQ calibration sequences (default 64)")
    p.add_argument("--calibration-length", type=_count(2, 1 << 20), default=256, metavar="N",
                   help="tokens per calibration sequence (default 256)")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="output directory for experts.safetensors and meta.json; a draft already there is replaced "
                        "once the new one is complete")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="where GPTQModel calibrates (default auto: CUDA where there is a GPU, else the CPU)")
    p.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="precision of GPTQ's calibration forwards (default auto: float32 on the CPU, GPTQModel's "
                        "choice on CUDA, bfloat16 unless the checkpoint is float16); the draft's meta.json records "
                        "both")
    p.add_argument("--gptq-log", metavar="FILE", type=_out(),
                   help="where GPTQModel's own output goes (default: beside the draft, OUT.gptqmodel.log); the "
                        "console shows phases and the layers done with an ETA")
    _threads(p)
    p.set_defaults(func=cmd_quantize)

    p = sub.add_parser("fidelity", help="how well a draft predicts its target: expert sets, top-1, acceptance vs K")
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
    p.set_defaults(func=cmd_fidelity)


#: run, compare and sweep: their own flags; every run setting comes from `specter.runspec.flags.add_cli_args`
_RUN_COMMANDS = {
    "run": ("run one system over a prompt set and write one JSON record per prompt", cmd_run, [
        ("--system", dict(required=True, metavar="NAME", choices=_SystemNames(),
                          help="one of %(choices)s (`specter systems` says what each does)")),
        ("--out", dict(required=True, metavar="FILE.jsonl", type=_out(".jsonl"),
                        help="the records, one JSON line per prompt"))]),
    "compare": ("run several systems on the same prompts and print a table", cmd_compare, [
        ("--systems", dict(required=True, metavar="A,B,...", type=_system_list,
                           help="comma-separated names from `specter systems`")),
        ("--out", dict(required=True, metavar="DIR", type=_out(directory=True),
                        help="directory for one JSONL per system"))]),
    "sweep": ("run a grid of systems and settings in one process (numerics computed once); list-valued options take "
              "comma-separated values", cmd_sweep, [
        ("--systems", dict(required=True, metavar="A,B,...", type=_system_list,
                           help="comma-separated names from `specter systems`")),
        ("--out", dict(metavar="FILE.jsonl", type=_out(".jsonl"), help="every run's records in one JSONL")),
        ("--memo-out", dict(metavar="FILE.json.gz", type=_out(".json.gz"),
                             help="save the numerics the runs used, for later `--memo`")),
        ("--arm", dict(action="append", metavar="NAME[:SETTING=VALUE,...]",
                       help="a named set of settings every point of the grid also runs in (prefetch, draft_kernel "
                            "or system options), e.g. 'no prefetch:prefetch=none'; records name their arm "
                            "(config.arm); repeatable, run in order"))]),
}


def _run_commands(sub) -> None:
    from specter.runspec.flags import add_cli_args

    for name, (help_text, func, own) in _RUN_COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        for flag, kwargs in own:
            p.add_argument(flag, **kwargs)
        add_cli_args(p, name)
        _threads(p)
        p.set_defaults(func=func)


def _report_commands(sub) -> None:
    from specter.experiments import EXPERIMENTS

    p = sub.add_parser("aggregate", help="one experiment's tidy table (CSV) from its run records or fidelity summaries")
    p.add_argument("experiment", choices=EXPERIMENTS, help="the experiment")
    p.add_argument("inputs", nargs="+", metavar="FILE", help="records (.jsonl) or, for fidelity, summaries (.json)")
    p.add_argument("--out", required=True, metavar="FILE.csv", type=_out(".csv"), help="the table")
    p.add_argument("--figure", metavar="FILE.png", type=_out(".png"),
                   help="also draw the experiment's figure from the table")
    p.add_argument("--html", metavar="FILE.html", type=_out(".html"),
                   help="also write the table as an HTML page (units in the headers, sortable; for the report)")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("plot", help="one experiment's figure (PNG) from its table")
    p.add_argument("experiment", choices=EXPERIMENTS, help="the experiment")
    p.add_argument("--table", required=True, metavar="FILE.csv", help="from `specter aggregate`")
    p.add_argument("--out", required=True, metavar="FILE.png", type=_out(".png"), help="the figure")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("summary", help="the headline numbers of a results tree as Markdown: hashes of its models, "
                       "drafts and tables; main, ablation, k_sweep, sensitivity and calibration (no wall-clock times); "
                       "--readme: only the README's results table")
    p.add_argument("results", metavar="DIR", nargs="?",
                   help="the results directory (holding tables/, models/, drafts/)")
    p.add_argument("--readme", action="store_true",
                   help="print only the README's results table, from DIR/tables/main.csv or --from")
    p.add_argument("--from", dest="table", metavar="FILE.csv",
                   help="with --readme: main's table to read instead of a results tree's (docs/results/main.csv)")
    p.add_argument("--out", metavar="FILE.md", type=_out(".md"), help="write it there (default: print it)")
    p.set_defaults(func=cmd_summary)


def _hardware_commands(sub) -> None:
    p = sub.add_parser("diff", help="whether two results directories hold the same records and tables (exit 1 if not)")
    p.add_argument("a", metavar="DIR", help="a results directory (e.g. results/)")
    p.add_argument("b", metavar="DIR", help="another one")
    p.add_argument("--ignore", action="append", metavar="FIELD",
                   help="a record field to leave out, dotted (e.g. config.memo); repeatable")
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("hardware", help="show hardware profiles: the presets, or the given preset names or YAML files")
    p.add_argument("profiles", nargs="*", metavar="PRESET|FILE",
                   help="what every --hardware option takes: a preset name or a profile YAML (default: all presets)")
    p.set_defaults(func=cmd_hardware)

    p = sub.add_parser("profile-bandwidth", help="measure this machine and write a hardware profile YAML")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="directory for bandwidth.csv and profile.yaml")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="default: cuda if available")
    p.add_argument("--max-bytes", type=_count(4096, 1 << 36), default=1 << 30,
                   help="largest transfer size (default 1 GiB)")
    p.add_argument("--repeats", type=_count(10, 100_000), default=10,
                   help="timed repeats per size, median taken (>= 10)")
    p.add_argument("--name", default=None, help="profile name (default: measured-<device>)")
    _threads(p)
    p.set_defaults(func=cmd_profile_bandwidth)


class _Parser(argparse.ArgumentParser):
    """argparse with the suite's one-line errors: `specter: error: ...` and exit code 2 (no usage block)."""

    def error(self, message: str):
        sub = self.prog.removeprefix("specter").strip()
        print(f"specter: error: {sub + ': ' if sub else ''}{message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def main(argv: Sequence[str] | None = None) -> int:
    from specter import interrupt

    interrupt.install()  # first: a Ctrl-C or SIGTERM from here on exits 130 (143) with one line, nothing left behind
    from specter.determinism import pin_environment
    from specter.io import cache_bytecode

    cache_bytecode()  # before the heavy imports (torch, transformers): see its docstring
    try:
        pin_environment()  # before torch computes anything: the same bits on any AVX2 CPU (see determinism.py)
        args = build_parser().parse_args(argv)
        from specter import progress

        progress.configure(args.verbosity)  # phases and progress on stderr (see specter/progress.py)
        _outputs_are_not_inputs(args)
        func: Callable[[argparse.Namespace], int] = args.func
        return func(args)
    except SpecterError as err:
        print(f"specter: error: {' '.join(str(err).split())}", file=sys.stderr)  # one line, whatever it quotes
        return err.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except BrokenPipeError:  # the reader went away (`specter systems | head`): stop quietly, as `cat` does
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush of stdout must not raise again
        return 128 + 13  # SIGPIPE
    except Exception as err:
        if _caused_by_interrupt(err):  # e.g. transformers' lazy import wraps a Ctrl-C in a RuntimeError
            return _interrupted()
        raise


#: the options a command writes to
OUTPUTS = ("out", "memo_out", "gptq_log", "figure", "html")


def _outputs_are_not_inputs(args: argparse.Namespace) -> None:
    """Refuse an output that is one of the command's inputs (`run --dataset p.jsonl --out p.jsonl` replaced the prompts
    with records), before anything is read or written."""
    for key in OUTPUTS:
        out = getattr(args, key, None)
        if not out or not os.path.exists(out):
            continue
        for name, value in vars(args).items():
            if name == key:
                continue
            for item in value if isinstance(value, (list, tuple)) else (value,):
                if not isinstance(item, (str, os.PathLike)) or not item or not os.path.exists(item):
                    continue
                try:
                    same = os.path.samefile(item, out)
                except OSError:
                    continue
                if same:
                    flag = f"--{name.replace('_', '-')}" if name not in ("paths", "inputs") else "an input"
                    raise SpecterError(f"--{key.replace('_', '-')} {str(out)!r} is also {flag}: writing it would "
                                       "replace what the command reads; choose another output path")


def entry() -> None:
    """The `specter` console script: `main`, then the process ends without the interpreter's teardown (see
    `specter.interrupt.exit_process`)."""
    from specter.interrupt import exit_process

    exit_process(main())


def _interrupted() -> int:
    from specter.interrupt import INTERRUPTED

    print(INTERRUPTED, file=sys.stderr)
    return 130


def _caused_by_interrupt(err: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in `err`'s chain of causes and contexts."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False
