"""A killed command, run again, gives what an uninterrupted run gives; and the same build gives the same bytes.

Each command runs once uninterrupted (its result and duration T are the reference), then the same command with the same
output path is killed at a few points (fractions of T, and for quantize while its GPTQ worker runs), its output path
checked to hold nothing or a complete result, and the command run again to completion: the result must equal the
reference. Results leave out what legitimately differs between runs: wall-clock seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specter.records import read_jsonl

pytestmark = pytest.mark.slow  # processes killed mid-build and mid-run, rerun: minutes (python -m pytest -m slow)


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "specter", *args]


def _run(argv: list[str], env: dict | None = None) -> float:
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return time.monotonic() - start


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _model_result(out: Path):
    """The weights' hash (the card's, for a built smollm2 model) and the files."""
    card = out / "model_card.json"
    weights = json.loads(card.read_text())["weights_sha256"] if card.is_file() else _sha(out / "model.safetensors")
    return weights, _sha(out / "config.json"), sorted(p.name for p in out.iterdir())


def _draft_result(out: Path):
    return _sha(out / "experts.safetensors"), sorted(p.name for p in out.iterdir())


def _records_result(out: Path):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in read_jsonl(out)]


def _workers_of(pid: int) -> list[int]:
    """The GPTQ worker processes a `specter quantize` with this pid started (its request names the parent)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"specter.quant.gptq_worker" in cmdline and f'"parent_pid": {pid}'.encode() in cmdline:
            found.append(int(proc.name))
    return found


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _kill_and_rerun(argv, out: Path, result, points, sig=signal.SIGKILL, during=None):
    """Reference run, then for each kill point: start, wait, kill the whole process group, check `out` holds nothing
    or the complete result, and run again; every rerun's result must equal the reference. Every run has a private
    TMPDIR: after a signal Python sees (SIGTERM, SIGINT) nothing is left beside `out` or in TMPDIR beyond what an
    uninterrupted run leaves there (torch's compile cache); after a SIGKILL the rerun has swept what it left."""
    tmp = out.parent / "private-tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    duration = _run(argv, env)
    want = result(out)
    in_tmp = _tree(tmp)
    for point in points:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                                env=env)
        if isinstance(point, str):  # an event, not a time: `during` waits for it
            during(proc)
        else:
            time.sleep(point * duration)
        os.killpg(proc.pid, sig)
        _, err = proc.communicate(timeout=120)
        if sig != signal.SIGKILL:
            assert proc.returncode == 128 + sig, (point, err.decode()[-2000:])
        if out.exists():
            assert result(out) == want, f"killed at {point}: {out} holds a different result"
        leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        if sig != signal.SIGKILL:
            assert not leftovers, f"killed at {point} by {sig.name}, left {leftovers}"
            assert _tree(tmp) == in_tmp, f"killed at {point} by {sig.name}, left {set(_tree(tmp)) - set(in_tmp)}"
        _run(argv, env)
        assert result(out) == want, f"killed at {point}, then run again: a different result"
        leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        assert not leftovers, f"killed at {point} by {sig.name}, then run again: {leftovers} still there"
        assert _tree(tmp) == in_tmp, f"killed at {point} by {sig.name}, left {set(_tree(tmp)) - set(in_tmp)}"
    return want


def test_killed_build_model_then_rerun_gives_the_same_model(tmp_path):
    out = tmp_path / "model"
    _kill_and_rerun(_argv("build-model", "tiny-mixtral", "--out", str(out)), out, _model_result, [0.4, 0.9])


def test_terminated_build_model_leaves_no_temporary_directory(tmp_path):
    """Terminated while its temporary directory exists (the build runs inside it): a point in time would be a race, as
    a second, warm build can be over before a fraction of the first one's time."""
    out = tmp_path / "model"

    def during(proc):
        deadline = time.monotonic() + 120
        while not any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "the build never made its temporary directory"
            time.sleep(0.01)

    _kill_and_rerun(_argv("build-model", "tiny-olmoe", "--out", str(out)), out, _model_result, ["temporary"],
                    sig=signal.SIGTERM, during=during)


