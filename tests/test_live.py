"""The live engine: the model itself decodes through the offload runtime on the CPU as device.

Every system the live engine runs commits `generate`'s greedy tokens on four classes; the slots are real (an expert's
host copy corrupted after it was loaded changes nothing until the expert is loaded again); records say measured on the
CPU, with the simulated twin beside; what it cannot run is refused before anything loads.
"""

from __future__ import annotations

import pytest
import torch

from conftest import spec
from specter.models import load_moe_model
from specter.runs import live as on_live
from specter.runs.checks import resolve
from specter.runs.execute import execute, prepare, schedule
from specter.session import Session
from specter.systems import get_system, registry

LIVE_ARCHS = ("mixtral", "qwen2_moe", "deepseek_v3", "olmoe")
NEW = 10


def _live_systems() -> list[str]:
    return sorted(name for name in registry() if get_system(name).cannot_run_live() is None)


def _request(tiny_dirs, rtn_drafts, arch, system, tmp_path, **over) -> dict:
    """A run's settings; a live one's draft on the simulator's draft weights (`packed`), so that it proposes what the
    twin's draft proposes."""
    live = {"live_draft_kernel": "packed"} if over.get("engine") == "live" else {}
    return {**dict(system=system, model=tiny_dirs[arch], draft=rtn_drafts[arch], dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / f"{system}.jsonl"), num_prompts=1,
                   prefix_tokens=16, max_new_tokens=NEW, resident_per_layer=2, k=3, warmup_prompts=2), **live, **over}


@pytest.mark.parametrize("arch", LIVE_ARCHS)
def test_every_system_decodes_live_and_commits_generates_greedy_tokens(arch, tiny_dirs, rtn_drafts, tmp_path):
    """Each system's live run (its own cache, hooks and planner choosing real copies from the live router's choices)
    commits what transformers' `generate` decodes greedily, with its simulated twin's acceptance (the twin decodes
    the recorded trace); a system whose choices depend only on the routes also books the twin's hits and misses."""
    systems = _live_systems()
    assert set(systems) == set(registry())
    session = Session()
    reference = None
    for system in systems:
        p = prepare(spec(**_request(tiny_dirs, rtn_drafts, arch, system, tmp_path, engine="live")), session)
        p.device = on_live.runtime(p, session)
        prompt = p.prompts[0]
        if reference is None:
            target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
            with torch.no_grad():
                reference = target.model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                                                  eos_token_id=None, pad_token_id=target.config.pad_token_id
                                                  )[0, len(prompt):].tolist()
        live, timeline, _ = on_live.live_run(p, prompt, p.config, schedule)
        assert live.tokens == reference, (arch, system)
        assert timeline.spans and all(s.end >= s.start for s in timeline.spans)
        simulated, _ = schedule(p.system, on_live.timing.make_engine("sim", p.profile), p.work, p.service,
                                p.service.trace(prompt, NEW), p.config, p.cost, p.warmup, online=p.online)
        assert live.accepted_lengths == simulated.accepted_lengths, (arch, system)
        if system == "specter-oracle":  # every window's forecast replayed from the recorded decode
            replay = live.extra["oracle_replay"]
            assert replay["windows_from_draft"] == 0 and replay["windows_replayed"] == len(live.ks), (arch, replay)
            assert live.prediction == simulated.prediction, arch  # the twin's forecasts, booked against the same routes
        if not p.system.speculative:  # a speculative planner sizes its prefetches from the step times it measures
            assert live.stats.demand.counts() == simulated.stats.demand.counts(), (arch, system)


