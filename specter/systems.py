"""The System protocol, what one prompt's run produces, and the registry of system names.

A system turns one prompt's numerics (from the forward service) into a schedule on the engine: which copies, which
compute, in what order, waiting on what. Every system is lossless: at greedy decoding it commits the target's tokens.
Systems never branch on the engine's kind. The registry finds reference systems here, Specter in `specter.specter`, and
baselines in `baselines/` by module name.
"""

from __future__ import annotations

import importlib
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from specter.errors import SpecterError
from specter.offload.cache import ExpertCache
from specter.offload.executor import Executor, TransferStats
from specter.offload.work import ModelWork
from specter.spec.forward import ForwardService, PromptTrace
from specter.timing.cost import CostModel
from specter.timing.engine import Engine


@dataclass(frozen=True)
class DecodeConfig:
    max_new_tokens: int
    slots_per_layer: int
    k: int | None = None  # draft window (speculative systems); None: not speculative or chosen by the governor
    prefetch: str = "adaptive"
    draft_expert_bytes: int = 0  # one quantized draft expert as stored (speculative systems)
    temperature: float = 0.0  # 0: greedy (memoized numerics); > 0: live sampling with `seed`
    seed: int = 42


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
    first_decode_pass: int = 1  # index in executor.passes of the first pass after the first commit
    decode_routes: list | None = None  # routes of the committed decode inputs, where they differ from the trace's


@dataclass
class PromptContext:
    engine: Engine
    work: ModelWork
    cache: ExpertCache
    executor: Executor
    service: ForwardService
    trace: PromptTrace
    config: DecodeConfig
    cost: CostModel  # the hardware profile's cost model, for systems that plan from a latency model
    warmup: Callable[[], list[PromptTrace]] | None = None  # traces of warm-up prompts (calibration split), lazily

    @classmethod
    def fresh(cls, engine: Engine, work: ModelWork, service: ForwardService, trace: PromptTrace,
              config: DecodeConfig, cost: CostModel,
              warmup: Callable[[], list[PromptTrace]] | None = None, device=None) -> "PromptContext":
        """A context with an empty cache: every prompt starts from the same state (the artifact restores it).
        `device`: the `DeviceRuntime` whose buffers and kernels back the ops (CUDA engine runs), or None."""
        cache = ExpertCache(work.moe_layers, config.slots_per_layer)
        stats = TransferStats()
        executor = Executor(engine, work, cache, stats, device)
        return cls(engine, work, cache, executor, service, trace, config, cost, warmup)


def _parse(key: str, kind: type, value):
    """A system option's value from its command-line text (`bool` takes true/false, yes/no, 1/0)."""
    if kind is bool and isinstance(value, str):
        words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if value.lower() not in words:
            raise ValueError(f"option {key}={value!r} is not a boolean; give true or false")
        return words[value.lower()]
    return kind(value)


class System:
    """Base of every system: `run` schedules one prompt and returns its commits.

    `options`: {name: (type, default, help)} a system accepts through `--system-option NAME=VALUE`."""

    name: str = ""
    speculative: bool = False
    #: the draft keeps its own weights and KV (memory for them, and its own prefill), instead of sharing the target's
    separate_draft: bool = False
    #: computes missing experts on the host: the lower bound's link term accounts for that alternative
    host_compute: bool = False
    #: slots per layer this system keeps regardless of the budget (the resident upper bound), else None
    fixed_slots: Callable[[ModelWork], int] | None = None
    options: dict[str, tuple[type, object, str]] = {}

    def __init__(self, **options) -> None:
        for key, (kind, default, _help) in self.options.items():
            setattr(self, key.replace("-", "_"), _parse(key, kind, options.pop(key)) if key in options else default)
        if options:
            known = ", ".join(self.options) or "none"
            raise SpecterError(f"system {self.name!r} has no option {', '.join(options)}; its options: {known}")

    def settings(self) -> dict:
        return {key: getattr(self, key.replace("-", "_")) for key in self.options}

    def run(self, ctx: PromptContext) -> PromptResult:
        raise NotImplementedError

    def prefill(self, ctx: PromptContext) -> PromptResult:
        """The prompt in one target pass (experts on demand); the first token commits when its logits are ready."""
        trace = ctx.trace
        end = ctx.executor.target_pass(trace.prefill_routes, context=0, tag="prefill")
        ctx.engine.synchronize(end)
        return PromptResult(tokens=[trace.tokens[0]], commit_times=[ctx.engine.event_time(end)], stats=ctx.executor.stats,
                            executor=ctx.executor)


REFERENCE_SYSTEMS = {"resident": "specter.reference", "on-demand": "specter.reference", "specter": "specter.specter"}
BASELINE_PACKAGE = "baselines"


def registry() -> dict[str, type[System]]:
    """{name: System class} of every system the suite knows."""
    import pkgutil

    found: dict[str, type[System]] = {}
    modules = set(REFERENCE_SYSTEMS.values())
    base = importlib.import_module(BASELINE_PACKAGE)
    modules |= {f"{BASELINE_PACKAGE}.{m.name}" for m in pkgutil.iter_modules(base.__path__)}
    for module_name in sorted(modules):
        module = importlib.import_module(module_name)
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, System) and obj is not System and obj.name:
                found[obj.name] = obj
    return found


def get_system(name: str, options: dict[str, str] | None = None) -> System:
    systems = registry()
    if name not in systems:
        raise SpecterError(f"unknown system {name!r}; known systems: {', '.join(sorted(systems))}")
    try:
        return systems[name](**(options or {}))
    except ValueError as err:
        raise SpecterError(f"bad --system-option for {name!r}: {err}") from None