def _wait_for_worker(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not _workers_of(proc.pid):
        assert proc.poll() is None and time.monotonic() < deadline, "the GPTQ worker never started"
        time.sleep(0.05)
    time.sleep(1.0)  # inside GPTQModel


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_killed_gptq_quantize_takes_its_worker_along_and_reruns_the_same(sig, tiny_dirs, tmp_path):
    """Killed while GPTQModel works: its worker goes too, and so do the worker's directory and GPTQModel's own
    temporaries (`gptqmodel_*`, a weight copy per module: gigabytes for a real checkpoint), at once for a signal Python
    sees, on the next run after a SIGKILL."""
    out = tmp_path / "draft"
    argv = _argv("quantize", "--model", tiny_dirs["mixtral"], "--method", "gptq", "--bits", "4", "--group-size",
                 "32", "--calibration-sequences", "4", "--calibration-length", "64", "--quiet", "--out", str(out))
    killed: list[int] = []

    def during(proc):
        _wait_for_worker(proc)
        killed.append(proc.pid)

    _kill_and_rerun(argv, out, _draft_result, ["worker"], sig=sig, during=during)
    deadline = time.monotonic() + 30
    while _workers_of(killed[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _workers_of(killed[0]), "the GPTQ worker outlived its killed parent"


@pytest.fixture(scope="module")
def draft(tiny_dirs, tmp_path_factory):
    from specter.quant.quantize import quantize_draft

    out = tmp_path_factory.mktemp("kill") / "draft"
    quantize_draft(tiny_dirs["mixtral"], out, method="rtn", bits=4, group_size=32)
    return str(out)


RUN_FLAGS = ("--dataset", "code", "--hardware", "t4-pcie3", "--num-prompts", "2", "--prefix-tokens", "8",
             "--max-new-tokens", "8", "--resident-per-layer", "2")


def test_killed_run_then_rerun_gives_the_same_records(tiny_dirs, draft, tmp_path):
    out = tmp_path / "records.jsonl"
    argv = _argv("run", "--system", "specter", "--model", tiny_dirs["mixtral"], "--draft", draft, "--k", "3",
                 *RUN_FLAGS, "--out", str(out))
    assert len(_kill_and_rerun(argv, out, _records_result, [0.6])) == 2


def test_killed_sweep_then_rerun_gives_the_same_records(tiny_dirs, draft, tmp_path):
    out = tmp_path / "sweep.jsonl"
    argv = _argv("sweep", "--systems", "on-demand,specter", "--model", tiny_dirs["mixtral"], "--draft", draft,
                 "--k", "2,4", *RUN_FLAGS, "--out", str(out))
    assert len(_kill_and_rerun(argv, out, _records_result, [0.7])) == 6


_SMALL = ("layers=1", "calibration_sequences=2", "seq_len=32", "distill_steps=2", "distill_seq_len=32",
          "eval_tokens=64", "kmeans_iters=2")
SMALL_BUILD = tuple(x for setting in _SMALL for x in ("--set", setting))


def test_two_builds_in_separate_processes_with_different_environments_give_the_same_weights(tmp_path):
    """The default model's builder, cut small, in two processes whose environments differ in everything the numerics
    pin overrides (CPU capability, MKL branch, oneDNN's instruction set, hash seed, OpenMP threads): the same
    weights_sha256."""
    hashes = []
    for i, env in enumerate([{}, {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "PYTHONHASHSEED": "123",
                                  "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX",
                                  "OMP_NUM_THREADS": "1"}]):
        out = tmp_path / f"build{i}"
        proc = subprocess.run(_argv("build-model", "smollm2-moe", *SMALL_BUILD, "--threads", "2", "--out", str(out)),
                              capture_output=True, text=True, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr[-3000:]
        # stderr is not a terminal here, as in a Snakemake log: plain lines, each phase with its duration
        assert "\r" not in proc.stderr, proc.stderr[-2000:]
        for done in ("conversion of SmolLM2-135M into smollm2-moe: done in", "per-layer fitting: 1 layer done in",
                     "distillation (2 steps): done in", "saving the checkpoint: done in",
                     "model card: perplexities, routing statistics, samples: done in"):
            assert done in proc.stderr, (done, proc.stderr[-2000:])
        hashes.append(_model_result(out)[0])
        card = json.loads((out / "model_card.json").read_text())
        assert card["numerics"]["cpu_capability"] == "AVX2" and card["numerics"]["threads"] == 2
    assert hashes[0] == hashes[1]
