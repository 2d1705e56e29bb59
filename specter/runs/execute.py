"""One run: resolve its spec, prepare what it needs once (prompts, numerics, memory plan, window), schedule every
prompt, and assemble its records.

Everything that can be checked is checked before any model is loaded (`specter.runs.checks.resolve`), and `run`
writes the JSONL atomically at the end, so a bad spec or a failure leaves no partial output. Numerics come from the
`Session`'s forward service (shared by every run in the process), so a second system on the same prompts only
schedules.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from specter import timing
from specter.errors import SpecterError
from specter.metrics import RunRecord, breakdown, tpot_seconds
from specter.offload.memory import MemoryPlan, plan_memory
from specter.offload.work import ModelWork
from specter.progress import log, steps
from specter.records import record_of, run_fields, write_records
from specter.runs import live as on_live
from specter.runs.checks import Resolved, resolve
from specter.runspec import RunSpec, Window
from specter.session import Session
from specter.speculation.governor import OnlineGovernor
from specter.systems import DecodeConfig, PromptContext, System, schedule
from specter.timing.bounds import LowerBound, lower_bound
from specter.timing.cost import CostModel
from specter.timing.hardware import HardwareProfile

MEASURED = {"live": on_live}  # the engines that measure: each one's runtime and record fields


@dataclass
class PreparedRun:
    """What one run needs for all of its prompts, prepared once."""

    spec: RunSpec
    system: System
    profile: HardwareProfile
    cost: CostModel
    prompts: list[list[int]]
    target: object
    draft: object
    service: object
    work: ModelWork
    slots: int
    memory: MemoryPlan | None
    config: DecodeConfig
    governor: object
    warmup: Callable[[], list]
    common: dict
    device: object = None
    online: OnlineGovernor | None = None  # `--k online`: K re-chosen every cycle
    walked_forwards: int = 0  # forwards computed for all prompts together before scheduling (`walk_windows`)
    calibration: Callable[[int, int], list] | None = None  # (count, length) -> the calibration split's prompts


def run(spec: RunSpec, session: Session | None = None, progress: bool = True) -> list[RunRecord]:
    """Run `spec` and write its records to `spec.out`; returns them."""
    records = execute(spec, session, progress)
    write_records(records, spec.out)
    return records


def execute(spec: RunSpec | Resolved, session: Session | None = None, progress: bool = True,
            recorders: tuple = ()) -> list[RunRecord]:
    """Run `spec`; returns its records (one per prompt) without writing them. `recorders`: extra numerics of the
    target's decode to compute with every trace from now on (a sweep names those of all its systems, so a trace is
    decoded once for all of them, not again when a later system needs more)."""
    session = session or Session()
    prepared = prepare(spec, session, recorders)
    walk_windows([prepared])
    return schedule_prompts(prepared, session, progress)


def schedule_prompts(prepared: PreparedRun, session: Session, progress: bool = True) -> list[RunRecord]:
    """Schedule every prompt of a prepared run (decoded live too for `--engine live`); returns its records."""
    spec = prepared.spec
    if spec.engine in MEASURED and prepared.device is None:
        prepared.device = MEASURED[spec.engine].runtime(prepared, session)
        MEASURED[spec.engine].warm_up(prepared)  # a system that learns from history: on the device, never the CPU
        prepared.common = MEASURED[spec.engine].measured_fields(prepared)
    timed = spec.repeats if prepared.device is not None else 1  # simulated repeats are identical: run once
    try:
        return [run_prompt(prepared, index, prompt, repeat) for index, prompt in
                enumerate(steps(prepared.prompts, spec.system, unit="prompt") if progress else prepared.prompts)
                for repeat in range(timed)]
    finally:
        if prepared.device is not None:  # the device's memory back before the next run builds its runtime
            prepared.device.release()
            prepared.device = None


def prepare(run: RunSpec | Resolved, session: Session, recorders: tuple = ()) -> PreparedRun:
    """What a run needs, once: a spec `resolve`d first where it is not yet."""
    from specter.data.prompts import load_prompts

    run = run if isinstance(run, Resolved) else resolve(run, session.structures)
    spec, system, profile = run.spec, run.system, run.profile
    tokenizer = session.tokenizer(spec.model)
    prompts = load_prompts(spec.dataset, tokenizer, spec.num_prompts, spec.prefix_tokens, field=spec.field)
    calibration = partial(session.calibration_prompts, spec.model, "code")  # (count, length) -> prompts
    target, draft, service = session.numerics(spec.model, spec.draft if system.speculative else None, spec.memo,
                                              spec.dtype, stream=spec.engine == "live",
                                              packed_draft=spec.engine == "live", experts_on=spec.host_store)
    service.require((*system.trace_recorders, *recorders))
    # a live run's twin prices its weights at the dtype they decode in; a simulation at 2 bytes, the paper's targets'
    work = ModelWork.of(target, **({"weight_bytes": next(target.model.parameters()).dtype.itemsize}
                                   if spec.engine == "live" else {}))
    draft_bytes = draft.meta.expert_bytes(work.expert_shapes, spec.draft) if draft else 0
    priced_at = None
    if spec.cost_as is not None:
        work, service, draft_bytes, priced_at = _priced_at(spec, session, work, service, draft)
    if spec.resolved_pricing in ("counted", "upstream"):  # upstream: the counted figure where the stock modules run
        architecture = session.architecture(spec.cost_as)[0] if spec.cost_as is not None else None
        counted = on_live.counted_kernels(spec, target, draft, session.counted, architecture)
        work = replace(work, kernels=counted if spec.resolved_pricing == "counted" else
                       system.upstream.kernels(counted, system.name, spec.expert_bits != 16,
                                               architecture.name if architecture is not None else None))
    work, storage = work.stored_as(spec.expert_bits)
    cost = CostModel(profile)
    k_setting, k_source = _k_setting(spec, system)
    slots, memory = _memory(spec, system, work, draft_bytes, k_setting, profile.device_memory_bytes)
    k, governor, online = _window(spec, k_setting, system, calibration, service, work, cost, slots, draft_bytes,
                                  profile)
    config = DecodeConfig(spec.max_new_tokens, slots, k, spec.prefetch, draft_bytes, spec.temperature, spec.seed,
                          spec.draft_kernel, spec.cache_start)
    common = run_fields(spec, system, profile, work, slots, memory, priced_at, k_source,
                        next(target.model.parameters()).device.type, storage, session.model_hash(spec.model))
    return PreparedRun(spec, system, profile, cost, prompts, target, draft, service, work, slots, memory, config,
                       governor, _warmup(calibration, spec, service), common, online=online, calibration=calibration)


def walk_windows(runs: list[PreparedRun]) -> None:
    """Compute the windows greedy speculative runs will visit before any of them schedules a prompt, every run's
    prompts together (`ForwardService.walk`: one batch per draft step over all their rebase points), so that
    scheduling finds them memoized. Each run's first record counts the forwards (`walked_forwards`); where several runs
    walk together, the first of them that computed any. Sampled runs (temperature > 0) are prepared the same way
    (`_prepare_sampled`)."""
    from specter.numerics.forward import WindowPath

    _prepare_sampled(runs)
    groups: dict[tuple, tuple] = {}  # (the model's service, own KV) -> (service, [(run, paths)])
    for p in runs:
        if not p.system.speculative or p.config.temperature > 0 or (p.spec.engine in MEASURED
                                                                     and p.system.twin_from_live):
            continue  # a measured run whose twin is priced from its own live decode walks nothing beforehand
        tokens = p.config.max_new_tokens
        paths = []
        for prompt in p.prompts:
            trace = p.service.trace(prompt, tokens)
            if p.online is not None:  # the same choices the run's own copy of the governor will make
                online = p.online.fresh()
                paths.append(WindowPath(trace, tokens, online.next_k, online.observe))
            else:
                paths.append(WindowPath(trace, tokens, _fixed(p.system.window(p.config.k))))
        inner = getattr(p.service, "inner", p.service)  # a run priced at another architecture's shapes: its proxy's
        if inner is not p.service:
            for path in paths:
                path.trace = p.service.source(path.trace)
        key = (id(inner), p.system.separate_draft)
        groups.setdefault(key, (inner, []))[1].append((p, paths))
    for (_, own_kv), (service, members) in groups.items():
        before = service.forward_calls
        service.walk([path for _, paths in members for path in paths], own_kv=own_kv)
        members[0][0].walked_forwards += service.forward_calls - before


def _prepare_sampled(runs: list[PreparedRun]) -> None:
    """The sampled decodes of every run at a temperature above 0, before any schedules: the target's own (which every
    such run reads, `run_prompt`), then the speculative sessions of runs at a fixed K; every prompt of every run
    together, per model (`ForwardService.sampled_traces`, `prepare_sampling`). A speculative run with a governor
    samples live, one row at a time (its K follows its own acceptance). The first run of each kind counts the
    forwards: any run for the target's decodes, a speculative one for the sessions'."""
    services: dict[int, tuple] = {}  # the model's service -> (service, [run], target requests, session requests)
    for p in runs:
        if p.config.temperature <= 0:
            continue
        inner = getattr(p.service, "inner", p.service)
        _, members, decodes, sessions = services.setdefault(id(inner), (inner, [], [], []))
        members.append(p)
        tokens, temperature = p.config.max_new_tokens, p.config.temperature
        for index, prompt in enumerate(p.prompts):  # the seeds `run_prompt` draws each prompt with
            decodes.append((prompt, tokens, temperature, p.spec.seed + index))
            if p.system.speculative and p.online is None:
                sessions.append((prompt, tokens, temperature, p.spec.seed + index, p.system.window(p.config.k)))
    for service, members, decodes, sessions in services.values():
        before = service.forward_calls
        service.sampled_traces(decodes)
        members[0].walked_forwards += service.forward_calls - before
        if sessions:
            before = service.forward_calls
            service.prepare_sampling(sessions)
            first = next(p for p in members if p.system.speculative and p.online is None)
            first.walked_forwards += service.forward_calls - before


def _fixed(k: int) -> Callable[[int], int]:
    """A path's K chooser for a fixed window."""
    return lambda committed: k