def test_a_draft_with_its_own_kv_drafts_live_what_the_simulator_drafts(tiny_dirs, tmp_path):
    """SpecMoEOff's draft keeps a KV cache of its own. Live, its passes read and write that cache alone: after a
    rejection the cache drops the rejected positions, after a window accepted whole its first step reads the
    position it never wrote. A 2-bit draft is rejected often and accepted whole at times; every window it drafts
    live is the one the simulator's numerics draft over the draft's own KV (their acceptance is equal)."""
    from specter.quant.quantize import quantize_draft

    draft = tmp_path / "draft2"
    quantize_draft(tiny_dirs["mixtral"], draft, method="rtn", bits=2, group_size=32)
    request = _request(tiny_dirs, {"mixtral": str(draft)}, "mixtral", "specmoeoff", tmp_path, engine="live",
                       max_new_tokens=24)
    session = Session()
    p = prepare(spec(**request), session)
    p.device = on_live.runtime(p, session)
    assert p.device.own_draft_kv
    prompt = p.prompts[0]
    live, _, _ = on_live.live_run(p, prompt, p.config, schedule)
    simulated, _ = schedule(p.system, on_live.timing.make_engine("sim", p.profile), p.work, p.service,
                            p.service.trace(prompt, 24), p.config, p.cost, p.warmup, online=p.online)
    assert live.tokens == simulated.tokens
    accepted = live.accepted_lengths
    assert accepted == simulated.accepted_lengths
    assert any(a < p.system.k for a in accepted) and p.system.k in accepted, accepted  # both paths ran
    assert p.device.draft_cache is not p.device.cache


def test_slots_are_real(tiny_dirs):
    """An expert's host copy corrupted after the expert was loaded: the output is unchanged while the slot holds the
    clean copy, and changes once the expert is loaded again from the host."""
    from specter.offload.cache import ExpertCache
    from specter.offload.executor import Executor, TransferStats
    from specter.offload.live import LiveRuntime
    from specter.offload.store import ExpertStore
    from specter.offload.work import ModelWork
    from specter.timing.wall import WallEngine

    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    work = ModelWork.of(target)
    store = ExpertStore(target, dtype=torch.float32)
    runtime = LiveRuntime(target, work, store, work.experts_per_layer, "cpu", check=True)
    cache = ExpertCache(work.moe_layers, work.experts_per_layer)
    ex = Executor(WallEngine(), work, cache, TransferStats(), device=runtime)
    prompt = list(range(5, 21))
    ex.target_pass(None, context=0, tag="first", inputs=prompt)
    clean, misses = ex.last_pass.logits, ex.stats.demand.misses
    layer = work.moe_layers[0]
    expert = ex.last_pass.routes[0][layer][0]
    assert (layer, expert) in cache
    store.layers[layer][expert].mul_(-3.0)  # the host copy, after the expert crossed into its slot

    ex.target_pass(None, context=0, tag="resident", inputs=prompt)
    assert ex.stats.demand.misses == misses  # nothing copied again
    assert torch.equal(ex.last_pass.logits, clean)

    cache.clear(layer)  # evicted: the next pass copies it in again, from the corrupted host copy
    ex.target_pass(None, context=0, tag="reloaded", inputs=prompt)
    assert ex.stats.demand.misses > misses
    assert not torch.allclose(ex.last_pass.logits, clean)


@pytest.mark.parametrize("arch, dtype", [("mixtral", torch.float32), ("gpt_oss", torch.float32),
                                         ("deepseek_v3", torch.bfloat16), ("qwen2_moe", torch.bfloat16)])
