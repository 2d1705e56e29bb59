"""The live engine's device side: what it puts on the device, the memory it checks first, the store page-locked in
place, and the experts computed without a host synchronization (the GPU's way), held on the CPU; on a GPU (gpu
marker) the live engine decodes through CUDA streams.

On the CPU, the tensors are moved to the meta device (no memory, no GPU) to see where each would go, CUDA's memory
query and host registration are stand-ins that record what was asked, and the GPU's expert path runs on the CPU.
"""

from __future__ import annotations

import gc

import pytest
import torch

from conftest import spec
from specter.errors import SpecterError
from specter.models import load_moe_model
from specter.models.experts import expert_ffn, module_ffn
from specter.models.trees import experts_path, moved_bytes, moved_to, with_replaced
from specter.offload.live import LiveRuntime
from specter.offload.store import ExpertStore
from specter.offload.work import ModelWork
from specter.quant.draft import load_draft
from specter.runs import live as on_live
from specter.runs.execute import prepare, schedule
from specter.session import Session

NEW = 10


def _trees(target, draft):
    """The live engine's two trees before they move: the target with its routed experts replaced, and the draft."""
    target_tree = with_replaced(target.model, {experts_path(target, m): torch.nn.Identity() for m in target.moe_layers})
    return [target_tree, draft.model]


def _tensors(tree):
    """{id: tensor} of every parameter, buffer and tensor attribute in `tree`."""
    out = {}
    for m in tree.modules():
        for t in [*m._parameters.values(), *m._buffers.values(), *(v for v in vars(m).values()
                                                                      if isinstance(v, torch.Tensor))]:
            if t is not None:
                out[id(t)] = t
    return out


def test_the_models_own_tensors_move_to_the_device_once_and_stay_shared(tiny_dirs, rtn_drafts):
    """Every tensor of both trees lands on the device, each shared one (attention, routers, norms, embeddings, head)
    as one tensor that both trees hold; the target keeps its own; the routed experts do not move; the bytes the
    memory check counts are those of the moved tensors, each once. On the CPU as device nothing is copied."""
    target = load_moe_model(tiny_dirs["deepseek_v3"], dtype=torch.float32)
    draft = load_draft(target, rtn_drafts["deepseek_v3"], packed=True)
    trees = _trees(target, draft)
    meta = torch.device("meta")
    moved = moved_to(trees, meta)
    held = [_tensors(tree) for tree in moved]
    assert all(t.device == meta for tensors in held for t in tensors.values())
    assert all(t.device.type == "cpu" for t in _tensors(target.model).values())  # the target keeps its own
    shared = set(held[0]) & set(held[1])
    embed = moved[0].get_submodule("model.embed_tokens").weight
    assert id(embed) in shared and embed is moved[1].get_submodule("model.embed_tokens").weight
    attn = "model.layers.1.self_attn"
    assert moved[0].get_submodule(attn) is moved[1].get_submodule(attn)
    routed = {id(p) for m in target.moe_layers for p in m.experts.parameters()}
    originals = {**_tensors(trees[0]), **_tensors(trees[1])}
    assert not routed & set(originals)
    assert moved_bytes(trees, meta) == sum(t.numel() * t.element_size() for t in originals.values())
    assert len({id(t) for tensors in held for t in tensors.values()}) == len(originals)  # one copy each
    on_cpu = moved_to(trees, torch.device("cpu"))
    assert moved_bytes(trees, torch.device("cpu")) == 0
    assert on_cpu[0].get_submodule("model.embed_tokens").weight.data_ptr() == target.model.model.embed_tokens \
        .weight.data_ptr()


