"""What each `specter` command does: call one library function with the parsed flags and print its outcome."""

from __future__ import annotations

import argparse
import contextlib
import json

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


def cmd_plan_memory(args: argparse.Namespace) -> int:
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
    from specter.timing.hardware import load_profile, preset_names, profile_summary
    from specter.timing.profiler import default_sizes, profile_bandwidth

    _threads_set(args)  # the CPU's figures (its matmul, its copies) are those of the threads the runs will use
    name = args.name
    if name is not None and not (name.isascii() and name.isprintable() and name.strip() and not set(name) & set("|`")):
        raise SpecterError(f"--name {name!r:.60} is not a name of printable ASCII letters, digits and signs (tables "
                           "and reports print it); give a plain name")
    like = next((n for n in preset_names() if name is not None and n.lower() == name.strip().lower()), None)
    if like is not None:  # checked before minutes of measuring, not by the profile's reader after them
        raise SpecterError(f"--name {name!r} is the preset {like!r}'s name, and a measured profile has its own: its "
                           f"records would pass for the preset's; give another (e.g. --name {like}-measured)")
    if args.dispatch_model is not None:
        from specter.models.loading import read_model_config

        read_model_config(args.dispatch_model)  # a checkpoint's config, or one line saying what is wrong
    csv_path, yaml_path = profile_bandwidth(
        args.out, device=args.device, sizes=default_sizes(args.max_bytes), repeats=args.repeats, name=args.name,
        policy=lambda repeats, warmup: policy_seconds(repeats, warmup), dispatch_model=args.dispatch_model,
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

    from specter.data.prompts import load_prompts
    from specter.models.loading import load_moe_model, load_tokenizer, read_model_config
    from specter.quant.draft import load_draft
    from specter.quant.fidelity import fidelity, write_fidelity
    from specter.runspec import check_positions

    _threads_set(args)
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
    prompts = len({record.prompt_index for record in records})
    timed = f" x {len(records) // prompts} timed repeats" if len(records) > prompts else ""
    host = records[0].extra.get("host_layers")  # a system placing whole layers' experts there
    where = (f"{r['slots_per_layer']}/{records[0].experts_per_layer} experts per layer resident" if host is None else
             f"the routed experts of {len(host)} of {records[0].config['memory']['moe_layers']} MoE layers on the host")
    print(f"{args.system}: mean TPOT {r['tpot_ms']:.3f} ms ({_timing(r)}; lower bound {r['lower_bound_tpot_ms']:.3f} "
          f"ms) over {prompts} prompt{'s' if prompts > 1 else ''}{timed}, {where}\nwrote {args.out}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from specter.runs import grid, sweep
    from specter.runspec import Arm
    from specter.runspec.flags import split_list, sweep_from_args

    _threads_set(args)
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


@contextlib.contextmanager
def _of_another_shape(what: str, fix: str):
    """A field or cell of a type or shape the suite never writes, met past the files' checks: one line, no traceback."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError, ArithmeticError) as err:
        raise SpecterError(f"{what} of another type or shape than this suite writes ({type(err).__name__}: "
                           f"{str(err)[:120]}); {fix}") from None


def cmd_aggregate(args: argparse.Namespace) -> int:
    from specter.report.tablefile import read_table, write_table
    from specter.report.tables import build_table

    with _of_another_shape(f"the inputs of {args.experiment} ({', '.join(map(str, args.inputs))[:200]}) hold a field",
                           "the files are damaged or were edited: run the rules that write them again"):
        table = build_table(args.experiment, args.inputs)
    write_table(table, args.out)
    print(f"{args.experiment}: {len(table)} rows from {len(args.inputs)} files; wrote {args.out}")
    if args.figure or args.html:
        written = read_table(args.out)  # figure and page drawn from the table as written
    if args.figure:
        from specter.report.figures import plot

        with _of_another_shape(f"{args.out} holds a cell", f"the records are not {args.experiment}'s: aggregate that "
                               "experiment's records"):
            plot(args.experiment, written, args.figure)
        print(f"wrote {args.figure}")
    if args.html:
        from specter.experiments import EXPERIMENTS
        from specter.report.html import write_table_html

        entry = EXPERIMENTS[args.experiment]
        write_table_html(written, args.html, f"{args.experiment}: {entry.figure.title}", entry.caption,
                         entry.figure.x)
        print(f"wrote {args.html}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from specter.report.figures import plot
    from specter.report.tablefile import read_table

    table = read_table(args.table)
    with _of_another_shape(f"{args.table} holds a cell", "write it again with `specter aggregate`"):
        plot(args.experiment, table, args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specter.io import atomic_write_text
    from specter.report.readme import readme_table
    from specter.report.summary import summary

    if args.table is not None and not args.readme:
        raise SpecterError("--from FILE.csv gives the README's table its figures; add --readme (or give a results "
                           "DIR alone for the whole summary)")
    if (args.results is None) == (args.table is None):
        raise SpecterError("summary takes a results DIR or, with --readme, --from FILE.csv (one of the two): e.g. "
                           "`specter summary results` or `specter summary --readme --from docs/results/main.csv`")
    if args.front and (args.readme or args.results is None):
        raise SpecterError("--front writes the report's front page of a results DIR; give the DIR without --readme "
                           "(e.g. `specter summary results --out results/summary.md --front results/report/front.rst`)")
    with _of_another_shape(f"a table of {args.table or args.results} holds a cell",
                           "write it again with `specter aggregate` (or rerun the workflow)"):
        if args.readme:
            text = readme_table(args.table if args.table is not None else Path(args.results) / "tables" / "main.csv")
        else:
            text = summary(args.results)
    if args.front:
        from specter.report.readme import front_page

        atomic_write_text(args.front, front_page(args.results))
        print(f"wrote {args.front}")
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
    if d.impossible:
        print(f"and {len(d.impossible)} records or tables hold what no run writes (aggregate and summary refuse "
              "them):")
        for line in d.impossible[:20]:
            print(f"  {line}")
    return 0 if d.identical and not d.impossible else 1


def cmd_routing_stats(args: argparse.Namespace) -> int:
    import json

    from specter.io import atomic_write_text
    from specter.models.routing_stats import model_routing

    _threads_set(args)
    stats = model_routing(args.model)
    atomic_write_text(args.out, json.dumps(stats, indent=1, sort_keys=True) + "\n")
    print(f"{stats['model']}: routing statistics from {stats['measured_from']}; wrote {args.out}")
    return 0


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
