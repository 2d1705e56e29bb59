"""Child process for `specter quantize --method gptq`: GPTQModel quantizes the routed experts and saves a checkpoint.

Run as `python -m specter.quant.gptq_worker '<json request>'` by `quantize.py`, never imported by the suite itself:
GPTQModel patches transformers' MoE classes process-wide when imported.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

import torch

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


def main(request: dict) -> None:
    die_with_parent(request["parent_pid"])
    from specter.numerics import determinism

    determinism.use(request["threads"])  # the parent's thread count (the environment's pins come from the parent)
    # GPTQModel's CPU device pool must hold at least the 2 workers its model loader asks for, even where the caller
    # (e.g. a 1-thread Snakemake job) limits torch to one thread.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, torch.get_num_threads())))
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    from specter.data.corpus import calibration_token_ids

    tokenizer = AutoTokenizer.from_pretrained(request["model_dir"], local_files_only=True)
    ids = calibration_token_ids(tokenizer, request["corpus"], request["num_sequences"], request["seq_len"])
    samples = [{"input_ids": x, "attention_mask": [1] * len(x)} for x in ids]
    # Quantize only per-expert linears (`...experts.<e>.<proj>`): the negative rule skips every other module.
    qcfg = QuantizeConfig(bits=request["bits"], group_size=request["group_size"], sym=True, desc_act=False,
                          dynamic={r"-:^(?!.*\.experts\.\d+\.).*": {}})
    model = GPTQModel.load(request["model_dir"], qcfg, device="cpu")
    model.quantize(samples, batch_size=1)
    model.save(request["out_dir"])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
