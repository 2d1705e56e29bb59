"""Drafts: both methods on every tiny architecture, storage shared with the target, the packing format, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ARCHS
from specter.errors import SpecterError
from specter.models import load_moe_model
from specter.quant.draft import load_draft
from specter.quant.packing import dequantize, pack, unpack
from specter.quant.quantize import quantize_draft, rtn_quantize

GROUP = 32  # divides the tiny models' widths (64 and 32)
IDS = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114]])


@pytest.fixture(scope="module")
def drafts(tiny_dirs, tmp_path_factory):
    """{(arch, method): draft dir}; GPTQ with a small calibration so the suite stays fast."""
    root = tmp_path_factory.mktemp("drafts")
    out = {}
    for arch in ARCHS:
        for method in ("rtn", "gptq"):
            d = root / f"{arch}-{method}"
            quantize_draft(tiny_dirs[arch], d, method=method, bits=4, group_size=GROUP,
                           calibration=dict(num_sequences=8, seq_len=64), progress=False)
            out[(arch, method)] = d
    return out


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_pack_unpack_round_trip(bits):
    g = torch.Generator().manual_seed(bits)
    codes = torch.randint(0, 2**bits, (64, 64), generator=g)
    zeros = torch.randint(1, 2**bits, (64, 2), generator=g)  # v1 stores zero - 1: zero 0 is not representable
    scales = torch.rand(64, 2, generator=g).half().float()
    c, z, s = unpack(pack(codes, zeros, scales, 32, bits))
    assert torch.equal(c, codes) and torch.equal(z, zeros) and torch.equal(s, scales)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_rtn_error_shrinks_with_bits_and_stays_on_grid(bits):
    w = torch.randn(32, 128, generator=torch.Generator().manual_seed(0))
    p = rtn_quantize(w, bits, 64)
    err = ((dequantize(p) - w).norm() / w.norm()).item()
    assert err < {2: 0.75, 3: 0.3, 4: 0.15, 8: 0.01}[bits]
    codes, _, _ = unpack(p)
    assert int(codes.max()) <= 2**bits - 1 and int(codes.min()) >= 0


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_draft_loads_shares_storage_and_runs(arch, method, tiny_dirs, drafts):
    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    draft = load_draft(target, drafts[(arch, method)])
    meta = json.loads((drafts[(arch, method)] / "meta.json").read_text())
    assert meta["method"] == method and meta["bits"] == 4 and meta["group_size"] == GROUP
    assert (meta["calibration"] is None) == (method == "rtn")
    target_params = dict(target.model.named_parameters())
    shared = 0
    for name, p in draft.model.named_parameters():
        assert ".experts." not in name, f"draft expert {name} should be a dequantized buffer, not a parameter"
        assert p.data_ptr() == target_params[name].data_ptr(), f"{name} is a copy, not the target's tensor"
        shared += 1
    assert shared == len([n for n in target_params if ".experts." not in n])
    # the target keeps its own experts; the draft's are quantized ones
    assert target.moe_layers[0].fused and not draft.moe.moe_layers[0].fused
    with torch.no_grad():
        a, b = target.model(IDS).logits, draft.model(IDS).logits
        assert torch.isfinite(b).all() and not torch.equal(a, b)
        # each quantized expert is close to its target expert (end-to-end logits are not compared: one near-tie in
        # routing flips an expert choice and moves a whole position)
        x = torch.randn(7, target.config.hidden_size, generator=torch.Generator().manual_seed(0))
        for lt, ld in zip(target.moe_layers, draft.moe.moe_layers):
            for e in (0, lt.num_experts - 1):
                want, got = lt.expert_forward(e, x), ld.expert_forward(e, x)
                assert ((got - want).norm() / want.norm()).item() < 0.3, (lt.layer_index, e)
    assert draft.quantized_bytes_per_expert < target.moe_layers[0].expert_bytes(torch.float16)


def test_draft_expert_numerics_are_the_quantized_weights(tiny_dirs, drafts):
    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    draft = load_draft(target, drafts[("mixtral", "rtn")])
    layer_t, layer_d = target.moe_layers[0], draft.moe.moe_layers[0]
    for proj, (w, _) in layer_t.defused_projections(3).items():
        expected = dequantize(rtn_quantize(w, 4, GROUP))
        assert torch.equal(getattr(layer_d.expert_module(3), proj).weight, expected)


def test_draft_of_another_model_is_refused(tiny_dirs, drafts):
    target = load_moe_model(tiny_dirs["olmoe"], dtype=torch.float32)
    with pytest.raises(SpecterError, match="was made from .*mixtral"):
        load_draft(target, drafts[("mixtral", "rtn")])


def test_file_hashes_are_kept_until_a_file_changes(tmp_path, monkeypatch):
    """The model hash is read from the cache while the files are untouched; rewriting a file in place (same size),
    or replacing it, computes it again; with no cache it is computed every time."""
    from specter.io import _files_sha256
    from specter.models.integrity import model_hash

    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 1000)
    first = model_hash(model)
    assert first == _files_sha256([model / "config.json", model / "model.safetensors"])
    assert len(list((tmp_path / "cache" / "file-hashes").rglob("*"))) == 2  # one entry in its fan-out directory
    assert model_hash(model) == first
    with (model / "model.safetensors").open("r+b") as f:  # the same size, other bytes
        f.write(b"b")
    second = model_hash(model)
    assert second != first and second == _files_sha256([model / "config.json", model / "model.safetensors"])
    (model / "model.safetensors").write_bytes(b"a" * 1000)
    assert model_hash(model) == first
    monkeypatch.setenv("SPECTER_CACHE_DIR", "")
    (model / "config.json").write_text('{"x": 1}')
    assert model_hash(model) != first


def _quantize_cli(*args):
    return subprocess.run([sys.executable, "-m", "specter", "quantize", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "{missing}", "--method", "rtn"], "does not exist"),
        (["--model", "{mixtral}", "--method", "rtn", "--bits", "5"], "--bits: invalid choice: 5"),
        (["--model", "{mixtral}", "--method", "rtn", "--group-size", "48"], "--group-size 48 does not divide"),
        (["--model", "{mixtral}", "--method", "awq"], "--method: invalid choice: 'awq'"),
        pytest.param(["--model", "{mixtral}", "--method", "gptq", "--group-size", "32", "--device", "cuda"],
                     "--device cuda, but torch sees no CUDA device here",
                     marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")),
        (["--model", "{mixtral}", "--method", "gptq", "--dtype", "float64"], "--dtype: invalid choice: 'float64'"),
    ],
)
def test_bad_quantize_input_is_one_line_exit_2(args, message, tiny_dirs, tmp_path):
    args = [a.format(missing=str(tmp_path / "nope"), mixtral=tiny_dirs["mixtral"]) for a in args]
    proc = _quantize_cli(*args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert not (tmp_path / "out").exists(), "a failed request must leave nothing behind"


def test_the_gptq_worker_runs_from_the_parents_suite_whatever_its_working_directory(tmp_path):
    """The worker runs in a temporary directory, where `python -m` would find only an installed suite (a checkout run
    without an install failed with 'No module named specter'; with two copies the worker took the other one). The
    command imports the suite at the root it is given, with the worker's arguments, and leaves sys.path alone where
    that suite is the one the child finds anyway, so an installed suite's site-packages never goes ahead of the
    standard library."""
    from specter.quant.quantize import worker_command

    cwd = tmp_path / "cwd"  # the worker's temporary directory, with a module that says what the child imported
    cwd.mkdir()
    probe = "import sys, specter; print(specter.__file__); print(repr(sys.path)); print(repr(sys.argv[1:]))"
    (cwd / "specter_probe.py").write_text(probe)
    other = (tmp_path / "checkout").resolve()  # another copy of the suite, the one the parent runs: a stand-in
    (other / "specter").mkdir(parents=True)
    (other / "specter" / "__init__.py").write_text("")
    (tmp_path / "namespace" / "specter").mkdir(parents=True)  # a directory named specter, not the package

    def run(command, **env):
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env})
        assert proc.returncode == 0, proc.stderr
        file, path, args = proc.stdout.splitlines()
        return Path(file).resolve(), eval(path), eval(args)

    stand_in = other / "specter" / "__init__.py"
    file, path, args = run(worker_command("specter_probe", '{"a": 1}', root=other))
    assert (file, path[0], args) == (stand_in, str(other), ['{"a": 1}'])
    bare = worker_command("specter_probe", root=other)  # no suite installed at all: -S hides site-packages
    file, path, _ = run([bare[0], "-S", *bare[1:]])
    assert file == stand_in and path[0] == str(other)
    file, path, _ = run([bare[0], "-S", *bare[1:]], PYTHONPATH=str(tmp_path / "namespace"))
    assert file == stand_in and path[0] == str(other)
    installed = subprocess.run([sys.executable, "-c", "import specter; print(specter.__file__)"], cwd=cwd,
                               capture_output=True, text=True, check=True).stdout.strip()
    installed = Path(installed).resolve().parents[1]  # the suite the child finds from anywhere
    file, path, _ = run(worker_command("specter_probe", root=installed))
    assert file == installed / "specter" / "__init__.py"
    assert path == run([sys.executable, "-c", probe])[1]  # nothing added


def test_quantize_cli_writes_a_loadable_draft(tiny_dirs, tmp_path):
    proc = _quantize_cli("--model", tiny_dirs["qwen2_moe"], "--method", "rtn", "--bits", "3", "--group-size", "16",
                         "--out", str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stderr
    target = load_moe_model(tiny_dirs["qwen2_moe"], dtype=torch.float32)
    assert load_draft(target, tmp_path / "d").meta.bits == 3


def test_gptq_beats_rtn_on_a_fitted_model(tmp_path):
    """On a tiny Mixtral trained on code (a random model's routing carries no signal), GPTQ's 2-bit draft agrees with
    the target more often than round-to-nearest on the same grid: expert sets and next tokens, on held-out code."""
    from specter.data.corpus import corpus_texts
    from specter.data.prompts import load_prompts
    from specter.models.tiny import build_tiny_model, byte_tokenizer, fit_tiny_model
    from specter.quant.fidelity import fidelity

    tok = byte_tokenizer()
    model = build_tiny_model("mixtral", seed=0)
    model.config.router_jitter_noise = 0.0
    losses = fit_tiny_model(model, tok("".join(corpus_texts("code", "calibration")[:40]))["input_ids"], steps=300)
    assert losses[-1] < 0.5 * losses[0]
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    target = load_moe_model(tmp_path / "m", dtype=torch.float32)
    prompts = load_prompts("code", tok, num_prompts=12, prefix_tokens=32)
    result = {}
    for method in ("rtn", "gptq"):
        quantize_draft(tmp_path / "m", tmp_path / method, method=method, bits=2, group_size=GROUP,
                       calibration=dict(num_sequences=32, seq_len=128), progress=False)
        result[method], _ = fidelity(target, load_draft(target, tmp_path / method).moe, prompts, new_tokens=64,
                                     stride=64, progress=False)
    assert result["gptq"].expert_exact > result["rtn"].expert_exact
    assert result["gptq"].top1_agreement > result["rtn"].top1_agreement


def test_fidelity_cli_writes_csv_and_summary(tiny_dirs, drafts, tmp_path):
    out = tmp_path / "fid" / "f.csv"
    proc = subprocess.run([sys.executable, "-m", "specter", "fidelity", "--model", tiny_dirs["qwen3_moe"], "--draft",
                           str(drafts[("qwen3_moe", "rtn")]), "--new-tokens", "8", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["positions"] == 5 * 8 and [a["k"] for a in summary["acceptance"]] == list(range(1, 17))
    shares = summary["expert_exact"] + summary["expert_partial"] + summary["expert_none"]
    assert abs(shares - 1) < 1e-9
    assert abs(summary["expert_hard"] + summary["expert_soft"] - summary["expert_exact"]) < 1e-9
    assert abs(summary["expert_hard"] + summary["expert_soft"] + summary["expert_mismatch"] - 1) < 1e-9
    for a in summary["acceptance"]:  # one definition each, as in run records
        assert 0 <= a["window_utilization"] <= a["acceptance_rate"] <= 1
    assert out.read_text().splitlines()[0].startswith("prompt_index,position,layer,")


def test_fidelity_counts_the_papers_hard_soft_and_mismatch_on_a_hand_built_routing(tmp_path):
    """Top-2 routes over 2 layers and 5 positions, built by hand: 4 hard (same order), 3 soft (same set, swapped), 3
    mismatches (2 overlapping by one expert, 1 disjoint); the table reads them back as the paper's shares."""
    import torch

    from specter.quant.fidelity import FidelitySummary, agreement_shares, expert_agreement, write_fidelity
    from specter.report.fidelity import fidelity_table

    target = {0: torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]]),
              1: torch.tensor([[3, 2], [1, 5], [0, 7], [4, 6], [2, 1]])}
    draft = {0: torch.tensor([[0, 1], [3, 2], [4, 5], [6, 0], [0, 1]]),
             1: torch.tensor([[3, 2], [5, 1], [1, 3], [4, 6], [2, 7]])}
    rows = expert_agreement(target, draft, range(5))
    assert [r["match"] for r in rows] == ["hard", "hard", "soft", "soft", "hard", "mismatch", "mismatch", "hard",
                                          "soft", "mismatch"]
    assert [r["relation"] for r in rows if r["match"] == "mismatch"] == ["none", "partial", "partial"]
    assert rows[0]["target_experts"] == "0 1" and rows[8]["draft_experts"] == "0 1"  # ranked, as routed
    shares = agreement_shares(rows)
    assert shares == dict(expert_hard=0.4, expert_soft=0.3, expert_mismatch=0.3, expert_exact=0.7,
                          expert_partial=0.2, expert_none=0.1)
    summary = FidelitySummary(prompts=1, positions=5, **shares, top1_agreement=1.0, acceptance=[
        dict(k=1, mean_accepted=1.0, acceptance_rate=1.0, window_utilization=1.0, windows=1)])
    path = write_fidelity(summary, rows, tmp_path / "f.csv", dict(model="m", dataset="d", method="gptq", bits=4,
                                                                  group_size=32))
    table = fidelity_table([path])
    assert table.loc[0, ["expert_hard", "expert_soft", "expert_mismatch"]].tolist() == [0.4, 0.3, 0.3]