def _priced_at(spec: RunSpec, session: Session, proxy_work: ModelWork, service, draft):
    """The architecture's work, the service seen through its layers, the draft's expert bytes at its shapes (the
    draft's own bits and group size), and what the records say of it."""
    from specter.models.architectures import LayerMap
    from specter.numerics.remap import MappedService

    arch, work = session.architecture(spec.cost_as)
    layer_map = LayerMap.between(work.moe_layers, proxy_work.moe_layers)
    draft_bytes = work.quantized_expert_bytes(draft.meta.bits, draft.meta.group_size) if draft else 0
    info = {"architecture": arch.name, "title": arch.title, "source": arch.source, "proxy": Path(spec.model).name,
            "layer_map": layer_map.as_dict(), "expert_bytes": work.expert_bytes, "draft_expert_bytes": draft_bytes}
    return work, MappedService(service, layer_map), draft_bytes, info


def _memory(spec: RunSpec, system: System, work: ModelWork, draft_bytes: int, k: Window,
            device_bytes: int) -> tuple[int, MemoryPlan | None]:
    """(slots per layer, memory plan or None): the system's fixed slots, or what the budget leaves after the resident
    part (the draft's experts for speculative systems, plus its own weights and KV where it keeps them)."""
    if system.fixed_slots is not None:
        return system.fixed_slots(work), None
    draft_resident = draft_bytes * len(work.moe_layers) * work.experts_per_layer
    if system.separate_draft:  # its own copy of every non-expert weight
        draft_resident += work.non_expert_bytes()
    # the speculative positions of the window this system runs with (the governors may choose up to their largest K)
    window = system.window(k.longest if k.governor and system.takes_window else k.fixed) or 0
    kv_positions = spec.prefix_tokens + spec.max_new_tokens + window
    reference = _specter_resident(spec, work, k) if spec.budget.kind == "same_memory" else None
    spec.budget.check()
    memory = plan_memory(work, kv_positions, draft_resident, spec.budget.kind, spec.budget.value,
                         kv_copies=2 if system.keeps_draft_kv else 1, device_bytes=device_bytes,
                         reference_bytes=reference)
    placed = system.layer_slots(work, memory.slots_per_layer)  # a placement of whole layers, checked here
    if placed is not None:
        memory = replace(memory, placed_slot_bytes=sum(placed.values()) * work.expert_bytes)
    return memory.slots_per_layer, memory