class _NoData(torch.nn.Module):
    """A routed experts module on a device that holds no data (meta): the live engine's sync-free expert arithmetic
    (every token weighted by its routing) over an expert's views of a slot row there, and each of the draft's packed
    linears of expert 0 (`inner`), then zeros, so the pass goes on to the next layer."""

    def __init__(self, layout, inner=None, moe=None) -> None:
        super().__init__()
        self.layout, self.inner, self.moe = layout, inner, moe

    def forward(self, hidden, top_k_index, top_k_weights):
        assert hidden.device.type == top_k_index.device.type == top_k_weights.device.type == "meta"
        weight = (top_k_weights * (top_k_index == 0)).sum(-1, keepdim=True)
        row = torch.empty(self.layout.numel, dtype=hidden.dtype, device=hidden.device)
        assert (expert_ffn(hidden, self.layout.views(row)) * weight).device.type == "meta"
        if self.inner is not None:
            assert module_ffn(hidden, self.inner[0], self.moe.activation, self.moe.spec.gpt_oss_layout).shape == \
                hidden.shape
        return torch.zeros_like(hidden)


@pytest.mark.parametrize("arch", ["deepseek_v2", "deepseek_v3", "gpt_oss", "mixtral", "olmoe", "phimoe", "qwen2_moe",
                                  "qwen3_moe"])
def test_the_live_trees_run_whole_passes_off_the_cpu(arch, tiny_dirs, tmp_path):
    """Moved to a device other than the CPU (meta: shapes and devices, no data), the live target's tree and its draft's
    run whole passes there, every class: embeddings, masks, rotary, attention, routers, shared experts, the experts'
    arithmetic from a slot row and the draft's packed linears, the head. A tensor left on the CPU, or made there by the
    code a pass runs, would stop it."""
    from specter.quant.quantize import quantize_draft

    quantize_draft(tiny_dirs[arch], tmp_path / "draft", method="rtn", bits=4, group_size=32)
    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    draft = load_draft(target, tmp_path / "draft", packed=True)
    layout = ExpertStore(target, dtype=torch.float32).layout
    trees = [with_replaced(target.model, {experts_path(target, m): _NoData(layout) for m in target.moe_layers}),
             with_replaced(draft.model, {experts_path(draft.moe, m): _NoData(layout, m.experts, m)
                                         for m in draft.moe.moe_layers})]
    for tree in moved_to(trees, torch.device("meta")):
        with torch.no_grad():
            out = tree(input_ids=torch.tensor([[3, 1, 4, 1]], device="meta"), use_cache=True)
        assert out.logits.device.type == "meta" and out.logits.shape[:2] == (1, 4)


def test_a_live_run_that_does_not_fit_the_device_is_refused_before_anything_is_allocated(tiny_dirs, rtn_drafts,
                                                                                         monkeypatch):
    """On CUDA the runtime adds up what it will hold (slots, staging buffers, the model's non-expert weights with the
    draft's packed experts, the KV cache) and refuses, in one line naming each part, a run that exceeds the free
    memory, before it allocates anything; the parts are what it would allocate."""
    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    draft = load_draft(target, rtn_drafts["mixtral"], packed=True)
    work = ModelWork.of(target)
    store = ExpertStore(target, dtype=torch.float32)
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (1, 80 * 10**9))
    with pytest.raises(SpecterError) as err:
        LiveRuntime(target, work, store, 2, "cuda", draft=draft, max_context=64)
    assert asked and all(part in str(err.value) for part in (
        "expert slots", "staging buffers", "non-expert weights and the draft's experts", "KV cache (64 positions)",
        "the draft's codes dequantized on each call"))  # the packed kernel's temporaries, its largest linear's
    parts = LiveRuntime.device_bytes(_trees(target, draft), work, store, 2, "cuda", 64)
    assert parts["expert slots"] == len(work.moe_layers) * 2 * store.expert_bytes
    from specter.quant.packing import dequantize_peak_bytes

    linear = draft.moe.moe_layers[0].experts[0].gate_proj
    weights = linear.qweight.shape[1] * linear.g_idx.numel()
    assert 24 * weights <= dequantize_peak_bytes(linear._packed()) <= 32 * weights  # int64 codes and zeros, floats
    with pytest.raises(SpecterError) as err:  # the fused kernel dequantizes nothing
        LiveRuntime(target, work, store, 2, "cuda", draft=draft, max_context=64, draft_kernel="fused")
    assert "dequantized" not in str(err.value) and "the draft's experts" in str(err.value)
    cpu = LiveRuntime(target, work, store, 2, "cpu", draft=draft)  # nothing is asked off CUDA
    assert len(asked) == 2 and cpu.slots[work.moe_layers[0]].numel() * 4 == 2 * store.expert_bytes


