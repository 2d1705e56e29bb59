"""Baselines: lossless on every tiny architecture, and each one's own mechanism visibly acting."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import ARCHS, spec
from specter.models import load_moe_model
from specter.quant.quantize import quantize_draft
from specter.runs import run

BASELINES = ("naive", "hf-offload", "mixtral-offloading", "moe-infinity", "sp-moe", "specmoeoff", "fiddler",
             "llama-cpp-cpu-moe", "ktransformers")
NEW = 16


@pytest.fixture(scope="module")
def drafts(tiny_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("bdrafts")
    for arch in ARCHS:
        quantize_draft(tiny_dirs[arch], root / arch, method="rtn", bits=4, group_size=32)
    return {arch: str(root / arch) for arch in ARCHS}


def _run(tiny_dirs, drafts, arch, system, tmp_path, options=(), **over):
    base = dict(system=system, model=tiny_dirs[arch], draft=drafts[arch], dataset="code", hardware="a100-40gb-pcie4",
                out=str(tmp_path / f"{system}.jsonl"), max_new_tokens=NEW, resident_per_layer=2, k=4,
                system_options=tuple(options), warmup_prompts=4)
    base.update(over)
    return run(spec(**base), progress=False)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_baseline_equals_transformers_greedy(arch, tiny_dirs, drafts, tmp_path):
    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    for system in BASELINES:
        records = _run(tiny_dirs, drafts, arch, system, tmp_path)
        for r in records:
            with torch.no_grad():
                ref = target.model.generate(torch.tensor([r.prompt_token_ids]), max_new_tokens=NEW, do_sample=False,
                                            eos_token_id=None, pad_token_id=target.config.pad_token_id)
            assert r.output_token_ids == ref[0, len(r.prompt_token_ids):].tolist(), (arch, system, r.prompt_index)
            assert r.tpot_ms >= r.lower_bound_tpot_ms, (arch, system)


def _misses(records):
    return sum(r.demand_misses for r in records)


def _link_bytes(records):
    return sum(r.h2d_bytes_demand + r.h2d_bytes_prefetch + r.extra["link_bytes_activations"] for r in records)


# Mechanism tests: a tiny Mixtral (8 experts, top-2) with 4 slots per layer, 48 new tokens, so that eviction matters.
MECH = dict(resident_per_layer=4, max_new_tokens=48)


def test_mixtral_offloading_lookahead_reduces_demand_misses(tiny_dirs, drafts, tmp_path):
    on = _run(tiny_dirs, drafts, "mixtral", "mixtral-offloading", tmp_path, [("depth", "1")], **MECH)
    off = _run(tiny_dirs, drafts, "mixtral", "mixtral-offloading", tmp_path, [("depth", "0")], **MECH)
    assert _misses(on) < _misses(off)
    assert sum(r.h2d_bytes_prefetch for r in on) > 0 == sum(r.h2d_bytes_prefetch for r in off)


def test_mixtral_offloading_swaps_write_the_evicted_expert_back(tiny_dirs, drafts, tmp_path):
    """Upstream's _swap: every load that evicts copies the evicted expert back to the host; with the artifact's
    restored cache every slot is taken from the start, so every load into a slot evicts one."""
    records = _run(tiny_dirs, drafts, "mixtral", "mixtral-offloading", tmp_path, **MECH)
    back = sum(r.extra["d2h_bytes_writeback"] for r in records)
    assert 0 < back <= sum(r.h2d_bytes_demand for r in records)
    assert sum(r.h2d_bytes_prefetch for r in records) == 0  # gate-ahead loading is off by default (the artifact's)
    plain = _run(tiny_dirs, drafts, "mixtral", "on-demand", tmp_path, **MECH)
    assert [r.tpot_ms for r in records] > [r.tpot_ms for r in plain]  # the write-backs and compute-order copies cost


def test_moe_infinity_filled_store_beats_empty_store(tiny_dirs, drafts, tmp_path):
    """The paper's activation-aware prefetch and caching (options): a store of warm-up EAMs predicts better than none;
    the released code's default prefetches nothing."""
    paper = [("prefetch", "true"), ("eviction", "activation")]
    filled = _run(tiny_dirs, drafts, "mixtral", "moe-infinity", tmp_path, [*paper, ("warmup", "8")],
                  warmup_prompts=8, **MECH)
    empty = _run(tiny_dirs, drafts, "mixtral", "moe-infinity", tmp_path, [*paper, ("warmup", "0")],
                 warmup_prompts=8, **MECH)
    assert _misses(filled) < _misses(empty)
    released = _run(tiny_dirs, drafts, "mixtral", "moe-infinity", tmp_path, **MECH)
    assert sum(r.h2d_bytes_prefetch for r in released) == 0 < sum(r.h2d_bytes_prefetch for r in filled)