def test_a_layer_with_every_expert_resident_reads_no_routing_before_its_experts(arch, dtype, tiny_dirs):
    """Every expert resident: each target MoE layer computes grouped from the device's routing (`offload.grouped`),
    and the host reads the routing only after the pass, behind its argmax read (no wait of its own). The logits are
    bit for bit the expert-by-expert path's, and so are the routes, the hits, the cache's order and the pass's work
    (the lower bound's)."""
    from specter.offload.cache import ExpertCache
    from specter.offload.executor import Executor, TransferStats
    from specter.offload.live import LiveRuntime
    from specter.offload.store import ExpertStore
    from specter.offload.work import ModelWork
    from specter.timing.wall import WallEngine

    target = load_moe_model(tiny_dirs[arch], dtype=dtype)
    work = ModelWork.of(target)
    runtime = LiveRuntime(target, work, ExpertStore(target, dtype=dtype), work.experts_per_layer, "cpu", check=True)
    prompt = list(range(5, 21))

    def decode(grouped: bool, misplaced: bool = False):
        runtime._grouped = grouped  # the device's answer to whether it can (`grouped_ready`)
        cache = ExpertCache(work.moe_layers, work.experts_per_layer)
        ex = Executor(WallEngine(), work, cache, TransferStats(), device=runtime)
        ex.place({layer: list(range(work.experts_per_layer))[::-1] for layer in work.moe_layers})
        if misplaced:  # the runtime's slot 0 holds another expert than the cache says: `check` finds it
            runtime.slot_holds[work.moe_layers[0], 0] = -1
        reads, passes = dict(runtime.host_reads), []
        for tag, inputs, context in (("prefill", prompt, 0), ("step", [7], len(prompt))):
            ex.target_pass(None, context=context, tag=tag, inputs=inputs)
            passes.append((ex.last_pass.logits, ex.last_pass.routes))
        read = {kind: n - reads.get(kind, 0) for kind, n in runtime.host_reads.items() if n > reads.get(kind, 0)}
        return passes, read, ex.stats.demand.counts(), [cache.resident(layer) for layer in work.moe_layers], ex.passes

    fast, slow = decode(True), decode(False)
    layers = len(work.moe_layers)
    with pytest.raises(AssertionError, match="slot 0 holds expert -1"):
        decode(True, misplaced=True)
    assert fast[1] == {"argmax": 2, "target routing, read after the pass": 2 * layers}
    assert slow[1] == {"argmax": 2, "target routing": 2 * layers}
    for (logits, routes), (want, want_routes) in zip(fast[0], slow[0]):
        assert torch.equal(logits, want) and routes == want_routes
    assert fast[2:] == slow[2:]


def test_the_live_store_holds_the_one_host_copy_of_every_expert(tiny_dirs):
    """With `share`, the target's fused experts become views into the store's rows: every expert is held once on the
    host (the model's parameters and the store together take the checkpoint's bytes), and the model computes the
    same logits as before."""
    from specter.offload.store import ExpertStore

    def held_bytes(tensors) -> int:
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    prompt = torch.tensor([list(range(5, 21))])
    with torch.no_grad():
        before = target.model(input_ids=prompt).logits
    params = list(target.model.parameters())
    model_bytes = held_bytes(params)
    store = ExpertStore(target, dtype=torch.float32, share=True)
    assert store.shared_layers == [m.layer_index for m in target.moe_layers]
    for m in target.moe_layers:
        rows = store.layers[m.layer_index].untyped_storage().data_ptr()
        assert m.experts.gate_up_proj.untyped_storage().data_ptr() == rows
        assert m.experts.down_proj.untyped_storage().data_ptr() == rows
    del params
    assert held_bytes([*target.model.parameters(), *store.layers.values()]) == model_bytes
    with torch.no_grad():
        assert torch.equal(target.model(input_ids=prompt).logits, before)
    assert ExpertStore(target, dtype=torch.bfloat16, share=True).shared_layers == []  # another dtype: its own copy


