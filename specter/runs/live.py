"""The live engine's part of a run: the model decoding through the offload runtime, each prompt measured beside its
simulated twin.

On the CPU as device the slots are plain tensors and the clock is the wall clock (`specter.timing.wall`); on a GPU
(`--device cuda`) the model's non-expert weights, the slots and the draft's packed experts sit on the device, the store
is page-locked in place, and the copies and kernels run on CUDA streams timed with events (`specter.timing.cuda`).

Per prompt the system runs twice: live, where the trace starts empty and the live model fills it
(`specter.systems.decode`: its tokens, the prefill's and each step's routes, and every window the draft proposed and
the target verified), and simulated on the --hardware profile from that trace (`LiveNumerics`): the twin prices what
the live run computed, and nothing is decoded on the CPU first. A system that reads what a live pass does not compute
(Mixtral-Offloading's gate guesses, the oracle's recorded future) has its twin decode the recorded trace on the CPU
first, as a simulation does, and its record says whether the live tokens were the recorded ones (the CPU computes the
same arithmetic in another order, so a near-tie may decode otherwise: the record says where, and the run goes on).
The first prompt also runs live once untimed first (warm-up: the allocator and lazily sized buffers). A system that
learns from warm-up prompts (Fiddler, MoE-Infinity) has them decoded live on the device too, before the first prompt
(`warm_up_traces`). Every prompt
starts from the same cache state, set outside the timed region. The record is the live run's, measured on its device;
beside it stand the twin's TPOT and parts, and which decode the twin priced (`extra.live.twin`).
"""

from __future__ import annotations

import platform

from specter import timing
from specter.determinism import TIMED_ON_CUDA
from specter.metrics import tpot_seconds
from specter.numerics.forward import PromptTrace
from specter.systems import schedule


def counted_kernels(spec, target, draft, counted: dict, architecture=None):
    """The kernels each op stands for, counted (`specter.numerics.opcount`): on the model's own modules, or on a tiny
    instance of `architecture`'s class where the run is priced at its shapes; the draft's experts as the live engine
    runs them (on the fused INT4 kernel or packed). Counted once per model or architecture (as the run names it),
    dtype, engine (a simulation's draft is unpacked), draft and kernel in `counted` (a session's: every system of a
    sweep is priced at the same counts)."""
    import torch

    from specter.numerics.opcount import count_decode_ops, count_experts_call
    from specter.offload.work import Kernels
    from specter.quant.kernels import with_fused_kernels

    dtype = next(target.model.parameters()).dtype
    model_key = ("architecture", spec.cost_as) if architecture is not None else ("model", spec.model)
    key = (*model_key, str(dtype), spec.engine, spec.draft if draft is not None else None, spec.live_draft_kernel,
           spec.live_device)
    if key not in counted:
        experts = None
        if draft is not None:
            experts = draft.moe.moe_layers[0].experts
            if spec.live_draft_kernel == "fused":
                # a GPU's kernel refuses what it cannot compute here, before any weight moves; its modules dispatch
                # the CPU kernel's ops one for one, and are counted on the CPU's
                device = torch.device(spec.live_device)
                experts, _ = with_fused_kernels(experts, device)
                if device.type != "cpu":
                    experts, _ = with_fused_kernels(draft.moe.moe_layers[0].experts, torch.device("cpu"))
        model = architecture.tiny_model() if architecture is not None else target
        ops = count_decode_ops(model)
        draft_ops = (count_experts_call(experts, target, next(target.model.parameters()).device)
                     if experts is not None else None)
        source = ops.source if architecture is None else ops.source.replace(
            "this model's transformers modules", f"a tiny instance of {architecture.name}'s transformers class")
        counted[key] = Kernels(attention=ops.attention, expert=ops.expert, head=ops.head,
                               draft_experts=draft_ops or 1, source=source, pricing="counted")
    return counted[key]


def runtime(p, session):
    """The run's live runtime: the target (and its draft) over slots on the device, its store at the model's dtype,
    holding the one host copy of every expert (the target's own experts are views into it)."""
    from specter.offload.live import LiveRuntime

    dtype = next(p.target.model.parameters()).dtype
    device = p.spec.live_device
    on_disk = p.target.experts_on_disk is not None  # the disk tier: page-locking would hold all of it in memory
    store = session.expert_store(p.spec.model, p.target, pin=device == "cuda" and not on_disk, dtype=dtype,
                                 share=True)
    window = p.config.k or 0
    slots = p.system.layer_slots(p.work, p.slots) or p.slots  # each layer's, where the system places whole layers
    return LiveRuntime(p.target, p.work, store, slots, device, draft=p.draft, own_draft_kv=p.system.separate_draft,
                       max_context=max(len(prompt) for prompt in p.prompts) + p.spec.max_new_tokens + window + 1,
                       draft_kernel=p.spec.live_draft_kernel)


def device_name(device: str) -> str:
    """The live engine's device as records name it: the GPU's name on CUDA, else the CPU's."""
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name()
    return f"{device} ({platform.processor() or platform.machine()})"