def test_hf_offload_copies_only_the_routed_experts_each_pass(tiny_dirs, drafts, tmp_path):
    (r, *_) = _run(tiny_dirs, drafts, "mixtral", "hf-offload", tmp_path, **MECH)
    (naive, *_) = _run(tiny_dirs, drafts, "mixtral", "naive", tmp_path, **MECH)
    expert = 3 * 64 * 32 * 2  # the tiny Mixtral's expert at FP16
    assert r.h2d_bytes_demand == r.demand_misses * expert and r.demand_hits == 0  # nothing kept
    assert r.h2d_bytes_demand < naive.h2d_bytes_demand and r.h2d_bytes_prefetch == 0


def test_fiddler_moves_fewer_bytes_than_naive(tiny_dirs, drafts, tmp_path):
    fiddler = _run(tiny_dirs, drafts, "mixtral", "fiddler", tmp_path, **MECH)
    naive = _run(tiny_dirs, drafts, "mixtral", "naive", tmp_path, **MECH)
    assert _link_bytes(fiddler) < _link_bytes(naive)


def test_llama_cpp_cpu_moe_keeps_the_first_blocks_experts_on_the_host(tiny_dirs, drafts, tmp_path):
    """--n-cpu-moe: the first blocks' experts stay on the host and only activations cross (each token's hidden state
    and k expert ids out at F32 and I32, its k down projections back at F32); by default as few blocks as leave the
    others' experts within the budget (4 slots of 8 in 2 layers: one layer); a placement past the budget is refused."""
    from specter.errors import SpecterError

    (r, *_) = _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path, **MECH)
    assert r.extra["host_layers"] == [0] and r.h2d_bytes_demand == r.h2d_bytes_prefetch == 0
    expert = 3 * 64 * 32 * 2  # the tiny Mixtral's expert at FP16
    assert r.config["memory"]["placed_slot_bytes"] == 8 * expert  # one layer's 8 experts, of the budget's 2 x 4
    tokens = len(r.prompt_token_ids) + MECH["max_new_tokens"] - 1  # the prefill's and every later pass's
    assert r.extra["link_bytes_activations"] == tokens * (64 * 4 + 2 * 4 + 2 * 64 * 4)  # hidden 64, top-2
    (every, *_) = _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path, [("n-cpu-moe", "2")], **MECH)
    assert every.extra["host_layers"] == [0, 1] and every.hit_rate == 0
    (none, *_) = _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path,
                      **{**MECH, "resident_per_layer": 8})
    assert none.extra["host_layers"] == [] and none.extra["link_bytes_activations"] == 0 and none.hit_rate == 1
    assert none.output_token_ids == every.output_token_ids == r.output_token_ids
    with pytest.raises(SpecterError, match="n-cpu-moe=0 leaves 2 MoE layers' experts"):
        _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path, [("n-cpu-moe", "0")], **MECH)
    eager = _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path, [("cuda-graphs", "false")],
                 pricing="upstream", **MECH)
    graphs = _run(tiny_dirs, drafts, "mixtral", "llama-cpp-cpu-moe", tmp_path, pricing="upstream", **MECH)
    assert [e.tpot_ms > g.tpot_ms for e, g in zip(eager, graphs)] == [True] * len(graphs)


def test_ktransformers_computes_every_routed_expert_on_the_host(tiny_dirs, drafts, tmp_path):
    """KTransformers: no routed expert on the device and no weight crosses; each MoE layer of a pass sends each token's
    hidden state (16-bit), k ids (int64) and k weights (float32) out and the experts' sum (16-bit) back, and each pass
    copies its tokens' embeddings in; the decode step as one graph overlaps the host's experts with the device's shared
    experts and costs less than the eager step, which waits at every layer."""
    (r, *_) = _run(tiny_dirs, drafts, "mixtral", "ktransformers", tmp_path, **MECH)
    assert r.hit_rate == 0 and r.h2d_bytes_demand == r.h2d_bytes_prefetch == 0
    assert r.config["memory"]["placed_slot_bytes"] == 0 and r.extra["host_layers"] == [0, 1]
    tokens = len(r.prompt_token_ids) + MECH["max_new_tokens"] - 1
    per_layer = 64 * 2 + 2 * (8 + 4) + 64 * 2  # hidden 64, top-2
    assert r.extra["link_bytes_activations"] == tokens * (2 * per_layer + 64 * 2)  # 2 MoE layers, the embedding
    for arch in ("deepseek_v3", "mixtral"):
        graph = _run(tiny_dirs, drafts, arch, "ktransformers", tmp_path, pricing="upstream", **MECH)
        eager = _run(tiny_dirs, drafts, arch, "ktransformers", tmp_path, [("cuda-graph", "false")],
                     pricing="upstream", **MECH)
        assert [g.output_token_ids for g in graph] == [e.output_token_ids for e in eager]
        assert [g.tpot_ms < e.tpot_ms for g, e in zip(graph, eager)] == [True] * len(graph), arch


