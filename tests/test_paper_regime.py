"""The paper's regime: runs priced at real architectures' published shapes (`--cost-as`) with routing from a proxy,
and the mechanisms that matter there (a lower bound per pass, host synchronisation, fused draft kernels)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import spec
from specter.models.architectures import LayerMap, architecture_names, load_architecture
from specter.offload.work import ModelWork
from specter.quant.quantize import quantize_draft
from specter.runs import run
from specter.session import Session


def _hand_count(c: dict) -> dict:
    """Parameters of a published config, counted by hand from its fields (the shapes the papers state)."""
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    heads, kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    routed = c.get("num_local_experts") or c.get("num_experts") or c["n_routed_experts"]
    inter = c.get("moe_intermediate_size") or c["intermediate_size"]
    if "kv_lora_rank" in c:  # MLA without a query LoRA: q, kv_a (latent + rotary key), its norm, kv_b, o
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        attn = (h * heads * qk + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]
                + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"]) + heads * c["v_head_dim"] * h)
    else:
        d = c.get("head_dim") or h // heads
        attn = h * heads * d * 2 + h * kv * d * 2
        if c.get("attention_bias"):
            attn += heads * d * 2 + kv * d * 2
        if c.get("qkv_bias"):
            attn += heads * d + kv * d * 2
    norms = 2 * h * (2 if c["model_type"] == "phimoe" else 1)  # PhiMoE's norms are LayerNorms (weight and bias)
    expert = 3 * h * inter
    shared = 3 * h * (c.get("shared_expert_intermediate_size") or c.get("n_shared_experts", 0) * inter)
    shared_gate = h if c.get("shared_expert_intermediate_size") else 0
    moe_layer = attn + norms + routed * expert + routed * h + shared + shared_gate
    dense_layers = c.get("first_k_dense_replace", 0)
    dense_layer = attn + norms + 3 * h * c["intermediate_size"]
    head = vocab * h + (vocab if c.get("lm_head_bias") else 0) + h * (2 if c["model_type"] == "phimoe" else 1)
    total = dense_layers * dense_layer + (layers - dense_layers) * moe_layer + vocab * h + head
    return dict(expert=expert, moe_layer_non_expert=moe_layer - routed * expert, total=total,
                dense_layer=dense_layer if dense_layers else None, head=head)


@pytest.mark.parametrize("name", ["mixtral-8x7b", "phi-3.5-moe", "deepseek-v2-lite", "qwen1.5-moe-a2.7b"])
def test_priced_work_equals_a_hand_count_of_the_published_config(name):
    arch = load_architecture(name)
    work, hand = ModelWork.of(arch.meta_model()), _hand_count(arch.config)
    assert work.expert_params == hand["expert"]
    assert work.expert_bytes == 2 * hand["expert"]  # FP16
    assert work.layer_params[work.moe_layers[0]] == hand["moe_layer_non_expert"]
    if hand["dense_layer"] is not None:
        assert work.layers[0] not in work.moe_layers and work.layer_params[0] == hand["dense_layer"]
    assert work.head_params == hand["head"]
    assert arch.parameters() == hand["total"]
    assert abs(hand["total"] / arch.published_parameters - 1) < 0.01, (hand["total"], arch.published_parameters)
    if name == "deepseek-v2-lite":  # MLA caches the latent and the rotary key: 576 values a token and layer
        assert work.kv_bytes_per_token == 2 * (512 + 64)


def test_every_shipped_architecture_has_a_source_and_lists():
    assert architecture_names() == ["deepseek-v2-lite", "mixtral-8x7b", "phi-3.5-moe", "qwen1.5-moe-a2.7b"]
    proc = subprocess.run([sys.executable, "-m", "specter", "architectures"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in architecture_names():
        assert name in proc.stdout and load_architecture(name).source.startswith("https://huggingface.co/")


def test_a_local_config_json_works_where_a_name_does(tmp_path):
    config = dict(load_architecture("mixtral-8x7b").config, num_hidden_layers=4)
    (tmp_path / "config.json").write_text(json.dumps(config))
    arch = load_architecture(tmp_path / "config.json")
    work = ModelWork.of(arch.meta_model())
    assert work.moe_layers == (0, 1, 2, 3) and work.expert_params == 3 * 4096 * 14336


def test_layer_map_is_proportional_and_covers_both_ends():
    m = LayerMap.between(range(32), range(30))
    sources = [m.source(i) for i in range(32)]
    assert sources[0] == 0 and sources[-1] == 29 and sorted(set(sources)) == list(range(30))
    assert all(b - a in (0, 1) for a, b in zip(sources, sources[1:]))
    assert LayerMap.between(range(1, 27), range(30)).pairs[1] == 0


@pytest.fixture(scope="module")
def mixtral_draft(tiny_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("cost_as") / "draft"
    quantize_draft(tiny_dirs["mixtral"], out, method="rtn", bits=4, group_size=32)
    return str(out)


def _priced(tiny_dirs, draft, tmp_path, system, **over):
    settings = dict(system=system, model=tiny_dirs["mixtral"], draft=draft, dataset="code",
                    hardware="a100-40gb-pcie4", out=str(tmp_path / f"{system}.jsonl"), num_prompts=2,
                    max_new_tokens=20, resident_per_layer=2, k=4, cost_as="mixtral-8x7b")
    settings.update(over)
    return spec(**settings)


def test_a_priced_run_is_deterministic_and_never_below_its_bound(tiny_dirs, mixtral_draft, tmp_path):
    """Numerics from the tiny Mixtral, every op priced at Mixtral-8x7B's shapes: the same bits twice, in two sessions,
    and every system at or above its lower bound; the record says what priced it."""
    for system in ("on-demand", "specter", "mixtral-offloading", "fiddler", "specmoeoff"):
        a = run(_priced(tiny_dirs, mixtral_draft, tmp_path, system), Session(), progress=False)
        b = run(_priced(tiny_dirs, mixtral_draft, tmp_path, system), Session(), progress=False)
        strip = [{k: v for k, v in r.as_dict().items() if k != "wall_s"} for r in a]
        assert strip == [{k: v for k, v in r.as_dict().items() if k != "wall_s"} for r in b], system
        for r in a:
            assert r.cost_as == "mixtral-8x7b" and r.config["cost"]["expert_bytes"] == 2 * 3 * 4096 * 14336
            assert r.tpot_ms >= r.lower_bound_tpot_ms, system
            assert r.tpot_ms > 50  # Mixtral's 336 MiB experts cross the link: the paper's regime, not the tiny one
        assert a[0].config["cost"]["layer_map"]["layers"]["31"] == 1  # 32 Mixtral layers read the 2 tiny ones


def test_a_proxy_of_another_routing_structure_is_refused(tiny_dirs, tmp_path):
    out = tmp_path / "x.jsonl"
    proc = subprocess.run([sys.executable, "-m", "specter", "run", "--system", "on-demand", "--model",
                           tiny_dirs["olmoe"], "--dataset", "code", "--hardware", "a100-40gb-pcie4",
                           "--resident-per-layer", "2", "--cost-as", "mixtral-8x7b", "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "top-2 of 8" in lines[0] and "top-4 of 16" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def test_specter_beats_the_per_token_bound_and_stays_above_the_per_pass_one(tiny_dirs, tmp_path):
    """One verification of K + 1 tokens loads each expert once for all of them: on a slow link Specter runs below what
    one-token-at-a-time decoding must load (which once raised), and never below its own per-pass bound."""
    from specter.timing import load_profile

    data = load_profile("a100-40gb-pcie4").to_yaml_dict()
    data["name"] = "slow-link"
    data["link"].update(h2d_pinned_gbps=0.01, h2d_pageable_gbps=0.005)
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(data))
    draft = tmp_path / "draft"
    quantize_draft(tiny_dirs["qwen3_moe"], draft, method="rtn", bits=4, group_size=16)
    records = run(spec(system="specter", model=tiny_dirs["qwen3_moe"], draft=str(draft), dataset="code",
                       hardware=str(slow), out=str(tmp_path / "s.jsonl"), num_prompts=2, max_new_tokens=40,
                       resident_per_layer=1, k=32), progress=False)
    assert any(r.tpot_ms < r.extra["lower_bound_per_token_ms"] for r in records)
    for r in records:
        assert r.extra["lower_bound_kind"] == "per-pass" and r.tpot_ms >= r.lower_bound_tpot_ms


def test_the_fused_draft_kernel_is_one_launch_per_layer_and_step(tiny_dirs, mixtral_draft, tmp_path):
    fused = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "specter", num_prompts=1), progress=False)[0]
    unfused = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "specter", num_prompts=1, draft_kernel="unfused"),
                  progress=False)[0]
    assert fused.output_token_ids == unfused.output_token_ids and fused.tpot_ms < unfused.tpot_ms
    assert fused.config["draft_kernel"] == "fused" and unfused.config["draft_kernel"] == "unfused"



def test_specter_learns_the_link_from_demand_copies_when_no_prefetch_fits_its_first_estimate(tiny_dirs, mixtral_draft,
                                                                                            tmp_path):
    """On the H200 preset at Mixtral-8x7B shapes one 336 MiB expert takes 29 ms at the planner's initial 12 GB/s, more
    than a K = 4 window of fused draft steps: by that estimate no copy lands in time. Learning only from its own
    prefetches (`bandwidth-estimate=prefetches`, the artifact's), the planner never issues one; the verifications'
    demand copies teach it the link (the default)."""
    def specter_run(*options):
        return run(_priced(tiny_dirs, mixtral_draft, tmp_path, "specter", hardware="h200-pcie5", num_prompts=1,
                           max_new_tokens=40, system_options=options), progress=False)[0]

    learning, inert = specter_run(), specter_run(("bandwidth-estimate", "prefetches"))
    assert learning.h2d_bytes_prefetch > 0 and learning.tpot_ms >= learning.lower_bound_tpot_ms
    assert inert.h2d_bytes_prefetch == 0 and inert.output_token_ids == learning.output_token_ids
    assert learning.config["system_settings"]["bandwidth-estimate"] == "all-copies"
    assert inert.config["system_settings"]["bandwidth-estimate"] == "prefetches"


def test_a_run_priced_counted_takes_the_kernels_of_the_priced_architecture_s_own_class(tiny_dirs, mixtral_draft,
                                                                                      tmp_path):
    """`--pricing counted`: every op stands for the kernels a tiny instance of Mixtral's transformers class dispatches
    per part (not the proxy's, not the modelled runtime's); the record says so, the same tokens come out, and with the
    host dispatching each kernel the run takes longer than the fused runtime and stays above its bound."""
    from specter.models.architectures import load_architecture
    from specter.numerics.opcount import count_decode_ops

    fused, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "specter", num_prompts=1), Session(), progress=False)
    counted, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "specter", num_prompts=1, pricing="counted"),
                   Session(), progress=False)
    ops = count_decode_ops(load_architecture("mixtral-8x7b").tiny_model())
    priced = counted.config["priced_ops"]
    assert priced["pricing"] == "counted" and fused.config["priced_ops"]["pricing"] == "fused"
    assert priced["kernels"]["attention"] == ops.attention and priced["kernels"]["expert"] == ops.expert
    assert "tiny instance of mixtral-8x7b's transformers class" in priced["kernels_source"]
    assert fused.config["priced_ops"]["kernels"] == {"attention": 8, "expert": 3, "head": 2, "draft_experts": 1,
                                                     "host_reads": None, "dispatch": "eager"}
    assert counted.output_token_ids == fused.output_token_ids
    assert counted.tpot_ms > fused.tpot_ms and counted.tpot_ms >= counted.lower_bound_tpot_ms


def test_a_run_priced_upstream_takes_each_system_s_declared_kernels_and_host_reads(tiny_dirs, mixtral_draft, tmp_path):
    """`--pricing upstream`: Mixtral-Offloading's ops stand for the kernels its upstream code runs (HQQ linears: 32 a
    routed expert at 2-bit experts, 14 at FP16) and the host reads the device 14 times a MoE layer, as its file
    declares; a system of the suite's own (on-demand) takes the counted figures; the records say which, with their
    sources, and the same tokens come out at any pricing."""
    from baselines.mixtral_offloading import UPSTREAM

    session = Session()
    counted, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "mixtral-offloading", num_prompts=1,
                           pricing="counted"), session, progress=False)
    fp16, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "mixtral-offloading", num_prompts=1,
                        pricing="upstream"), session, progress=False)
    hqq, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "mixtral-offloading", num_prompts=1, pricing="upstream",
                       expert_bits=2), session, progress=False)
    own, = run(_priced(tiny_dirs, mixtral_draft, tmp_path, "on-demand", num_prompts=1, pricing="upstream"), session,
               progress=False)
    kernels = fp16.config["priced_ops"]["kernels"]
    assert fp16.config["priced_ops"]["pricing"] == "upstream"
    assert (kernels["attention"], kernels["expert"], kernels["head"], kernels["host_reads"]) == (
        UPSTREAM.attention, UPSTREAM.expert_unquantized, UPSTREAM.head, UPSTREAM.host_reads)
    assert hqq.config["priced_ops"]["kernels"]["expert"] == UPSTREAM.expert == 32
    assert "dvmazur/mixtral-offloading" in fp16.config["priced_ops"]["kernels_source"]
    assert own.config["priced_ops"]["kernels"] == {**counted.config["priced_ops"]["kernels"]}
    assert "on-demand is the suite's own" in own.config["priced_ops"]["kernels_source"]
    assert fp16.output_token_ids == counted.output_token_ids == own.output_token_ids
    assert fp16.tpot_ms >= fp16.lower_bound_tpot_ms


def test_an_upstream_system_s_host_reads_each_wait_then_sync_at_every_moe_layer(tiny_dirs, mixtral_draft, tmp_path):
    """The executor makes the host reads a system's upstream code makes: each MoE layer of a pass syncs the host
    `host_reads` times on the simulated timeline (the routing's one read where none is declared)."""
    from dataclasses import replace

    from specter.offload.hooks import TransferStats
    from specter.runs.execute import prepare
    from specter.timing.engine import SYNC
    from specter.timing.sim import SimEngine

    prepared = prepare(_priced(tiny_dirs, mixtral_draft, tmp_path, "on-demand", num_prompts=1), Session())
    work = prepared.work
    syncs = {}
    for reads in (None, 0, 5):
        engine = SimEngine(prepared.profile)
        engine.start()
        executor = prepared.system.make_executor(engine, replace(work, kernels=replace(work.kernels, host_reads=reads)),
                                                 prepared.system.make_cache(work, prepared.slots), TransferStats())
        layer = work.moe_layers[0]
        executor.layer(layer, [tuple(range(work.top_k))], 4, "t")
        syncs[reads] = sum(1 for span in engine.timeline.spans if span.stream == SYNC)
    assert syncs[0] < syncs[None] and syncs[5] - syncs[0] == 5 and syncs[None] - syncs[0] == 1


@pytest.mark.parametrize("name", ["mixtral-8x7b", "phi-3.5-moe", "deepseek-v2-lite", "qwen1.5-moe-a2.7b"])
def test_a_tiny_instance_keeps_the_architecture_s_structure(name):
    """The instance counted for `--pricing counted` is the architecture's class with its routing and layer structure
    (experts per layer, top-k, dense first layers), only narrower."""
    from specter.models.architectures import load_architecture

    arch = load_architecture(name)
    tiny, meta = arch.tiny_model(), arch.meta_model()
    assert type(tiny.model) is type(meta.model)
    assert tiny.moe_layers[0].num_experts == meta.moe_layers[0].num_experts
    assert tiny.moe_layers[0].top_k == meta.moe_layers[0].top_k
    assert tiny.moe_layers[0].layer_index == meta.moe_layers[0].layer_index  # DeepSeek's dense first layer kept
    assert tiny.config.hidden_size < meta.config.hidden_size