class _Cudart:
    """Stands in for `torch.cuda.cudart()` as CUDA behaves: records each call, refuses memory registered already
    (712) or not registered (713), answers `error` to a registration, and keeps the last error set, as PyTorch's next
    kernel launch would find it (`last`), until it is cleared."""

    def __init__(self, error: int = 0, refuse_unregister: int = 0) -> None:
        self.registered, self.unregistered, self.error, self.refuse = [], [], error, refuse_unregister
        self.regions: dict[int, int] = {}
        self.last = 0

    def cudaHostRegister(self, address, nbytes, flags):  # noqa: N802 (CUDA's name)
        self.registered.append((address, nbytes, flags))
        if any(a < address + nbytes and address < a + n for a, n in self.regions.items()):
            self.last = 712
        elif self.error:
            self.last = self.error
        else:
            self.regions[address] = nbytes
            return 0
        return self.last

    def cudaHostUnregister(self, address):  # noqa: N802
        self.unregistered.append(address)
        if self.refuse or address not in self.regions:
            self.last = self.refuse or 713
            return self.last
        del self.regions[address]
        return 0


def test_the_store_is_page_locked_where_it_lies(tiny_dirs, monkeypatch):
    """A pinned store registers each layer's rows in place (cudaHostRegister, the rows' own address and size): nothing
    is copied, the target's experts stay views into them, and they are unregistered when the store goes. A refusal is
    one line naming the bytes and the fix."""
    cudart = _Cudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    store = ExpertStore(target, pin=True, dtype=torch.float32, share=True)
    assert store.pinned and store.shared_layers == list(store.layers)  # still one host copy of every expert
    rows = list(store.layers.values())
    assert cudart.registered == [(r.data_ptr(), r.numel() * r.element_size(), 0) for r in rows]
    first = target.moe_layers[0]
    assert first.experts.gate_up_proj.data_ptr() == rows[0].data_ptr()
    store.pin()
    assert len(cudart.registered) == len(rows)  # once
    addresses = [r.data_ptr() for r in rows]
    del store, rows
    gc.collect()
    assert cudart.unregistered == addresses

    monkeypatch.setattr(torch.cuda, "cudart", lambda: _Cudart(error=2))
    with pytest.raises(SpecterError, match=r"cudaHostRegister of .* GB of experts failed \(CUDA error 2\).*ulimit -l"):
        ExpertStore(target, pin=True, dtype=torch.float32)


