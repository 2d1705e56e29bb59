"""`specter quantize`: the draft's routed experts, quantized by GPTQ (GPTQModel) or round-to-nearest, plus `meta.json`.

Only routed experts are quantized and written; every other tensor of the draft is the target's own (see `draft.py`).
Both methods use GPTQ's symmetric grid per group of `group_size` inputs (scale = max|w| / ((2^bits - 1) / 2), zero point
2^(bits-1)), so they differ only in GPTQ's error compensation. Output: `experts.safetensors` with keys
`layers.{L}.experts.{e}.{gate_proj|up_proj|down_proj}.{qweight|qzeros|scales|g_idx|bias}` in the GPTQ v1 format, and
`meta.json` (method, bits, group size, source model and its hash, calibration set, versions).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specter import determinism
from specter.errors import SpecterError
from specter.io import atomic_dir, files_sha256, publish, temporary
from specter.models.integrity import check_card, model_hash
from specter.models.loading import load_moe_model, read_model_config
from specter.quant.meta import BOUND_KEY, METHODS, DraftMeta, versions
from specter.quant.packing import SUPPORTED_BITS, PackedLinear, pack
from specter.runspec import check_positions

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
DEFAULT_CALIBRATION = dict(corpus="code", num_sequences=64, seq_len=256)


def rtn_quantize(weight: torch.Tensor, bits: int, group_size: int) -> PackedLinear:
    """Round-to-nearest on GPTQ's symmetric grid, per output row and group of `group_size` inputs. weight [out, in]."""
    out_features, in_features = weight.shape
    maxq = 2**bits - 1
    w = weight.detach().float().reshape(out_features, in_features // group_size, group_size)  # [out, groups, g]
    xmax = w.abs().amax(dim=-1)  # [out, groups]
    xmax = torch.where(xmax == 0, torch.ones_like(xmax), xmax)
    scale = (2 * xmax / maxq).half().float()  # stored as float16: quantize against the stored scale
    zero = torch.full_like(scale, (maxq + 1) // 2, dtype=torch.int64)
    codes = torch.clamp(torch.round(w / scale[..., None]) + zero[..., None], 0, maxq).to(torch.int64)
    return pack(codes.reshape(out_features, in_features), zero, scale, group_size, bits)


def check_request(model_dir: str | Path, method: str, bits: int, group_size: int,
                  calibration: dict | None = None) -> dict:
    """Validate a quantization request before any work (and before any file is written); returns the model's
    config."""
    config = read_model_config(model_dir)
    check_card(model_dir)
    if method not in METHODS:
        raise SpecterError(f"unknown method {method!r}; methods: {', '.join(METHODS)}")
    if bits not in SUPPORTED_BITS:
        raise SpecterError(f"--bits {bits} is not supported; choose one of {', '.join(map(str, SUPPORTED_BITS))}")
    widths = _expert_widths(config)
    bad = [w for w in widths if w % group_size]
    if group_size < 1 or bad:
        raise SpecterError(
            f"--group-size {group_size} does not divide the expert input widths {sorted(set(widths))}; "
            f"choose a divisor of {_gcd(widths)} (e.g. {_gcd(widths)})"
        )
    if method == "gptq" and calibration is not None:  # GPTQ's calibration forwards run whole sequences
        check_positions(config, {"--calibration-length": calibration["seq_len"]})
    return config


def _expert_widths(config: dict) -> list[int]:
    """Input widths of the expert projections: hidden (gate, up) and the expert's intermediate size (down)."""
    from specter.models.adapter import ARCHITECTURES

    spec = ARCHITECTURES[config["model_type"]]
    return [config["hidden_size"], config[spec.intermediate_key]]


def _gcd(xs: list[int]) -> int:
    import math

    return math.gcd(*xs)


def quantize_draft(model_dir: str | Path, out_dir: str | Path, method: str = "gptq", bits: int = 4,
                   group_size: int = 128, calibration: dict | None = None, progress: bool = True,
                   third_party_log: str | Path | None = None, device: str = "auto", dtype: str = "auto") -> DraftMeta:
    """Quantize the routed experts of `model_dir` into `out_dir`; returns the sidecar written there. A draft already
    there is replaced, atomically, once the new one is complete; any other non-empty directory is refused. GPTQModel's
    own output goes to `third_party_log` (default: `gptq_log_path(out_dir)`, beside the draft). GPTQ calibrates on
    `device` (auto: CUDA where there is a GPU, else the CPU) at `dtype` (auto: float32 on the CPU, where bfloat16
    runs on oneDNN's AVX2 path under the pinned numerics, 2.8 times slower; GPTQModel's choice on CUDA, bfloat16
    unless the checkpoint is float16); the sidecar's `numerics` records both. RTN needs neither: it rounds the float32
    weights."""
    calibration = {**DEFAULT_CALIBRATION, **(calibration or {})}
    check_request(model_dir, method, bits, group_size, calibration)
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecterError("--device cuda, but torch sees no CUDA device here (torch.cuda.is_available() is false); "
                           "give --device cpu or auto")
    out = Path(out_dir)
    draft_files = ("meta.json", "experts.safetensors")  # a directory with one of these holds a draft
    if out.is_dir() and any(out.iterdir()) and not any((out / n).is_file() for n in draft_files):
        raise SpecterError(f"{str(out)!r} is a non-empty directory that holds no draft; choose another --out (a "
                           "draft already there is replaced, anything else is left alone)")
    t0 = time.perf_counter()
    if method == "rtn":
        packed = _quantize_rtn(model_dir, bits, group_size)
        calibration_used, calibration_numerics = None, {}
    else:
        log_path = Path(third_party_log) if third_party_log else gptq_log_path(out)
        packed, calibration_numerics = _quantize_gptq(model_dir, out, bits, group_size, calibration, progress,
                                                      log_path, device, dtype)
        calibration_used = calibration
    _check_finite_codes(packed, model_dir)
    tensors = {}
    per_expert: dict[str, int] = {}
    for (layer, expert, proj), (p, bias) in sorted(packed.items()):
        key = f"layers.{layer}.experts.{expert}.{proj}"
        for name, t in p.tensors().items():
            tensors[f"{key}.{name}"] = t.contiguous()
        nbytes = p.nbytes()
        if bias is not None:
            tensors[f"{key}.bias"] = bias.detach().to(torch.float16).contiguous()
            nbytes += tensors[f"{key}.bias"].numel() * 2
        per_expert[f"{layer}.{expert}"] = per_expert.get(f"{layer}.{expert}", 0) + nbytes
    sizes = sorted(set(per_expert.values()))
    meta = DraftMeta(
        method=method,
        bits=bits,
        group_size=group_size,
        sym=True,
        source_model=str(Path(model_dir).resolve()),
        source_hash=model_hash(model_dir),
        calibration=calibration_used,
        quantized_bytes_per_expert=max(sizes),
        experts_sha256="",  # set once the experts are written
        seconds=round(time.perf_counter() - t0, 3),
        versions=versions(),
        numerics={**determinism.settings(), **calibration_numerics},
    )
    with atomic_dir(out) as tmp:  # a killed quantize leaves nothing that looks like a draft
        save_file(tensors, str(tmp / "experts.safetensors"), metadata={BOUND_KEY: meta.bound()})
        meta = replace(meta, experts_sha256=files_sha256([tmp / "experts.safetensors"]))
        meta.write(tmp)
    return meta


def _check_finite_codes(packed: dict, model_dir) -> None:
    """Every scale and bias of the quantized experts finite (a float16 scale overflows past 65504, a NaN weight makes
    a NaN scale), before anything is written."""
    from specter.models.integrity import first_nonfinite

    for (layer, expert, proj), (p, bias) in sorted(packed.items()):
        bad = first_nonfinite([*p.tensors().items(), ("bias", bias)])
        if bad is not None:
            raise SpecterError(f"quantizing {model_dir}: layer {layer} expert {expert} {proj}.{bad} holds NaN or "
                               "infinite values (weights beyond float16's range, or damaged); nothing was written")


def _quantize_rtn(model_dir, bits, group_size) -> dict:
    """{(layer, expert, proj): (PackedLinear, bias)} from the target's weights in the per-expert layout GPTQModel
    uses."""
    moe = load_moe_model(model_dir, dtype=torch.float32)
    packed = {}
    for layer in moe.moe_layers:
        for e in range(layer.num_experts):
            for proj, (weight, bias) in layer.defused_projections(e).items():
                packed[(layer.layer_index, e, proj)] = (rtn_quantize(weight, bits, group_size), bias)
    return packed


_EXPERT_KEY = re.compile(r"^model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.(\w+)$")


def gptq_log_path(out_dir: str | Path) -> Path:
    """Where GPTQModel's own output goes by default: beside the draft directory, `<out>.gptqmodel.log`."""
    out = Path(out_dir)
    return out.with_name(out.name + ".gptqmodel.log")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def _log_tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(_ANSI.sub(" ", text[-4 * chars:]).split())[-chars:]


# Runs a module of the suite as `python -m` would, from any working directory, importing the suite this process runs:
# argv[1] is that suite's root. The root goes on sys.path only where `specter` would otherwise come from elsewhere or
# nowhere (a checkout run as `python -m specter` without an install; a second copy of the suite; a `specter/` directory
# without the package, found as a namespace), so an installed suite's site-packages never goes ahead of the standard
# library. This assumes the child's sys.path is the parent's (the same interpreter, started without -E, -s or -I).
_BOOTSTRAP = """\
import importlib.util, os, runpy, sys
root, module = sys.argv.pop(1), sys.argv.pop(1)
spec = importlib.util.find_spec("specter")
if spec is None or spec.origin is None or os.path.dirname(os.path.dirname(os.path.realpath(spec.origin))) != root:
    sys.path.insert(0, root)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def worker_command(module: str, *args: str, root: str | Path | None = None) -> list[str]:
    """The command that runs `module` of the suite at `root` (default: this process's) with `args`, whatever the
    child's working directory (the GPTQ worker runs in a temporary one, where `python -m` finds only an installed
    suite, possibly another copy than this one)."""
    root = os.path.realpath(root or Path(__file__).resolve().parents[2])
    return [sys.executable, "-c", _BOOTSTRAP, root, module, *args]


def _run_worker(argv: list[str], cwd: Path, log_path: Path, progress: bool) -> tuple[int, dict, str]:
    """Run the GPTQ worker in its own process group, its output (GPTQModel's) into `log_path`, and follow the progress
    lines it writes to a pipe of its own: phases, then one line per layer. If this process is interrupted or
    terminated meanwhile, the whole group is killed before the exception goes on (and the worker dies with us if we
    are killed outright). The worker's temporary files (GPTQModel's offloaded layers, a weight copy per module) go
    under `cwd` (its TMPDIR), which the caller removes.

    The log is written beside `log_path` under a temporary name and moved there when the worker ends: on success, or
    on failure where no file was there before (a failed run never replaces an earlier log; its error quotes the
    log's end). Returns the exit status, the numerics the worker reports and, for a failure, where its log is and
    how it ends."""
    from specter.progress import Progress, log

    read_end, write_end = os.pipe()
    request = json.loads(argv[-1])
    argv = [*argv[:-1], json.dumps({**request, "progress_fd": write_end})]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    (cwd / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(cwd / "tmp")}  # GPTQModel's `gptqmodel_*` directories: inside ours
    bar, numerics = None, {}
    with temporary(log_path) as partial_log:
        if progress:
            log.info("GPTQ: GPTQModel's own output goes to %s once it ends (meanwhile to %s)", log_path, partial_log)
        with open(partial_log, "w") as log_file, subprocess.Popen(
                argv, cwd=cwd, stdout=log_file, stderr=subprocess.STDOUT, pass_fds=(write_end,), env=env,
                start_new_session=True) as proc:
            os.close(write_end)
            try:
                with os.fdopen(read_end) as lines:
                    for line in lines:
                        kind, _, rest = line.strip().partition(" ")
                        if kind == "numerics":  # where and at what precision GPTQModel calibrated
                            device_used, dtype_used = rest.split()
                            numerics = {"calibration_device": device_used, "calibration_dtype": dtype_used}
                        if not progress:
                            continue
                        if kind == "phase":
                            if bar is not None:  # the layers are done once the worker moves on
                                bar.update(bar.total - bar.done)
                                bar.close()
                                bar = None
                            log.info("GPTQ: %s", rest)
                        elif kind == "layers":
                            bar = Progress("GPTQ layers", int(rest), unit="layer")
                        elif kind == "layer" and bar is not None:  # layer I started: layers 0..I-1 are done
                            bar.update(int(rest) - bar.done)
                proc.wait()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
            finally:
                if bar is not None:
                    bar.close()
        tail = "" if proc.returncode == 0 else _log_tail(partial_log)
        kept = proc.returncode == 0 or not log_path.exists()
        if kept:
            publish(partial_log, log_path)
    where = f"its log {str(log_path)!r}" if kept else \
        f"its log (not kept: {str(log_path)!r}, from an earlier run, is left as it was)"
    return proc.returncode, numerics, f"{where} ends: {tail}"


def _quantize_gptq(model_dir, out: Path, bits, group_size, calibration, progress, log_path: Path, device: str,
                   dtype: str) -> tuple[dict, dict]:
    """GPTQ through GPTQModel in a child process, restricted to routed experts; reads back its checkpoint.

    A child process because importing GPTQModel patches transformers' MoE block classes process-wide (its defuser),
    which would change every model loaded afterwards in this process. It works in a temporary directory beside `out`
    (named as `specter.io` names its temporaries: removed on every exit, and by the next run after a SIGKILL), which
    also holds GPTQModel's own temporary files.
    """
    with temporary(out, directory=True) as tmp:
        tmp = tmp.resolve()  # the worker runs in it: a relative path would name a directory inside itself
        request = dict(model_dir=str(Path(model_dir).resolve()), out_dir=str(tmp), bits=bits,
                       group_size=group_size,
                       threads=torch.get_num_threads(), parent_pid=os.getpid(), device=device, dtype=dtype,
                       **calibration)
        returncode, numerics, tail = _run_worker(
            worker_command("specter.quant.gptq_worker", json.dumps(request)), tmp, log_path, progress)
        if returncode != 0:
            raise SpecterError(f"GPTQModel failed on {model_dir} (exit {returncode}); {tail}")
        packed: dict = {}
        fields: dict = {}
        for path in sorted(tmp.glob("*.safetensors")):
            with safe_open(str(path), "pt") as f:
                for key in f.keys():
                    m = _EXPERT_KEY.match(key)
                    if m:
                        fields.setdefault((int(m[1]), int(m[2]), m[3]), {})[m[4]] = f.get_tensor(key)
        if not fields:
            raise SpecterError(f"GPTQModel wrote no quantized experts for {model_dir}; report this with its config")
        for k, f in fields.items():
            if "qweight" not in f:
                raise SpecterError(f"GPTQModel left expert {k} unquantized; report this with the model's config")
            packed[k] = (PackedLinear(f["qweight"], f["qzeros"], f["scales"], f["g_idx"], bits), f.get("bias"))
        return packed, numerics
