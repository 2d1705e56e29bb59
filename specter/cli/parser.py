"""The `specter` command line's parser: every subcommand, its flags and its worked example, and the suite's one-line
argparse errors. `specter.cli.commands` holds what each command does, `specter.cli.arguments` the argument types that
check a flag's text and the flags several commands share."""

from __future__ import annotations

import argparse
import sys

from specter import __version__
from specter.cli.arguments import _count, _model_flag, _out, _prompt_flags, _system_list, _SystemNames, _threads
from specter.cli.commands import (
    cmd_aggregate,
    cmd_architectures,
    cmd_build_model,
    cmd_compare,
    cmd_diff,
    cmd_fidelity,
    cmd_hardware,
    cmd_inspect,
    cmd_models,
    cmd_plan_memory,
    cmd_plot,
    cmd_profile_bandwidth,
    cmd_quantize,
    cmd_routing_stats,
    cmd_run,
    cmd_summary,
    cmd_sweep,
    cmd_systems,
)

#: one worked example per subcommand, shown at the end of its --help (paths as the workflow lays them out)
EXAMPLES = {
    "models": "specter models",
    "systems": "specter systems",
    "architectures": "specter architectures mixtral-8x7b",
    "inspect": "specter inspect results/models/smollm2-moe --json",
    "routing-stats": "specter routing-stats --model results/models/smollm2-moe --out /tmp/routing.json",
    "plan-memory": "specter plan-memory mixtral-8x7b --hardware h100-pcie5 --context 2048",
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

    p = sub.add_parser("plan-memory", help="which card holds which published model, at how many expert slots per "
                                           "MoE layer, for a system without a draft and for Specter (the memory "
                                           "plan every run makes, the whole device its budget)")
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
    p.set_defaults(func=cmd_plan_memory)

    p = sub.add_parser("inspect", help="layers, experts, top-k and bytes of a local checkpoint (no weights are read)")
    p.add_argument("model_dir", metavar="DIR", help="a checkpoint directory written by save_pretrained")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("routing-stats", help="a checkpoint's routing locality (repeat rates, LRU and LFU hit rates, "
                                             "reuse distance) as JSON: its model card's, else measured on held-out "
                                             "text")
    _model_flag(p)
    p.add_argument("--out", required=True, metavar="FILE.json", type=_out(".json"), help="the statistics")
    _threads(p)
    p.set_defaults(func=cmd_routing_stats)

    # (builders are named here without importing them: the CLI starts without torch for the commands that need none)
    p = sub.add_parser("build-model", help="build a model checkpoint offline: smollm2-moe (the default model), "
                                           "smollm2-moe-16x2, -64x6, -60x4 (proxies of Phi-3.5-MoE, DeepSeek-V2-Lite "
                                           "and Qwen1.5-MoE's routing), smollm2-moe[-64x6]-matched (router "
                                           "locality set from a published statistic) or tiny-<arch> (a tiny random "
                                           "one)")
    p.add_argument("name", metavar="NAME", help="smollm2-moe[-16x2|-64x6|-60x4], smollm2-moe[-64x6]-matched or "
                                                "tiny-<arch>, e.g. tiny-mixtral")
    p.add_argument("--out", required=True, metavar="DIR", type=_out(directory=True),
                   help="output directory; a model already there is replaced once the new one is complete")
    p.add_argument("--seed", type=_count(0, 2**63 - 1), default=0, help="seed of every random choice (default 0)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a build setting of a smollm2-moe model (e.g. distill_steps=30, locality=-0.5); "
                        "repeatable")
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
                       "drafts and tables; the paper's claims, main, ablation, k_sweep, sensitivity and calibration "
                       "(no wall-clock times); --readme: only the README's results table (main's or the claims')")
    p.add_argument("results", metavar="DIR", nargs="?",
                   help="the results directory (holding tables/, models/, drafts/)")
    p.add_argument("--readme", action="store_true",
                   help="print only the README's results table, from DIR/tables/main.csv or --from")
    p.add_argument("--from", dest="table", metavar="FILE.csv",
                   help="with --readme: main's or the claims' table to read instead of a results tree's "
                        "(docs/results/main.csv, docs/results/claims.csv)")
    p.add_argument("--out", metavar="FILE.md", type=_out(".md"), help="write it there (default: print it)")
    p.add_argument("--front", metavar="FILE.rst", type=_out(".rst"),
                   help="also write the report's front page there (the paper's claims and their verdicts, from "
                        "DIR/tables/claims.csv; `snakemake --report` shows it first)")
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
    p.add_argument("--dispatch-model", default=None, metavar="DIR",
                   help="time the host's dispatch per kernel on two decoder layers of this checkpoint's class and "
                        "widths (its config alone; default: the default proxy's), the model a live run decodes")
    _threads(p)
    p.set_defaults(func=cmd_profile_bandwidth)


class _Parser(argparse.ArgumentParser):
    """argparse with the suite's one-line errors: `specter: error: ...` and exit code 2 (no usage block)."""

    def error(self, message: str):
        sub = self.prog.removeprefix("specter").strip()
        print(f"specter: error: {sub + ': ' if sub else ''}{message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)