def test_page_locking_errors_are_cleared_and_said_and_leave_nothing_registered(tiny_dirs, monkeypatch, capsys):
    """A registration CUDA refuses as memory page-locked already (712: a second store over the same rows, or other
    code's) is one line, and no CUDA error is left set for the next kernel launch to raise; the first store stays
    page-locked. A registration refused midway leaves nothing registered and the store unpinned; a refused
    unregistration is said in one warning."""
    from specter import progress
    from specter.offload import store as stores

    cudart = _Cudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    monkeypatch.setattr(stores, "clear_cuda_error", lambda: setattr(cudart, "last", 0))
    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    first = ExpertStore(target, pin=True, dtype=torch.float32, share=True)
    rows = {r.data_ptr(): r.numel() * r.element_size() for r in first.layers.values()}
    with pytest.raises(SpecterError, match=r"page-locked already \(CUDA error 712\)"):
        ExpertStore(target, pin=True, dtype=torch.float32, share=True)
    assert first.pinned and cudart.regions == rows and cudart.last == 0
    del first
    gc.collect()
    assert cudart.regions == {} and cudart.last == 0

    class Midway(_Cudart):
        def cudaHostRegister(self, address, nbytes, flags):  # noqa: N802
            self.error = 2 if self.regions else 0  # the second layer is refused
            return super().cudaHostRegister(address, nbytes, flags)

    cudart = Midway()
    with pytest.raises(SpecterError, match=r"CUDA error 2"):
        ExpertStore(target, pin=True, dtype=torch.float32, share=True)
    assert cudart.regions == {} and cudart.last == 0

    cudart = _Cudart(refuse_unregister=1)
    progress.configure()
    capsys.readouterr()
    store = ExpertStore(target, pin=True, dtype=torch.float32, share=True)
    del store
    gc.collect()
    err = capsys.readouterr().err
    assert err.count("cudaHostUnregister refused") == 1 and "CUDA error 1" in err and cudart.last == 0


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3"])
@pytest.mark.parametrize("system", ["on-demand", "specter"])
def test_experts_computed_without_a_host_synchronization_decode_the_same(arch, system, tiny_dirs, rtn_drafts,
                                                                         tmp_path):
    """The GPU's expert path (every token of the pass through each expert it reaches, weighted by its routing, 0
    where it went elsewhere: no gather whose indices the host must wait for) commits the same tokens as the stock
    module's gather, with logits equal to rounding."""
    request = dict(system=system, model=tiny_dirs[arch], draft=rtn_drafts[arch], dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"), num_prompts=1, prefix_tokens=16,
                   max_new_tokens=NEW, resident_per_layer=2, k=3, warmup_prompts=2, engine="live")
    session = Session()
    p = prepare(spec(**request), session)
    p.device = on_live.runtime(p, session)
    prompt = p.prompts[0]
    gathered, _, _ = on_live.live_run(p, prompt, p.config, schedule)
    p.device.gathers = False
    weighted, _, _ = on_live.live_run(p, prompt, p.config, schedule)
    assert weighted.tokens == gathered.tokens and weighted.accepted_lengths == gathered.accepted_lengths
    torch.testing.assert_close(weighted.executor.last_pass.logits, gathered.executor.last_pass.logits, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe", "deepseek_v3", "olmoe"])
@pytest.mark.parametrize("kernel", ["packed", "fused"])
def test_the_draft_gathers_from_routes_the_host_has_read(arch, kernel, tiny_dirs, rtn_drafts):
    """The live draft's experts gather each expert's tokens by indices built from the routing the host has read
    already (no `unique` or `where` on the device, each a wait on a GPU): the same output, bit for bit, as indices
    from the device, for the packed and the fused kernels, over tokens that share and split their experts."""
    from specter.quant.kernels import with_fused_kernels

    target = load_moe_model(tiny_dirs[arch], dtype=torch.float32)
    experts = load_draft(target, rtn_drafts[arch], packed=True).moe.moe_layers[0].experts
    if kernel == "fused":
        experts, _ = with_fused_kernels(experts, torch.device("cpu"))
    moe = target.moe_layers[0]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, moe.hidden_size, generator=g)
    index = torch.stack([torch.randperm(moe.num_experts, generator=g)[: moe.top_k] for _ in range(7)])
    index[3] = index[1]  # two tokens on the same experts
    weights = torch.rand(7, moe.top_k, generator=g)
    with torch.no_grad():
        from_device = experts(hidden, index, weights)
        from_host = experts(hidden, index, weights, routes=index.tolist())
    assert torch.equal(from_host, from_device) and from_host.abs().sum() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("system", ["on-demand", "mixtral-offloading", "fiddler", "specter", "specmoeoff"])