def test_naive_copies_every_expert_of_every_layer_each_pass(tiny_dirs, drafts, tmp_path):
    (r, *_) = _run(tiny_dirs, drafts, "mixtral", "naive", tmp_path, **MECH)
    passes = MECH["max_new_tokens"]  # the prefill and one pass per further token
    assert r.h2d_bytes_demand == passes * 2 * 8 * 3 * 64 * 32 * 2  # passes x layers x experts x expert bytes (FP16)


def test_sp_moe_draft_prefetch_reduces_demand_misses(tiny_dirs, drafts, tmp_path):
    on = _run(tiny_dirs, drafts, "mixtral", "sp-moe", tmp_path, [("cutoff", "-1")], **MECH)
    off = _run(tiny_dirs, drafts, "mixtral", "sp-moe", tmp_path, [("cutoff", "0")], **MECH)
    assert _misses(on) < _misses(off)


def test_specmoeoff_pays_for_its_separate_draft(tiny_dirs, drafts, tmp_path):
    budget = dict(resident_per_layer=None, device_memory_gb=0.00045, max_new_tokens=24)
    smo = _run(tiny_dirs, drafts, "mixtral", "specmoeoff", tmp_path, **budget)
    spec = _run(tiny_dirs, drafts, "mixtral", "specter", tmp_path, **budget)
    assert smo[0].slots_per_layer < spec[0].slots_per_layer  # its own weights and KV take device memory
    assert smo[0].k == 3 and sum(r.h2d_bytes_prefetch for r in smo) > 0


def test_unknown_system_option_is_one_line_exit_2(tiny_dirs, drafts, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "naive", "--model", tiny_dirs["mixtral"],
                           "--dataset", "code", "--hardware", "t4-pcie3", "--resident-per-layer", "2",
                           "--system-option", "depth=2", "--out", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("specter: error:")]
    assert len(errors) == 1 and "has no option depth" in errors[0], proc.stderr[-1500:]


def test_breakdown_parts_sum_to_the_decode_time_for_every_system(tiny_dirs, drafts, tmp_path):
    """Every registered system's record splits [first commit, last commit] into the breakdown's parts, which sum to
    TPOT x (N - 1); a speculative system spends time in draft steps, naive stalls on copies, and only the hybrid systems
    compute on the host."""
    from specter.metrics import BREAKDOWN
    from specter.systems import registry

    parts = {}
    for system in registry():
        records = _run(tiny_dirs, drafts, "mixtral", system, tmp_path, **MECH)
        for r in records:
            b = r.extra["breakdown_ms"]
            assert list(b) == list(BREAKDOWN) and min(b.values()) >= 0, system
            assert sum(b.values()) == pytest.approx(r.tpot_ms * (len(r.output_token_ids) - 1), rel=1e-9), system
        parts[system] = {p: sum(r.extra["breakdown_ms"][p] for r in records) for p in BREAKDOWN}
    assert parts["specter"]["draft"] > 0 and parts["on-demand"]["draft"] == 0 and parts["resident"]["draft"] == 0
    assert parts["naive"]["stall on copies"] > parts["resident"]["stall on copies"] == 0
    hybrid = {"fiddler", "llama-cpp-cpu-moe", "ktransformers"}  # only they compute experts on the host
    assert all(parts[s]["host compute"] == 0 for s in parts if s not in hybrid)
    assert all(parts[s]["host compute"] > 0 for s in hybrid)


def test_memory_table_charges_a_separate_draft_its_own_weights_and_kv(tiny_dirs, drafts, tmp_path):
    """The paper's Table 2 from run records: Specter's self-draft is its INT4 experts alone; SpecMoEOff's separate
    draft adds a copy of the non-expert weights and its own KV; a system without a draft keeps none; the parts sum to
    the total."""
    from specter.report.tables import memory_table

    records = []
    for system in ("specter", "specmoeoff", "on-demand"):
        records += [r.as_dict() for r in _run(tiny_dirs, drafts, "mixtral", system, tmp_path)]
    table = memory_table(records).set_index("system")
    parts = ["non_expert_gb", "draft_gb", "kv_gb", "workspace_gb", "expert_slot_gb"]
    assert (table[parts].sum(axis=1) - table["total_gb"]).abs().max() < 1e-9
    assert table.loc["on-demand", "draft_gb"] == 0 < table.loc["specter", "draft_gb"]
    separate = table.loc["specmoeoff", "draft_gb"] - table.loc["specter", "draft_gb"]
    assert separate == pytest.approx(table.loc["specter", "non_expert_gb"], rel=1e-9)  # its own copy of the weights
    assert table.loc["specmoeoff", "kv_gb"] > table.loc["specter", "kv_gb"]  # and its own KV
    assert set(table["slots_per_layer"]) == {2} and len(table) == 3  # one row per run, not per prompt