def _specter_resident(spec: RunSpec, work: ModelWork, k: Window) -> int:
    """Specter's resident part at this run's settings (the reference of a `--same-memory-as` budget), with this
    model's draft (one made from another model is refused, as a speculative run refuses it)."""
    from specter.models.integrity import model_hash
    from specter.offload.memory import specter_resident_bytes
    from specter.quant.meta import DraftMeta

    meta = DraftMeta.read(spec.draft)
    if meta.source_hash != model_hash(spec.model):
        raise SpecterError(f"--same-memory-as prices Specter's memory with draft {spec.draft!r}, made from "
                           f"{meta.source_model}, not from {spec.model!r}; quantize this model with `specter quantize`")
    per_expert = (work.quantized_expert_bytes(meta.bits, meta.group_size) if spec.cost_as
                  else meta.expert_bytes(work.expert_shapes, spec.draft))
    return specter_resident_bytes(work, per_expert, spec.prefix_tokens + spec.max_new_tokens + k.longest)


def _k_setting(spec: RunSpec, system: System) -> tuple[Window, str | None]:
    """The run's K setting and why: --k, or the default where a speculative run gives none (`default_k`: the
    artifact's K of the architecture the run is priced at, or of the published model whose shapes the checkpoint
    has)."""
    from specter.models.architectures import load_architecture, published_architecture
    from specter.models.loading import read_model_config
    from specter.speculation.governor import default_k

    if spec.k.value is not None:
        return spec.k, "--k" if system.speculative else None
    if not (system.speculative and system.takes_window) and spec.budget.kind != "same_memory":
        return spec.k, None
    architecture = (load_architecture(spec.cost_as).name if spec.cost_as
                    else published_architecture(read_model_config(spec.model)))
    k, why = default_k(architecture)
    return Window(k), why


