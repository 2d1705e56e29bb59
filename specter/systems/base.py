"""The System base class, what one prompt's run is given (`PromptContext`) and what it produces (`PromptResult`).

A system turns one prompt's numerics (from the forward service) into a schedule on the engine: which copies, which
compute, in what order, waiting on what. Every system is lossless: at greedy decoding it commits the target's tokens.
Systems never branch on the engine's kind. A system customises the shared runtime only through declared points:
- `make_cache` and `make_executor`: the expert cache and the layer executor of each prompt (factories);
- `PassHooks` added to `ctx.executor.hooks`: acting once a layer's routing is known, after each draft layer, or
  before each decode step;
- for speculative systems, `planner` (a `WindowPlanner`) and `forecast`;
- `trace_recorders`: extra numerics of the target's decode it needs (computed only when a system declares them);
- `window`: the draft window K it runs with (the one number the memory plan, the device runtime and the decode share).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from specter.errors import SpecterError
from specter.numerics.forward import ForwardService, PromptTrace, TraceRecorder
from specter.offload.cache import ExpertCache
from specter.offload.executor import Executor
from specter.offload.hooks import PassHooks, TransferStats
from specter.offload.work import ModelWork, Upstream
from specter.runspec import RunSpec
from specter.runspec.parts import parse_option
from specter.timing.cost import CostModel
from specter.timing.engine import Engine

__all__ = ["DecodeConfig", "PassHooks", "PredictionCounts", "PromptContext", "PromptResult", "System"]


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int
    slots_per_layer: int
    k: int | None = None  # draft window (speculative systems); None: not speculative
    prefetch: str = "adaptive"
    draft_expert_bytes: int = 0  # one quantized draft expert as stored (speculative systems)
    temperature: float = 0.0  # 0: greedy (memoized numerics); > 0: live sampling with `seed`
    seed: int = 42
    draft_kernel: str = "fused"  # "fused": the draft's experts of a layer as one INT4 MoE kernel; "unfused"
    cache_start: str = RunSpec.cache_start  # "restored" (the artifact's resident set) or "empty"; see runspec


@dataclass
class PredictionCounts:
    """Expert prediction of one (layer, lookahead distance): true positives, predicted and actual set sizes."""

    tp: int = 0
    predicted: int = 0
    actual: int = 0


@dataclass
class PromptResult:
    tokens: list[int]
    commit_times: list[float]  # seconds since the prompt started, one per committed token
    stats: TransferStats
    executor: Executor
    k: int | None = None
    proposed: int = 0
    checked: int = 0
    accepted: int = 0
    accepted_lengths: Counter = field(default_factory=Counter)
    prediction: dict[tuple[int, int], PredictionCounts] = field(default_factory=dict)
    window_hits: int = 0  # planned experts the verification used
    window_needed: int = 0  # experts the verification used, summed over windows and MoE layers
    window_layers: int = 0  # (window, MoE layer) pairs counted in window_needed
    window_placed: int = 0  # experts the window's prefetch had placed (copied, or kept and protected), summed
    first_decode_pass: int = 1  # index in executor.passes of the first pass after the first commit
    ks: list[int] = field(default_factory=list)  # the window of every cycle (one value unless K was re-chosen)
    decode_routes: list | None = None  # routes of the committed decode inputs, where they differ from the trace's
    #: verifications whose batched argmax differed from the incremental decode at a precision below float32 (a
    #: near-tie): {position, verified, recorded}; the run committed the recorded tokens and went on
    near_ties: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)  # what the system noted about this run (`PromptContext.extra`)


@dataclass
class PromptContext:
    system: System
    engine: Engine
    work: ModelWork
    cache: ExpertCache
    executor: Executor
    service: ForwardService
    trace: PromptTrace
    config: DecodeConfig
    cost: CostModel  # the hardware profile's cost model, for systems that plan from a latency model
    warmup: Callable[[], list[PromptTrace]] | None = None  # traces of warm-up prompts (calibration split), lazily
    online: object = None  # an OnlineGovernor re-choosing K every cycle (`--k online`), or None
    extra: dict = field(default_factory=dict)  # what the system notes about this prompt's run, for its record's extra

    @classmethod
    def fresh(cls, system: System, engine: Engine, work: ModelWork, service: ForwardService, trace: PromptTrace,
              config: DecodeConfig, cost: CostModel, warmup: Callable[[], list[PromptTrace]] | None = None,
              device=None) -> PromptContext:
        """A context with the system's own cache and executor, the cache in its start state: every prompt starts from
        the same one, set outside the timed region. `restored` (the default) is the artifact's
        (benchmarks/cache_reset.py `ResidentReset.restore`, before every input): the resident set its loader placed,
        the experts of id at least E - slots of each layer (initialization/target_builder.py `build_model` offloads
        the first E - slots), least recently used first; `empty` starts with no expert on the device. A system that
        places experts itself (resident, Fiddler) replaces that set. `device`: the `LiveRuntime` whose slots and
        model back the ops (live engine runs), or None."""
        cache = system.make_cache(work, config.slots_per_layer, [*trace.prefill_routes, *trace.step_routes])
        executor = system.make_executor(engine, work, cache, TransferStats(), device=device, cost=cost)
        engine.runtime_dispatch(executor.work.kernels.dispatch)  # as the system's runtime hands kernels over
        executor.fused_draft = config.draft_kernel == "fused"
        if config.cache_start == "restored":
            executor.place(restored_residents(work, cache.slots_per_layer))
        return cls(system, engine, work, cache, executor, service, trace, config, cost, warmup)


def restored_residents(work: ModelWork, slots: int) -> dict[int, list[int]]:
    """{MoE layer: the experts the artifact's loader leaves on the device, least recently used first}: the last
    `slots` of the layer's experts by id."""
    first = max(0, work.experts_per_layer - slots)
    return {layer: list(range(first, work.experts_per_layer)) for layer in work.moe_layers}


class System:
    """Base of every system: `run` schedules one prompt and returns its commits.

    `options`: {name: (type, default, help[, (low, high)])} a system accepts through `--system-option NAME=VALUE`."""

    name: str = ""
    #: its place in every table and figure, lower first (ties by name): the references, the baselines by their papers'
    #: order, a system that sets none, then Specter's own (read from the source by `specter.system_names`); a class's
    #: own, never its parent's (`__init_subclass__`)
    order: int = 100
    #: its colour in every figure, "#rrggbb" (empty: one of `specter.report.plotting`'s spare colours, by its name);
    #: a class's own, as `order`
    colour: str = ""
    speculative: bool = False
    #: the draft window comes from the run's --k (a speculative system with its own K option sets False)
    takes_window: bool = True
    #: the draft keeps its own weights and KV (memory for them, and its own prefill), instead of sharing the target's
    separate_draft: bool = False
    #: computes missing experts on the host: the lower bound's link term accounts for that alternative
    host_compute: bool = False
    #: copies every expert of a layer when the layer runs, not only the missing ones (records' demand bytes are then
    #: whole layers' experts; a miss of every other copying system copies exactly its expert)
    copies_whole_layers: bool = False
    #: its device never waits on work of another stream that the host has not already waited for itself (llama.cpp's
    #: blocking copies at each change of backend): the simulator books it no stall (records' `stall_ms` is 0)
    stall_free: bool = False
    #: every expert it prefetches stays protected until the window's verification, so its prefetches are among the
    #: experts the window placed (records' prefetch bytes at most `extra.counts.window_placed` experts)
    prefetch_in_window: bool = False
    #: the prefetch plans a window makes at most, each at most a layer's slots of experts in each MoE layer (records'
    #: prefetch bytes at most plans x decode passes x layers x slots experts); None where no such count bounds them
    window_plans: int | None = None
    #: which MoE layers keep their experts on the host for the whole run (records say in `extra.host_layers`): every
    #: one ("every"), the leading ones ("leading"), or None (a system that places no whole layer there)
    host_layers_rule: str | None = None
    #: slots per layer this system keeps regardless of the budget (the resident upper bound), else None
    fixed_slots: Callable[[ModelWork], int] | None = None
    #: extra numerics of the target's decode this system reads from `ctx.trace.extras`
    trace_recorders: tuple[TraceRecorder, ...] = ()
    #: its live run reads the recorded decode of the prompt (an oracle of the future), which the CPU then computes
    live_reads_recording: bool = False
    #: learns from warm-up prompts' decodes before its run (`PromptContext.warmup`): a live run decodes them on its
    #: device first (`specter.runs.live.warm_up_traces`)
    learns_from_history: bool = False
    #: the kernels and host reads its upstream code makes per part (`--pricing upstream`); default: the suite's own
    upstream: Upstream = Upstream()
    options: dict[str, tuple] = {}
    replacement = "lru"  # the expert cache's replacement policy (`specter.eviction.OPTION` sets another)

    def __init_subclass__(cls, **kwargs) -> None:
        """A system's `order` and `colour` are its own: a subclass that sets neither is not drawn as its parent."""
        super().__init_subclass__(**kwargs)
        for attr in ("order", "colour"):
            if attr not in vars(cls):
                setattr(cls, attr, getattr(System, attr))

    def __init__(self, **options) -> None:
        for key, (kind, default, _help, *bounds) in self.options.items():
            value = parse_option(key, kind, options.pop(key), *bounds) if key in options else default
            setattr(self, key.replace("-", "_"), value)
        if options:
            known = ", ".join(self.options) or "none"
            raise SpecterError(f"system {self.name!r} has no option {', '.join(options)}; its options: {known}")

    def cannot_run_live(self) -> str | None:
        """Why the live engine (the model decoding through the runtime) cannot run this system as set, or None."""
        if getattr(self, "draft_kv", "shared") == "copied":
            return "draft-kv=copied is an ablation of the simulator (the live draft reads the target's KV cache)"
        if self.replacement == "belady":
            return "replacement=belady reads the recorded decode ahead, which a live decode does not know"
        return None

    @property
    def twin_from_live(self) -> bool:
        """Whether a live run's simulated twin is priced from the live decode itself (its tokens, routes and windows),
        with no decode of the prompt on the CPU: unless the system reads numerics a live pass does not compute (a
        recorder's values) or the recorded decode itself."""
        return not self.trace_recorders and not self.live_reads_recording

    def settings(self) -> dict:
        return {key: getattr(self, key.replace("-", "_")) for key in self.options}

    @property
    def keeps_draft_kv(self) -> bool:
        """Whether the draft keeps a KV cache of its own beside the target's (device memory for a second KV)."""
        return self.separate_draft

    def after_verify(self, ctx: PromptContext, start: int, tokens: int, tag: str) -> None:
        """A speculative system's step after a verification committed the `tokens` inputs from position `start`
        (their KV is now the target's); nothing by default."""

    def window(self, k: int | None) -> int | None:
        """The draft window this system runs with, given the run's fixed or governed K (None unless speculative)."""
        return k if self.speculative else None

    def make_cache(self, work: ModelWork, slots: int, future=()) -> ExpertCache:
        """The prompt's expert cache, replacing by the system's `replacement` policy; `future`: the prompt's recorded
        routes by position, for a policy that reads ahead (`belady`)."""
        from specter.eviction import make

        return ExpertCache(work.moe_layers, slots, make(self.replacement, future), self.layer_slots(work, slots))

    def layer_slots(self, work: ModelWork, slots: int) -> dict[int, int] | None:
        """Slots of each MoE layer where this system places whole layers within the budget's `slots` per layer
        (their sum at most `slots` x MoE layers), or None: `slots` in every layer."""
        return None

    def make_executor(self, engine: Engine, work: ModelWork, cache: ExpertCache, stats: TransferStats,
                      device=None, cost: CostModel | None = None) -> Executor:
        return Executor(engine, work, cache, stats, device, cost)

    def run(self, ctx: PromptContext) -> PromptResult:
        raise NotImplementedError

    def prefill(self, ctx: PromptContext) -> PromptResult:
        """The prompt in one target pass (experts on demand); the first token commits when its logits are ready."""
        trace, ex = ctx.trace, ctx.executor
        if ex.live:  # the live engine fills the trace as the model decodes (see decode.py)
            end = ex.target_pass(None, context=0, tag="prefill", inputs=trace.prompt)
            trace.prefill_routes, trace.tokens[:] = ex.last_pass.routes, ex.last_pass.argmax[-1:]
        else:
            end = ex.target_pass(trace.prefill_routes, context=0, tag="prefill")
        ctx.engine.synchronize(end)
        return PromptResult(tokens=[trace.tokens[0]], commit_times=[ctx.engine.event_time(end)],
                            stats=ctx.executor.stats, executor=ctx.executor)
