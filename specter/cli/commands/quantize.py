"""`specter quantize`: quantize the routed experts into a draft (GPTQ via GPTQModel, or RTN)."""

from __future__ import annotations

import argparse

from specter.cli.arguments import _count, _model_flag, _out, _threads, set_threads

NAME = "quantize"
HELP = "quantize the routed experts into a draft (GPTQ via GPTQModel, or RTN)"
EXAMPLE = ("specter quantize --model results/models/smollm2-moe --method gptq --bits 4 --group-size 64 --out "
           "results/drafts/smollm2-moe/gptq-int4-g64")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specter.quant.meta import METHODS
    from specter.runspec import DTYPES

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


def main(args: argparse.Namespace) -> int:
    from specter.quant.quantize import quantize_draft

    set_threads(args)
    calibration = {"num_sequences": args.calibration_sequences, "seq_len": args.calibration_length}
    meta = quantize_draft(args.model, args.out, method=args.method, bits=args.bits, group_size=args.group_size,
                          calibration=calibration, third_party_log=args.gptq_log, device=args.device,
                          dtype=args.dtype)
    print(f"wrote {meta.method} INT{meta.bits} draft (group {meta.group_size}) of {meta.source_model} to {args.out}: "
          f"{meta.quantized_bytes_per_expert} bytes per expert, {meta.seconds:.1f} s")
    return 0
