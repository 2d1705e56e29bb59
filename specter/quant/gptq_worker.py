"""Child process for `specter quantize --method gptq`: GPTQModel quantizes the routed experts and saves a checkpoint.

Run by `quantize.py` as `python -m specter.quant.gptq_worker '<json request>'` would run it, from the parent's own
suite (`worker_command`), never imported by the suite itself: GPTQModel patches transformers' MoE classes process-wide
when imported.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

from specter.bytecode import cache_bytecode

cache_bytecode()  # before torch and GPTQModel are imported (see its docstring)

import torch  # noqa: E402

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies (even by SIGKILL), and exit now if it already has: a
    killed `specter quantize` must not leave GPTQModel running. Elsewhere the parent's own cleanup is all there is."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        sys.exit(1)


def _progress_writer(fd: int | None):
    """The parent's progress pipe: one line per event (`phase TEXT`, `layers N`, `layer I`)."""
    stream = os.fdopen(fd, "w", buffering=1) if fd is not None else None

    def emit(kind: str, text) -> None:
        if stream is not None:
            stream.write(f"{kind} {text}\n")
    return emit


def _follow_layers(model, emit) -> None:
    """Say when GPTQModel first runs each decoder layer (it quantizes layer by layer, in order). A model whose layers
    are not where transformers' causal LMs keep them gets phases only."""
    hf = getattr(model, "model", None)
    layers = getattr(getattr(hf, "model", None), "layers", None)
    if layers is None:
        return
    emit("layers", len(layers))
    for i, layer in enumerate(layers):
        def first_call(module, args, kwargs, i=i):
            emit("layer", i)
            handle = getattr(module, "_specter_progress", None)
            if handle is not None:
                handle.remove()
        layer._specter_progress = layer.register_forward_pre_hook(first_call, with_kwargs=True)


def main(request: dict) -> None:
    die_with_parent(request["parent_pid"])
    emit = _progress_writer(request.get("progress_fd"))
    from specter import determinism

    determinism.use(request["threads"])  # the parent's thread count (the environment's pins come from the parent)
    # GPTQModel's CPU device pool must hold at least the 2 workers its model loader asks for, even where the caller
    # (e.g. a 1-thread Snakemake job) limits torch to one thread.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, torch.get_num_threads())))
    emit("phase", "importing GPTQModel")
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    from specter.data.corpus import calibration_token_ids

    emit("phase", f"calibration data ({request['num_sequences']} x {request['seq_len']} tokens of "
                  f"{request['corpus']})")
    tokenizer = AutoTokenizer.from_pretrained(request["model_dir"], local_files_only=True)
    ids = calibration_token_ids(tokenizer, request["corpus"], request["num_sequences"], request["seq_len"])
    samples = [{"input_ids": x, "attention_mask": [1] * len(x)} for x in ids]
    # Quantize only per-expert linears (`...experts.<e>.<proj>`): the negative rule skips every other module.
    qcfg = QuantizeConfig(bits=request["bits"], group_size=request["group_size"], sym=True, desc_act=False,
                          dynamic={r"-:^(?!.*\.experts\.\d+\.).*": {}})
    device = request.get("device", "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = request.get("dtype", "auto")
    if dtype == "auto" and device == "cpu":
        # GPTQModel would pick bfloat16, whose CPU matmuls and attention run on oneDNN, held to AVX2 by the pinned
        # numerics (specter.determinism): 14 s a layer of smollm2-moe on one thread, against 5 s in float32
        dtype = "float32"
    emit("phase", f"loading the model into GPTQModel (device {device}, dtype {dtype})")
    model = GPTQModel.load(request["model_dir"], qcfg, device=device,
                           dtype=dtype if dtype == "auto" else getattr(torch, dtype))
    # the device asked for (GPTQModel keeps layers on the meta device until it processes them) and the dtype it loaded
    emit("numerics", f"{device} {str(next(model.model.parameters()).dtype).removeprefix('torch.')}")
    emit("phase", "quantizing, layer by layer")
    _follow_layers(model, emit)
    model.quantize(samples, batch_size=1)
    emit("phase", "saving GPTQModel's checkpoint")
    model.save(request["out_dir"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