def _window(spec, k_setting, system, calibration, service, work, cost, slots, draft_bytes, profile):
    """(the draft window K the run uses, the governor's choice or None, the online governor or None)."""
    if not system.speculative:
        return None, None, None
    if k_setting.governor is None or not system.takes_window:
        return system.window(k_setting.fixed), None, None
    choice = _govern(spec, k_setting, system, calibration, service, work, cost, slots, draft_bytes, profile)
    online = OnlineGovernor.calibrated(choice, spec.max_new_tokens) if k_setting.governor == "online" else None
    return system.window(choice.k), choice, online


def _govern(spec, k_setting, system, calibration, service, work, cost, slots, draft_bytes, profile):
    """Choose K on calibration prompts (never an evaluation prompt), each decoded for the run's own horizon."""
    from specter.speculation.governor import (
        CALIBRATION_PROMPTS,
        PROFILE_PROMPTS,
        CycleModel,
        choose_k_auto,
        choose_k_profile,
    )

    prompts = calibration(CALIBRATION_PROMPTS, spec.prefix_tokens)  # the profiler's are the first of them
    if k_setting.governor == "profile":
        prompts = prompts[:PROFILE_PROMPTS]
    traces = [service.trace(p, spec.max_new_tokens, calibration=True) for p in prompts]
    if k_setting.governor in ("auto", "online"):
        model = CycleModel(work, cost, slots, draft_bytes, context=spec.prefix_tokens + spec.max_new_tokens // 2,
                           top_k=work.top_k, missable=slots < work.experts_per_layer,
                           fused=spec.draft_kernel == "fused")
        return choose_k_auto(service, traces, model, spec.max_new_tokens)

    from specter.numerics.forward import WindowPath
    from specter.speculation.governor import candidates_for

    # every K's windows over the calibration prompts first, all together (each K's runs below then only schedule)
    service.walk([WindowPath(trace, spec.max_new_tokens, _fixed(system.window(k)))
                  for k in sorted(candidates_for(spec.max_new_tokens), reverse=True) for trace in traces],
                 own_kv=system.separate_draft)

    def tpot_with(k: int) -> float:
        config = DecodeConfig(spec.max_new_tokens, slots, k, spec.prefetch, draft_bytes, draft_kernel=spec.draft_kernel,
                              cache_start=spec.cache_start)
        tpots = []
        for trace in traces:
            ctx = PromptContext.fresh(system, timing.make_engine("sim", profile), work, service, trace, config, cost)
            tpots.append(tpot_seconds(system.run(ctx).commit_times))
        return sum(tpots) / len(tpots)

    return choose_k_profile(tpot_with, spec.max_new_tokens)