def test_the_live_engine_decodes_on_a_gpu(system, tiny_dirs, rtn_drafts, tmp_path):
    """On CUDA the model's non-expert weights, its slots and its draft sit on the GPU, the store is page-locked in
    place and the copies run on the copy stream: each system commits `generate`'s greedy tokens (the same model on the
    GPU), and its records are measured there, beside the simulated twin."""
    from specter.runs.execute import execute

    request = dict(system=system, model=tiny_dirs["mixtral"], draft=rtn_drafts["mixtral"], dataset="code",
                   hardware="a100-40gb-pcie4", out=str(tmp_path / "x.jsonl"), num_prompts=2, prefix_tokens=16,
                   max_new_tokens=NEW, resident_per_layer=2, k=3, warmup_prompts=2, engine="live",
                   live_device="cuda")
    session = Session()
    p = prepare(spec(**request), session)
    p.device = on_live.runtime(p, session)
    assert p.device.store.pinned and p.device.model.get_submodule("model.embed_tokens").weight.is_cuda
    prompt = p.prompts[0]
    on_gpu = moved_to([load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32).model], torch.device("cuda"))[0]
    with torch.no_grad():
        reference = on_gpu.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW, do_sample=False,
                                    eos_token_id=None, pad_token_id=on_gpu.config.pad_token_id)[0, len(prompt):]
    live, timeline, _ = on_live.live_run(p, prompt, p.config, schedule)
    assert live.tokens == reference.tolist()
    assert all(b >= a for a, b in zip(live.commit_times, live.commit_times[1:]))
    assert timeline.busy_seconds("h2d") > 0 or system == "fiddler"
    records = execute(spec(**request, repeats=2), Session(), progress=False)
    assert len(records) == 4 and all(r.engine == "live" and not r.simulated and r.tpot_ms > 0 for r in records)
    assert all(r.config["device"]["measured_on"].startswith(f"measured on {torch.cuda.get_device_name()}")
               for r in records)


@pytest.mark.gpu
def test_a_resident_bfloat16_model_on_a_gpu_reads_no_routing_before_its_experts(tiny_dirs):
    """On CUDA, every expert of a bfloat16 model resident: each layer computes grouped (`offload.grouped`) and the
    host reads no routing before the pass's argmax; its logits stay those of the expert-by-expert path within
    bfloat16's rounding, and its greedy token is the same."""
    from specter.offload.cache import ExpertCache
    from specter.offload.executor import Executor, TransferStats
    from specter.offload.work import ModelWork
    from specter.timing.cuda import CudaEngine

    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.bfloat16)
    work = ModelWork.of(target)
    runtime = LiveRuntime(target, work, ExpertStore(target, dtype=torch.bfloat16), work.experts_per_layer, "cuda")
    assert runtime.grouped_ready(work.moe_layers[0])
    logits = {}
    for grouped in (True, False):
        runtime._grouped = grouped
        ex = Executor(CudaEngine(streams=runtime.streams), work, ExpertCache(work.moe_layers, work.experts_per_layer),
                      TransferStats(), device=runtime)
        ex.place({layer: list(range(work.experts_per_layer)) for layer in work.moe_layers})
        before = dict(runtime.host_reads)
        ex.target_pass(None, context=0, tag="prefill", inputs=list(range(5, 21)))
        logits[grouped] = ex.last_pass.logits
        if grouped:
            assert runtime.host_reads["target routing"] == before.get("target routing", 0)
    assert torch.allclose(logits[True], logits[False], rtol=2e-2, atol=2e-2)
    assert logits[True][-1].argmax() == logits[False][-1].argmax()