def test_live_records_say_measured_on_the_cpu_beside_the_simulated_twin(tiny_dirs, rtn_drafts, tmp_path):
    request = _request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path, num_prompts=2)
    session = Session()
    simulated = execute(spec(**request), session, progress=False)
    live = execute(spec(**request, engine="live", live_draft_kernel="packed", repeats=2), session, progress=False)
    assert [(r.prompt_index, r.extra["repeat"]) for r in live] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in live:
        s = simulated[r.prompt_index]
        assert r.engine == "live" and not r.simulated and r.hardware.startswith("cpu")
        assert r.output_token_ids == s.output_token_ids
        assert r.extra["live"] == {"device": "cpu", "twin": "this live decode", "tokens_as_recorded": None,
                                   "first_divergence": None, "acceptance_as_twin": None}
        assert r.extra["simulated_on"] == "a100-40gb-pcie4"
        # the twin prices what the live engine runs: float32 weights and the modules' counted kernels, so it takes
        # longer than the simulator's run of fused kernels at 2 bytes a weight, part by part
        assert r.config["priced_ops"]["weight_bytes"] == 4 and s.config["priced_ops"]["weight_bytes"] == 2
        assert r.config["priced_ops"]["kernels_source"].startswith("counted")
        assert s.config["priced_ops"]["kernels_source"].startswith("modelled")
        assert r.extra["simulated_tpot_ms"] > s.tpot_ms
        twin = r.extra["simulated_breakdown_ms"]
        assert set(twin) == set(r.extra["breakdown_ms"]) == set(s.extra["breakdown_ms"])
        assert twin["draft"] > s.extra["breakdown_ms"]["draft"]
        assert r.config["device"]["measured_on"].startswith("measured on cpu")
        assert r.tpot_ms > 0 and r.extra["commit_ms"] == sorted(r.extra["commit_ms"])


def test_sim_vs_measured_sets_each_part_beside_its_twin(tiny_dirs, rtn_drafts, tmp_path):
    """The sim_vs_measured table: per system, TPOT and each part of the breakdown, measured and simulated, in ms per
    token, with their ratio; each side's parts sum to its TPOT, and every row says it was measured on the CPU."""
    from specter.metrics import BREAKDOWN
    from specter.report.tables import experiment_table

    session = Session()
    records = [r.as_dict() for system in ("on-demand", "specter") for r in execute(spec(**_request(
        tiny_dirs, rtn_drafts, "mixtral", system, tmp_path, num_prompts=2, engine="live", repeats=1)), session,
        progress=False)]
    table = experiment_table("sim_vs_measured", records)
    assert set(table["system"]) == {"on-demand", "specter"} and list(table["part"][:7]) == ["TPOT", *BREAKDOWN]
    assert table["measured_on"].str.startswith("measured on cpu").all() and not table["simulated"].any()
    assert (table["simulated_on"] == "a100-40gb-pcie4").all() and (table["n"] == 2).all()
    for system, rows in table.groupby("system"):
        by = rows.set_index("part")
        mine = [r for r in records if r["system"] == system]
        assert by.loc["TPOT", "measured_ms"] == pytest.approx(sum(r["tpot_ms"] for r in mine) / 2)
        assert by.loc["TPOT", "simulated_ms"] == pytest.approx(sum(r["extra"]["simulated_tpot_ms"] for r in mine) / 2)
        for side in ("measured_ms", "simulated_ms"):  # the parts split the time between the first and last commit
            assert by.loc[list(BREAKDOWN), side].sum() == pytest.approx(by.loc["TPOT", side], rel=1e-6)
        ratio = by.loc["TPOT", "measured_ms"] / by.loc["TPOT", "simulated_ms"]
        assert by.loc["TPOT", "measured_over_simulated"] == pytest.approx(ratio)
    assert table[table["simulated_ms"] == 0]["measured_over_simulated"].isna().all()