def _warmup(calibration, spec: RunSpec, service) -> Callable[[], list]:
    """Traces of warm-up prompts from the calibration split (never the evaluation prompts), computed once, lazily."""
    warm: list = []

    def warmup() -> list:
        if not warm:
            for p in calibration(spec.warmup_prompts, spec.prefix_tokens):
                warm.append(service.trace(p, spec.max_new_tokens, calibration=True))
        return warm

    return warmup


def run_prompt(p: PreparedRun, index: int, prompt: list[int], repeat: int = 0) -> RunRecord:
    """Schedule one prompt (simulated; then decoded live for live runs, as its `repeat`-th timed run) and assemble its
    record."""
    wall = time.perf_counter()
    forwards = p.service.forward_calls
    config = p.config
    if config.temperature > 0:
        config = replace(config, seed=p.spec.seed + index)
    engine, first = MEASURED.get(p.spec.engine), index == repeat == 0
    if p.device is not None and p.system.twin_from_live:  # decoded live first, its twin priced from what it computed
        result, timeline, trace, (result_sim, timeline_sim), measured = engine.with_twin(p, prompt, config, first)
    else:
        trace = (p.service.sampled_trace(prompt, config.max_new_tokens, config.temperature, config.seed)
                 if config.temperature > 0 else p.service.trace(prompt, config.max_new_tokens))
        result, timeline = schedule(p.system, timing.make_engine("sim", p.profile), p.work, p.service, trace, config,
                                    p.cost, p.warmup, online=p.online)
        if p.device is not None:  # the simulated run above is the twin: now decoded live
            (result_sim, timeline_sim), (result, timeline, _) = (result, timeline), engine.timed(p, prompt, config,
                                                                                                  first)
            measured = engine.compared(p, result, result_sim, recorded=True)
    if p.device is not None:
        twin = breakdown(timeline_sim.spans, result_sim.commit_times[0], result_sim.commit_times[-1])
        measured = {**measured, "simulated_breakdown_ms": {part: s * 1e3 for part, s in twin.items()},
                    "repeat": repeat, "repeats": {"asked": p.spec.repeats, "timed": p.spec.repeats}}
    else:
        measured = {"repeats": {"asked": p.spec.repeats, "timed": 1, **(
            {"collapsed": "simulated time is deterministic: every repeat would be the same"} if p.spec.repeats > 1
            else {})}}
    lower_bound = _bound(p, index, result, trace)
    # the first record also counts the forwards computed for every prompt together before scheduling
    live = p.service.forward_calls - forwards + (p.walked_forwards if first else 0)
    return record_of(p, index, prompt, result, timeline, lower_bound, config.seed, time.perf_counter() - wall, live,
                     measured)


def _bound(p: PreparedRun, index: int, result, trace) -> LowerBound:
    """The prompt's lower bound (per pass for a speculative system, per token otherwise), checked against its TPOT:
    a simulated run below it is a bug in the bound or the schedule; a measured one below it means the profile is
    slower than this device."""
    decode_routes = result.decode_routes if result.decode_routes is not None else trace.step_routes
    bound = lower_bound(result.executor.passes[result.first_decode_pass :], len(result.commit_times),
                        decode_routes[: p.spec.max_new_tokens - 1], p.slots, p.work.expert_bytes, p.work.expert_params,
                        p.cost, host_compute=p.system.host_compute, speculative=p.system.speculative)
    lb = bound.seconds
    tpot = tpot_seconds(result.commit_times)
    if tpot < lb:
        if p.spec.engine == "sim":  # the simulator executes at least the work the bound counts
            raise RuntimeError(f"{p.spec.system} prompt {index}: simulated TPOT {tpot} s below its lower bound {lb} s; "
                               "the bound or the schedule is wrong, please report this")
        log.warning(f"warning: {p.spec.system} prompt {index}: measured TPOT {tpot * 1e3:.4f} ms is below the lower "
                    f"bound {lb * 1e3:.4f} ms of profile {p.profile.name!r}, which is slower than this device; "
                    "measure one with `specter profile-bandwidth` and pass its profile.yaml as --hardware")
    return bound
