"""What a numeric result depends on besides its inputs, pinned, so that the same command gives the same bits.

Float results on a CPU depend on which vectorized code path runs (torch's own kernels pick AVX2 or AVX-512 by the CPU;
MKL picks its own), and on how many threads split a reduction. The default model's builder is chaotic in those bits
(balanced k-means and top-k routing near ties turn a last-bit difference in one layer into other experts in the next),
so without pins two machines of the same kind build different checkpoints. Every numerics command of the CLI therefore
runs with:
- torch's CPU kernels on their AVX2 path (`ATEN_CPU_CAPABILITY=avx2`), MKL's conditional numerical reproducibility
  on its AVX2 branch, strict (`MKL_CBWR=AVX2,STRICT`), and oneDNN (torch's bfloat16 matmuls and the packing of its CPU
  flash attention) capped at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`), meant to give the same bits on any x86-64 CPU with
  AVX2 (held across processes and environments by a test; not held across machines: the same code and packages can
  build default models of different weights_sha256 on two AVX2 machines, for a cause not known). oneDNN picks its
  instruction set at run time from the CPU, not from torch's capability: on a CPU with AMX, bfloat16 attention
  under the AVX2 pin alone raises "pack_vnni2 is only supported when avx512 is supported" (GPTQModel's calibration
  pass in bfloat16 on such a CPU fails, so on the CPU it calibrates in float32 unless asked);
- a fixed thread count (the command's `--threads`), deterministic algorithms, and `PYTHONHASHSEED=0` for child
  processes (the GPTQ worker). Deterministic algorithms on CUDA need cuBLAS's workspace fixed
  (`CUBLAS_WORKSPACE_CONFIG=:4096:8`, NVIDIA's documented setting; without it the first GEMM on a GPU raises), so it
  is set unless the environment already sets it, native numerics or not.
These must be set before torch computes anything, so `pin_environment` runs first in `specter.cli.main`. Records and
model cards carry `settings()`: to reproduce a number, match its CPU capability and thread count. Setting
`SPECTER_NATIVE_NUMERICS=1` leaves the machine's fastest paths in place (and the records then say so).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

PINNED_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2",
              "PYTHONHASHSEED": "0"}
NATIVE = "SPECTER_NATIVE_NUMERICS"
CUBLAS_WORKSPACE = ("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def pin_environment(env: dict | None = None) -> None:
    """Pin the numerics' code paths in `env` (the process environment by default), unless native numerics were asked
    for. Call before torch is imported."""
    env = os.environ if env is None else env
    env.setdefault(*CUBLAS_WORKSPACE)  # deterministic algorithms are on either way (`use`)
    if env.get(NATIVE) == "1":
        return
    env.update(PINNED_ENV)


def use(threads: int) -> None:
    """This process's numerics: `threads` threads and deterministic algorithms."""
    import torch

    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def settings() -> dict:
    """What this process's numerics ran with, for records and model cards."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "mkl_cbwr": os.environ.get("MKL_CBWR"),
            "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA"),
            "threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "pinned": os.environ.get(NATIVE) != "1", "torch": torch.__version__}


#: what a timed live decode on a GPU runs without, and why the rest stays (records carry it)
TIMED_ON_CUDA = ("deterministic algorithms off while timed (CUDA's fastest kernels: a GPU's greedy tokens do not "
                 "depend on them); the CPU's AVX2 pins hold process-wide (a host expert's output decides tokens)")


@contextmanager
def timed_on(device: str):
    """A timed live decode on `device`: on CUDA without deterministic algorithms (their kernels are slower, and the
    live tokens are the GPU's own either way), restored after; on the CPU as pinned."""
    import torch

    if device != "cuda":
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)