@pytest.mark.parametrize(("over", "message"), [
    (dict(live_device="cuda"), "--device cuda: torch sees no CUDA device on this machine"),
    (dict(temperature=0.7), "--temperature 0.7 samples"),
    (dict(expert_bits=4), "--expert-bits 4 prices quantized experts"),
    (dict(cost_as="mixtral-8x7b"), "--engine live runs this model's own kernels"),
    (dict(system="mixtral-offloading", system_options=(("depth", "1"),)), "depth=1 guesses from the target's"),
    (dict(system_options=(("draft-kv", "copied"),)), "draft-kv=copied is an ablation of the simulator"),
])
def test_live_refuses_what_it_cannot_run_before_loading(over, message, tiny_dirs, rtn_drafts, tmp_path, monkeypatch):
    from specter.errors import SpecterError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU, wherever this runs
    request = {**_request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path, engine="live"), **over}
    with pytest.raises(SpecterError, match=message):
        resolve(spec(**request))
    assert not (tmp_path / f"{request['system']}.jsonl").exists()


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "deepseek_v3", "olmoe"])
def test_counted_kernels_add_up_to_the_decode_step(arch, tiny_dirs, rtn_drafts):
    """The parts' counts are the step's own: per layer x layers + per expert x routed experts + head make every kernel
    one decode step dispatches (within rounding), views and host reads are not kernels, and a draft experts module is
    counted on one call."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specter.numerics.opcount import PREFIX_TOKENS, count_decode_ops
    from specter.numerics.passes import new_cache
    from specter.quant.draft import load_draft

    class All(TorchDispatchMode):
        n, views, syncs = 0, 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.is_view or str(func) in ("aten._unsafe_view.default", "aten.lift_fresh.default"):
                All.views += 1
            elif str(func) == "aten._local_scalar_dense.default":
                All.syncs += 1
            else:
                All.n += 1
            return func(*args, **(kwargs or {}))

    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    with torch.no_grad():
        out = target.model(input_ids=torch.arange(1, PREFIX_TOKENS + 1)[None], cache=new_cache(target),
                           use_cache=True)
        with All():
            target.model(input_ids=torch.tensor([[PREFIX_TOKENS + 1]]), cache=out.cache, use_cache=True)
    draft = load_draft(target, rtn_drafts[arch], packed=True)
    ops = count_decode_ops(target, draft.moe.moe_layers[0].experts)
    routed = len(target.moe_layers) * target.moe_layers[0].top_k
    total = ops.attention * target.num_layers + ops.expert * routed + ops.head
    assert abs(total - All.n) <= target.num_layers + routed  # each per-part count is rounded once
    assert All.views > 0 and ops.syncs_per_layer == All.syncs / target.num_layers
    assert ops.head >= 1 and ops.expert > 3 and ops.attention > 8  # eager modules dispatch more than fused kernels
    assert ops.draft_experts >= 2 * target.moe_layers[0].top_k  # each expert's linears, at least


def test_a_session_counts_a_models_kernels_once(tiny_dirs, rtn_drafts, tmp_path, monkeypatch):
    """Every live run of one model, draft and kernel in a session (a sweep's systems) is priced at one count."""
    import specter.numerics.opcount as opcount

    calls = []
    count = opcount.count_decode_ops
    monkeypatch.setattr(opcount, "count_decode_ops", lambda *a: calls.append(a) or count(*a))
    session = Session()
    request = _request(tiny_dirs, rtn_drafts, "olmoe", "specter", tmp_path, num_prompts=1)
    first = prepare(spec(**request, engine="live"), session)
    again = prepare(spec(**{**request, "k": 2}, engine="live"), session)
    assert len(calls) == 1 and first.work.kernels == again.work.kernels
    assert first.work.kernels.source.startswith("counted")


def test_a_sweep_gives_back_each_systems_device_memory_before_the_next_builds_its_own(tiny_dirs, rtn_drafts, tmp_path,
                                                                                      monkeypatch):
    """A live sweep of three systems: when each runtime is built, every earlier one has given back its slots, staging
    buffers and device trees (on a GPU the memory check of the second or third system counted the first's still
    held). Counted on the CPU as device: the bytes of device tensors the earlier runtimes still hold."""
    import weakref

    from specter.offload.live import LiveRuntime
    from specter.runs import sweep

    built, held_then = [], []
    init = LiveRuntime.__init__

    def counting(self, *args, **kwargs):
        held_then.append(sum(sum(t.numel() for t in r.slots.values()) + (r.staging is not None)
                             for r in (ref() for ref in built) if r is not None))
        init(self, *args, **kwargs)
        built.append(weakref.ref(self))

    monkeypatch.setattr(LiveRuntime, "__init__", counting)
    systems = ["on-demand", "mixtral-offloading", "specter"]
    specs = [spec(**_request(tiny_dirs, rtn_drafts, "mixtral", s, tmp_path, engine="live", out=None, repeats=1))
             for s in systems]
    records = sweep(specs, tmp_path / "runs.jsonl", progress=False)
    assert [r.system for r in records] == systems and len(built) == 3
    assert held_then == [0, 0, 0]
    assert all(r() is None or (r().slots == {} and r().model is None) for r in built)


def test_a_live_run_decodes_at_the_checkpoints_own_dtype_and_a_simulation_at_float32_unless_told(tmp_path):
    """No --dtype: a live run loads a bfloat16 checkpoint at bfloat16 (its users' precision, and what fits their
    card), a simulation records at float32; --dtype wins over both. Three timed repeats of a live prompt unless
    told (the artifact's protocol), one of a simulated prompt (the others would be identical: the record says so)."""
    from specter.models.tiny import save_tiny_model
    from specter.runs import run

    model = save_tiny_model("mixtral", tmp_path / "bf16", overrides={"dtype": "bfloat16"})
    common = dict(system="on-demand", model=str(model), dataset="code", hardware="a100-40gb-pcie4", num_prompts=1,
                  prefix_tokens=8, max_new_tokens=4, resident_per_layer=2, warmup_prompts=1)
    live = run(spec(**common, engine="live", out=str(tmp_path / "live.jsonl")), progress=False)
    assert {r.config["dtype"] for r in live} == {"bfloat16"} and len(live) == 3
    assert [r.extra["repeat"] for r in live] == [0, 1, 2]
    simulated = run(spec(**common, out=str(tmp_path / "sim.jsonl")), progress=False)
    assert [r.config["dtype"] for r in simulated] == ["float32"]
    assert simulated[0].extra["repeats"] == {"asked": 3, "timed": 1, "collapsed": (
        "simulated time is deterministic: every repeat would be the same")}
    told = run(spec(**common, engine="live", dtype="float32", repeats=1, out=str(tmp_path / "told.jsonl")),
               progress=False)
    assert [r.config["dtype"] for r in told] == ["float32"]


def test_a_live_run_decodes_on_its_device_first_and_prices_its_twin_from_that_decode(tmp_path):
    """A live sweep of a 4-layer Mixtral-class checkpoint in a fresh session: no forward of the CPU's numerics runs
    (no trace, no window decoded beforehand: each twin is priced from the tokens, routes and windows its live run
    committed), and every record still carries its twin (TPOT and parts). A system that reads the recorded decode
    (Mixtral-Offloading's gate guesses) still decodes it on the CPU, and its record says so."""
    from specter.models.tiny import save_tiny_model
    from specter.quant.quantize import quantize_draft
    from specter.runs import sweep

    model = save_tiny_model("mixtral", tmp_path / "model", overrides={"num_hidden_layers": "4"})
    quantize_draft(str(model), tmp_path / "draft", method="rtn", bits=4, group_size=32)
    common = dict(model=str(model), draft=str(tmp_path / "draft"), dataset="code", hardware="a100-40gb-pcie4",
                  num_prompts=1, prefix_tokens=16, max_new_tokens=NEW, resident_per_layer=2, k=3, engine="live",
                  repeats=1, warmup_prompts=0, live_draft_kernel="packed")
    session = Session()
    records = sweep([spec(system=s, **common) for s in ("on-demand", "specter")], None, session=session,
                    progress=False)
    assert len(records) == 2 and all(service.forward_calls == 0 for _, service in session._targets.values())
    for r in records:
        assert r.extra["live_forwards"] == 0 and r.extra["live"]["twin"] == "this live decode"
        assert r.extra["simulated_tpot_ms"] > 0 and sum(r.extra["simulated_breakdown_ms"].values()) > 0
    simulation = {k: v for k, v in common.items() if k not in ("engine", "live_draft_kernel")}
    sim = sweep([spec(system=s, **simulation) for s in ("on-demand", "specter")], None, session=Session(),
                progress=False)
    assert [r.output_token_ids for r in records] == [r.output_token_ids for r in sim]  # the target's own tokens
    recorded = sweep([spec(system="mixtral-offloading", **common)], None, session=session, progress=False)
    assert recorded[0].extra["live"]["twin"] == "the recorded decode (the CPU's)"
    assert recorded[0].extra["live"]["tokens_as_recorded"] and recorded[0].extra["live_forwards"] > 0


def test_a_live_run_that_learns_from_history_decodes_its_warm_up_prompts_on_its_device(tmp_path):
    """Fiddler and MoE-Infinity learn from warm-up prompts' decodes: a live run decodes them on its own device (no
    forward of the CPU's numerics), its record says so, and they route as the CPU's decode of the same prompts does
    (the placement Fiddler learns is the same)."""
    from specter.models.tiny import save_tiny_model
    from specter.runs import sweep
    from specter.runs.execute import prepare
    from specter.runs.live import runtime, warm_up_traces

    model = save_tiny_model("mixtral", tmp_path / "model", overrides={"num_hidden_layers": "4"})
    common = dict(model=str(model), dataset="code", hardware="a100-40gb-pcie4", num_prompts=1, prefix_tokens=16,
                  max_new_tokens=NEW, resident_per_layer=2, engine="live", repeats=1, warmup_prompts=2)
    session = Session()
    records = sweep([spec(system=s, **common) for s in ("fiddler", "moe-infinity")], None, session=session,
                    progress=False)
    assert len(records) == 2 and all(service.forward_calls == 0 for _, service in session._targets.values())
    for r in records:
        assert r.extra["live_forwards"] == 0
        assert r.config["device"]["warmup"].startswith("the calibration split's first 2 prompts decoded live")
    p = prepare(spec(system="fiddler", **common), session)
    p.device = runtime(p, session)
    try:
        live = warm_up_traces(p)
    finally:
        p.device.release()
    cpu = p.warmup()  # the CPU's decode of the same prompts (what a simulation learns from)
    assert session._targets and any(service.forward_calls > 0 for _, service in session._targets.values())
    assert [t.prompt for t in live] == [t.prompt for t in cpu] and len(live) == 2
    assert [(t.prefill_routes, t.step_routes) for t in live] == [(t.prefill_routes, t.step_routes) for t in cpu]


def test_a_live_decode_counts_what_the_host_reads_of_the_device(tiny_dirs, rtn_drafts, tmp_path):
    """Each live decode's record counts the host's reads of device results (each a wait for the device on a GPU): one
    argmax a pass, one routing a target MoE layer a pass, and for a speculative system one routing a draft MoE layer a
    draft step. On-demand over N tokens: N passes; Specter: its verifications and draft steps besides the prefill."""
    session = Session()
    layers = len(load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32).moe_layers)
    for system in ("on-demand", "specter"):
        p = prepare(spec(**_request(tiny_dirs, rtn_drafts, "mixtral", system, tmp_path, engine="live")), session)
        p.device = on_live.runtime(p, session)
        live, _, _ = on_live.live_run(p, p.prompts[0], p.config, schedule)
        reads = live.extra["host_reads"]
        if system == "on-demand":
            assert reads == {"argmax": NEW, "target routing": NEW * layers}
        else:
            cycles, steps = len(live.ks), sum(live.ks)
            assert reads == {"argmax": 1 + cycles + steps, "target routing": (1 + cycles) * layers,
                             "draft routing": steps * layers}