def measured_fields(p) -> dict:
    """The run's shared record fields, as measured on the live engine's device."""
    device = p.spec.live_device
    name = device_name(device)
    store = p.device.store
    held = "once" if len(store.shared_layers) == len(store.layers) else "twice (the model's and the store's)"
    if p.target.experts_on_disk is not None:
        held = f"memory-mapped from the disk tier {p.target.experts_on_disk}, paged in as copies read them"
    measured_on = (f"measured on {name}: the model decoding live through the offload runtime" if device == "cuda"
                   else f"measured on {device}: not a calibration of a GPU")
    return {**p.common, "hardware": name, "config": {
        **p.common["config"], "device": {"name": name, "kind": device, "store_dtype": str(store.dtype),
                                         "store_pinned": "cudaHostRegister, in place" if store.pinned else False,
                                         "loader": p.target.loaded_by, "experts_on_host": held,
                                         "draft_kernel": p.device.draft_kernel,
                                         **({"warmup": WARM_UP.format(n=p.spec.warmup_prompts)}
                                            if p.system.learns_from_history and p.spec.warmup_prompts else {}),
                                         "timed_numerics": TIMED_ON_CUDA if device == "cuda" else "as pinned "
                                         "(config.numerics: on the CPU as device its numerics decide the tokens)",
                                         "measured_on": measured_on}}}


def timed(p, prompt: list[int], config, warm_up: bool):
    """The prompt decoded live, after an untimed decode where `warm_up`: (result, timeline, the trace it filled). On a
    GPU without deterministic algorithms (`determinism.timed_on`)."""
    from specter.determinism import timed_on

    with timed_on(p.spec.live_device):
        if warm_up:
            live_run(p, prompt, config, schedule)
        return live_run(p, prompt, config, schedule)


def with_twin(p, prompt: list[int], config, warm_up: bool):
    """The prompt decoded live (`timed`), then its simulated twin scheduled on what that decode computed, with no
    forward of the CPU's numerics (`LiveNumerics`): (result, timeline, trace, (twin result, twin timeline), the
    record's measured extras)."""
    from specter.numerics.forward import LiveNumerics

    result, timeline, trace = timed(p, prompt, config, warm_up)
    twin = schedule(p.system, timing.make_engine("sim", p.profile), p.work, LiveNumerics(p.service, trace), trace,
                    config, p.cost, p.warmup, online=p.online)
    return result, timeline, trace, twin, compared(p, result, twin[0], recorded=False)


#: how a live run's warm-up prompts are decoded, as its record says (`config.device.warmup`)
WARM_UP = ("the calibration split's first {n} prompts decoded live on this device, untimed and greedy, by on-demand "
           "through the run's own runtime (nothing decoded on the CPU)")


def warm_up(p) -> None:
    """Where the run's system learns from history, its warm-up traces decoded on the device (`warm_up_traces`) as
    the run's `warmup`, for its live runs and their twins alike."""
    if p.system.learns_from_history and p.spec.warmup_prompts:
        traces = warm_up_traces(p)
        p.warmup = lambda: traces


def warm_up_traces(p) -> list[PromptTrace]:
    """The warm-up prompts a system that learns from history reads (`System.learns_from_history`: the calibration
    split's first `--warmup-prompts`), each decoded live on the run's device by on-demand through the run's own
    runtime and slots (every prompt's cache state is set again before it runs), with the numerics' pins on: the
    traces its live run and its twin both learn from, with no decode on the CPU."""
    from specter.systems import DecodeConfig, get_system

    config = DecodeConfig(p.spec.max_new_tokens, p.slots, cache_start=p.config.cache_start)
    on_demand = get_system("on-demand")
    return [live_run(p, prompt, config, schedule, system=on_demand)[2]
            for prompt in p.calibration(p.spec.warmup_prompts, p.spec.prefix_tokens)]


def compared(p, result, simulated, recorded: bool) -> dict:
    """The record's measured extras beside its twin: the twin's TPOT and profile, and, where the twin decoded the
    recorded trace (`recorded`), whether the live tokens and acceptance were the recorded ones (a twin priced from the
    live decode itself has the live tokens by construction: those fields are null)."""
    diverged = next((i for i, (a, b) in enumerate(zip(result.tokens, simulated.tokens)) if a != b), None)
    return {"simulated_tpot_ms": tpot_seconds(simulated.commit_times) * 1e3, "simulated_on": p.profile.name,
            "live": {"device": p.spec.live_device,
                     "twin": "the recorded decode (the CPU's)" if recorded else "this live decode",
                     "tokens_as_recorded": diverged is None if recorded else None,
                     "first_divergence": diverged if recorded else None,
                     "acceptance_as_twin": result.accepted_lengths == simulated.accepted_lengths if recorded else None}}


def live_run(p, prompt, config, schedule, system=None):
    """One live decode of `prompt` by `system` (the run's own unless given) from the run's start state: (result,
    timeline, the trace it filled: its tokens, routes and windows)."""
    trace = PromptTrace(list(prompt), [], [], [])
    engine = timing.make_engine("live", p.profile, p.spec.live_device, streams=p.device.streams)
    before = dict(p.device.host_reads)
    result, timeline = schedule(system or p.system, engine, p.work, p.service, trace, config, p.cost, p.warmup,
                                p.device, p.online)
    result.extra["host_reads"] = {kind: n - before.get(kind, 0) for kind, n in sorted(p.device.host_reads.items())}
    return result, timeline, trace