def test_a_timed_gpu_decode_runs_without_deterministic_algorithms_and_the_record_says_so(monkeypatch):
    """Deterministic algorithms slow a GPU's kernels and decide none of its greedy tokens: a timed decode on CUDA runs
    without them and puts them back after (an error inside included); on the CPU as device they stay."""
    from specter.determinism import TIMED_ON_CUDA, timed_on

    torch.use_deterministic_algorithms(True)
    seen = []
    with timed_on("cuda"):
        seen.append(torch.are_deterministic_algorithms_enabled())
    with pytest.raises(RuntimeError), timed_on("cuda"):
        raise RuntimeError("a failed decode")
    with timed_on("cpu"):
        seen.append(torch.are_deterministic_algorithms_enabled())
    assert seen == [False, True] and torch.are_deterministic_algorithms_enabled()
    assert "deterministic algorithms off" in TIMED_ON_CUDA


@pytest.mark.parametrize("slots", [2, 8])
def test_a_target_layers_routing_is_read_after_the_executors_one_timed_wait(slots, tiny_dirs, monkeypatch):
    """The host reads a target MoE layer's routing once it has waited for the router in the executor's timed
    synchronization (so the wait is where the timeline shows it), with slots that can miss; the read itself then waits
    for nothing. With every expert resident it reads the routing only after the pass's argmax read
    (`offload.grouped`)."""
    from collections import Counter

    from specter.offload import live
    from specter.runs.execute import execute
    from specter.timing.wall import WallEngine

    log: list[str] = []

    class Logged(Counter):
        def __setitem__(self, key, value):
            log.append(key)
            super().__setitem__(key, value)

    synchronize = WallEngine.synchronize
    monkeypatch.setattr(live, "Counter", Logged)
    monkeypatch.setattr(WallEngine, "synchronize", lambda self, event=None: log.append("sync") or synchronize(
        self, event))
    request = dict(system="on-demand", model=tiny_dirs["mixtral"], dataset="code", hardware="a100-40gb-pcie4",
                   out="unused.jsonl", num_prompts=1, prefix_tokens=16, max_new_tokens=4, resident_per_layer=slots,
                   warmup_prompts=0, engine="live", repeats=1)
    execute(spec(**request), Session(), progress=False)
    reads = [i for i, what in enumerate(log) if what == "target routing"]
    after = [i for i, what in enumerate(log) if what == "target routing, read after the pass"]
    if slots < 8:
        assert reads and not after and all(log[i - 1] == "sync" for i in reads), log[:12]
    else:  # each pass's reads follow its argmax read, with no synchronization between
        assert after and not reads and all(next(w for w in log[i::-1] if w != log[i]) == "argmax" for i in after), log



def test_a_host_expert_takes_its_tokens_from_the_routing_the_host_read(tiny_dirs):
    """Fiddler's host experts beside a device: which tokens, at which top-k place, come from the routing the host has
    read, so the router's index never crosses to the host; its tokens' rows are gathered on the device before they
    do. (A meta tensor stands for the device: no copy leaves it, so the first copy to the host is the one seen.)"""
    from types import SimpleNamespace

    from torch.utils._python_dispatch import TorchDispatchMode

    target = load_moe_model(tiny_dirs["mixtral"], dtype=torch.float32)
    store = ExpertStore(target, dtype=torch.float32)
    layer = target.moe_layers[0].layer_index
    rows = [[1, 0], [2, 1], [3, 4]]
    meta = torch.device("meta")
    hidden = torch.empty(3, store.layout.views(store.row(layer, 1)).gate.shape[1], device=meta)
    index, weights = torch.tensor(rows, device=meta), torch.empty(3, 2, device=meta)
    crossed: list[tuple] = []

    class FirstCopyOut(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].device == meta:
                crossed.append((args[0].dtype, tuple(args[0].shape)))
                raise StopIteration
            return func(*args, **(kwargs or {}))

    runtime = SimpleNamespace(_call=(hidden, index, weights, {}, rows), gathers=False)
    with FirstCopyOut(), pytest.raises(StopIteration):
        LiveRuntime._compute(runtime, layer, 1, store.layout.views(store.row(layer, 1)))
    assert crossed == [(torch.float32, (2, hidden.shape[1]))]  # the two rows routed to expert 1, not the index