def test_the_gptq_worker_is_told_absolute_paths_for_a_relative_out(tiny_dirs, tmp_path, monkeypatch):
    """The worker runs in its temporary directory, so the directory it saves to must reach it as an absolute path (a
    relative `--out`, as the workflow gives, named a directory inside the worker's own, and the draft held no tensor:
    'GPTQModel wrote no quantized experts'); the draft's parent directory is made if missing."""
    from specter.quant import quantize as q

    seen = {}

    def worker(argv, cwd, log_path, progress):
        request = json.loads(argv[-1])
        seen.update(cwd=cwd, out=Path(request["out_dir"]))
        return 1, {}, "stopped by the test"

    monkeypatch.setattr(q, "_run_worker", worker)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecterError):
        q.quantize_draft(tiny_dirs["mixtral"], Path("drafts") / "draft", method="gptq", bits=4, group_size=32,
                         progress=False)
    assert seen["out"].is_absolute() and seen["out"] == seen["cwd"].resolve()


def test_fidelity_of_a_draft_that_is_its_target_is_whole_at_every_k(tiny_dirs):
    """A draft that is its target accepts every proposal: acceptance and window use are 1 at every K, the windows
    that the end of the text cuts short included (they propose only as far as the text goes)."""
    from specter.models import load_moe_model
    from specter.quant.fidelity import fidelity

    target = load_moe_model(tiny_dirs["mixtral"])
    summary, _ = fidelity(target, target, [[5, 6, 7, 8], [9, 10, 11, 12]], new_tokens=8, stride=4, progress=False)
    assert summary.top1_agreement == 1.0
    for a in summary.acceptance:
        assert a["acceptance_rate"] == 1.0 and a["window_utilization"] == 1.0, a
