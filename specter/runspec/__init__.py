"""One run's specification: every setting of a run, checked once, serialized into every record, and the source of the
command-line flags of `specter run`, `compare` and `sweep`.

A `RunSpec` is frozen. Its device budget is a `Budget` (expert slots per layer, a share of each layer's experts, or GB
of device memory) that turns itself into slots given the model's work, and its draft window is a `Window` (an integer
K, or a governor: `auto` or `profile`). The spec checks its own data (numbers, names, files);
`specter.runs.checks.resolve` adds what needs the system registry, a profile or the model's config, before any model
is loaded; `RunSpec.as_dict()` is the `config` of every record the run writes. The flags are declared
on the fields (`metadata`); `specter.runspec.flags` builds them for each command and reads specs back from them (in
`sweep`, the fields marked sweepable take comma-separated lists: the grid's axes). `Budget` and `Window` are in
`specter.runspec.parts`, a sweep's named arms (`Arm`) in `specter.runspec.arms`.

This module imports nothing heavy: the workflow reads its axis names to build sweep commands.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from dataclasses import field as setting  # RunSpec has a field named `field`
from typing import Any

from specter.data.prompts import DATASETS
from specter.errors import SpecterError
from specter.runspec.parts import GOVERNORS, PROFILE_KS, Budget, Window

#: the engines a run may name (`specter.timing.ENGINES` makes each; a test holds the two to one list)
ENGINES = ("sim", "live")
#: engine names this suite does not have, with what to give instead
NOT_ENGINES = {"cuda": "a GPU measures with --engine live --device cuda"}
#: where `--engine live` runs the model, its slots and its copies: the CPU as device (plain tensors as slots), or CUDA
#: (refused where torch sees no GPU; `specter.runs.checks`)
LIVE_DEVICES = ("cpu", "cuda")
PREFETCH_POLICIES = ("adaptive", "none", "early", "late")
DRAFT_KERNELS = ("fused", "unfused")
#: the expert cache at each prompt's start: `restored`, the artifact's (benchmarks/cache_reset.py: the resident set
#: its loader placed, the last `slots` experts of each layer by id, least recently used first, restored before every
#: input outside the timed region), or `empty`
CACHE_STARTS = ("restored", "empty")
#: the live draft's INT4 kernel: PyTorch's fused kernel for the device (the CPU's, as GPTQModel's TorchFusedLinear runs
#: it, or a GPU's tinygemm), or the codes dequantized on every call (`specter.quant.kernels`)
LIVE_DRAFT_KERNELS = ("fused", "packed")
#: where a live run keeps the target's routed experts on the host: in memory, on disk (memory-mapped rows in the
#: suite's cache, paged in as copies read them), or auto (disk where the checkpoint exceeds the memory available)
HOST_STORES = ("auto", "memory", "disk")
DTYPES = ("float32", "bfloat16", "float16")  # of the numerics: the target's and the draft's forwards
PRICINGS = ("fused", "counted", "upstream")  # the kernels each op is priced at (`--pricing`)
MODES = ("run", "compare", "sweep")
#: what a record's `config` adds to the spec: what the run resolved from it (`specter.records.run_fields`)
RESOLVED_KEYS = frozenset({"system_settings", "slots_per_layer", "memory", "hardware_profile", "hardware_sha256",
                           "initial_cache", "device", "numerics", "cost", "k_source", "expert_storage"})
#: the RunSpec fields a sweep may vary, in the order its grid nests them (the last varies fastest)
SWEEP_AXES = ("system", "k", "prefetch", "draft_kernel", "temperature", "hardware", "dispatch_us", "pricing",
              "expert_bits", "prefix_tokens", "budget")
#: the target's routed experts as stored: FP16 (16, the paper's targets) or HQQ at 2, 3 or 4 bits (Mixtral-Offloading's)
EXPERT_BITS = (16, 2, 3, 4, "q4_k_m")  # FP16, HQQ at 2, 3 or 4 bits, GGUF Q4_K_M (`specter.timing.cost`)


def expert_bits_value(text: str) -> int | str:
    """`--expert-bits`'s value: a whole number of bits, or a GGUF type's name (`q4_k_m`)."""
    text = str(text).strip()
    return int(text) if text.isascii() and text.isdigit() else text.lower()



# Arms ---------------------------------------------------------------------------------------------------------------
#: the RunSpec fields a sweep arm may set (besides system options and a budget): none changes what the model computes
ARM_SETTINGS = ("prefetch", "draft_kernel", "hardware", "expert_bits")


# Draft windows ------------------------------------------------------------------------------------------------------


# Flags ---------------------------------------------------------------------------------------------------------------
def _dispatch_us(text: str) -> float | None:
    """`--dispatch-us`: microseconds, or `profile` (the hardware profile's own figure)."""
    return None if text.strip().lower() in ("profile", "none", "null") else float(text)


_dispatch_us.__name__ = "number of microseconds from 0 to 1e6, or profile"  # what a refusal names


def _flag(flag: str, help: str, parse: Callable[[str], Any] = str, required: bool = False, sweep: bool = False,
          choices: tuple | None = None, metavar: str | None = None, instead: dict[str, str] | None = None) -> dict:
    """Field metadata: how the field appears on the command line (`instead`: values a user may try that are not
    among its choices, each with what to give instead)."""
    return {"flag": flag, "help": help, "parse": parse, "required": required, "sweep": sweep, "choices": choices,
            "metavar": metavar, "instead": instead or {}}


#: the whole-number run settings' bounds, (lowest, highest): the flags' and the workflow config's
LIMITS = {"num_prompts": (1, 100_000), "prefix_tokens": (1, 1 << 20), "max_new_tokens": (2, 1 << 20),
          "seed": (0, 2**63 - 1), "warmup_prompts": (0, 1000), "repeats": (1, 100)}
#: the smallest temperature that samples (logits divided by less overflow a double)
MIN_TEMPERATURE = 1e-6
#: the largest fixed K (proposals a window)
MAX_WINDOW = 1024


def check_positions(model_config: dict, parts: dict[str, int]) -> None:
    """The longest sequence a command makes, the sum of `parts` (each named as the user gave it: a flag, or a phrase
    such as "a window of"), fits the model's positions (`max_position_embeddings`, where its config gives one)."""
    limit = model_config.get("max_position_embeddings")
    need = sum(parts.values())
    if isinstance(limit, int) and not isinstance(limit, bool) and need > limit:
        said = " + ".join(f"{name} {value}" for name, value in parts.items()) + \
            (f" is {need} positions, more than" if len(parts) > 1 else " positions are more than")
        raise SpecterError(f"{said} the model's {limit} (max_position_embeddings); ask for fewer tokens")


@dataclass(frozen=True)
class RunSpec:
    """Every setting of one run. `budget` and `k` are typed; everything else is a plain value."""

    system: str
    model: str = setting(metadata=_flag("--model", "the target checkpoint", required=True, metavar="DIR"))
    dataset: str = setting(metadata=_flag(
        "--dataset", f"a shipped prompt set ({', '.join(DATASETS)}) or a JSONL/JSON/CSV/Parquet file", required=True,
        metavar="NAME|FILE"))
    hardware: str = setting(metadata=_flag("--hardware", "a preset name or a profile YAML (see `specter hardware`)",
                                         required=True, sweep=True, metavar="PRESET|FILE"))
    budget: Budget  # its three mutually exclusive flags are built by `add_cli_args`
    out: str = ""
    draft: str | None = setting(default=None, metadata=_flag(
        "--draft", "the draft (speculative systems), from `specter quantize`", metavar="DIR"))
    field: str | None = setting(default=None, metadata=_flag(
        "--field", "the text column of a dataset file (default: the paper sets' conventions)", metavar="NAME"))
    num_prompts: int = setting(default=5, metadata=_flag("--num-prompts", "first N non-empty inputs", int, metavar="N"))
    prefix_tokens: int = setting(default=16, metadata=_flag("--prefix-tokens", "prompt length in tokens", int,
                                                          sweep=True, metavar="N"))
    max_new_tokens: int = setting(default=128, metadata=_flag("--max-new-tokens", "tokens to generate", int,
                                                              metavar="N"))
    k: Window = setting(default=Window(), metadata=_flag(
        "--k", "draft window K (speculative systems): an integer >= 1, or a governor: auto (the amortization "
               "model), profile (empirical, over 2..32) or online (re-chosen every cycle from the acceptance so far)",
        Window.parse, sweep=True, metavar="K"))
    prefetch: str = setting(default="adaptive", metadata=_flag(
        "--prefetch", "the speculative systems' prefetch policy", sweep=True, choices=PREFETCH_POLICIES))
    draft_kernel: str = setting(default="fused", metadata=_flag(
        "--draft-kernel", "how the draft's routed experts are priced: fused (one INT4 MoE kernel per layer and "
                          "step, as the paper's) or unfused (one kernel group per expert)", sweep=True,
        choices=DRAFT_KERNELS))
    expert_bits: int | str = setting(default=16, metadata=_flag(
        "--expert-bits", "the target's routed experts as stored, copied and read: 16 (FP16), HQQ at 2, 3 or 4 bits "
                         "as Mixtral-Offloading stores them (codes, 8-bit scales and zeros), or q4_k_m (GGUF Q4_K_M, "
                         "as llama.cpp and KTransformers store them); priced only: the numerics stay the model's own",
        expert_bits_value, sweep=True, metavar="BITS"))
    cache_start: str = setting(default="restored", metadata=_flag(
        "--cache-start", "the expert cache at each prompt's start, set outside the timed region: restored (the "
                         "artifact's resident set, the last slots-per-layer experts of each layer by id, least "
                         "recently used first, as its loader places them and its cache reset restores them before "
                         "every input) or empty", choices=CACHE_STARTS))
    temperature: float = setting(default=0.0, metadata=_flag(
        "--temperature", "0 = greedy; above 0, sampling at this temperature with rejection sampling (drawn live, "
                         "not replayed from a memo)", float, sweep=True, metavar="T"))
    seed: int = setting(default=42, metadata=_flag("--seed", "seed (the artifact's is 42)", int, metavar="S"))
    repeats: int = setting(default=3, metadata=_flag(
        "--repeats", "timed runs of each prompt (the artifact's protocol and the workflow's: 3): with --engine live "
                     "each repeat is timed from the same cache state and recorded (extra.repeat); under --engine sim "
                     "every repeat would be identical, so each prompt runs once and its record says so "
                     "(extra.repeats)", int,
        metavar="R"))
    engine: str = setting(default="sim", metadata=_flag(
        "--engine", "sim: simulated time from the --hardware profile; live: the model itself decodes through the "
                    "offload runtime on --device (its router's choices drive real copies into real slots), measured, "
                    "each record beside its simulated twin on --hardware",
        choices=ENGINES, instead=NOT_ENGINES))
    live_device: str = setting(default="cpu", metadata=_flag(
        "--device", "the live engine's device: cpu (the CPU as device, plain tensors as slots; its times are the "
                    "CPU's, never a calibration of a GPU) or cuda (the model's non-expert weights, the slots and the "
                    "draft on the GPU, the host store page-locked, copies on a copy stream, timed with CUDA events)",
        choices=LIVE_DEVICES))
    live_draft_kernel: str = setting(default="fused", metadata=_flag(
        "--live-draft-kernel", "the kernel a live run's draft computes its experts with: fused (PyTorch's INT4 kernel "
                               "for the device, bfloat16 activations: on the CPU as GPTQModel's TorchFusedLinear runs "
                               "it, other linears than 4-bit in groups of 32 to 256 falling back to packed; on a GPU "
                               "its tinygemm kernel, such a draft refused) or packed (the codes dequantized on every "
                               "call to the simulator's draft "
                               "weights, bit for bit, so the live draft proposes what the twin's does); records say "
                               "which ran", choices=LIVE_DRAFT_KERNELS))
    host_store: str = setting(default="auto", metadata=_flag(
        "--host-store", "where a live run keeps the target's routed experts on the host: memory; disk (the disk tier: "
                        "each MoE layer's expert rows a memory-mapped file in the suite's cache, built from the "
                        "checkpoint on first use, paged in as copies read them); auto (disk where the checkpoint "
                        "exceeds the memory available: MemAvailable, or the cgroup's limit where lower; else "
                        "memory); records say which",
        choices=HOST_STORES))
    dtype: str | None = setting(default=None, metadata=_flag(
        "--dtype", "precision of the numerics (the target's and the draft's forwards; the model is loaded at it); "
                   "default: the checkpoint's own (config.json's dtype) for --engine live, float32 for a simulation; "
                   "float32 is what every committed result used; bfloat16 or float16 halve the memory of a large "
                   "checkpoint, and a verification that flips a near-tie is then recorded in extra.near_ties and the "
                   "run goes on (at float32 it stops the run; a memo of another precision is refused)", choices=DTYPES))
    cost_as: str | None = setting(default=None, metadata=_flag(
        "--cost-as", "price every op at this architecture's published shapes (`specter architectures`, or a "
                     "config.json); tokens and routes stay the model's, which must route the same way (experts per "
                     "layer, top-k)", metavar="NAME|FILE"))
    pricing: str | None = setting(default=None, metadata=_flag(
        "--pricing", "the kernels each op is priced at: fused (a modelled runtime of fused kernels: 8 an attention "
                     "block, 3 a routed expert, 2 for the head; a mechanism alone), counted (the kernels the model's "
                     "own transformers modules dispatch per part of a decode step, counted on the model itself, or "
                     "with --cost-as on a tiny instance of the priced architecture's class at 2 bytes a weight; the "
                     "draft's experts as the live engine runs them) or upstream (each system's kernels and host reads "
                     "as its public code makes them, declared in its file with the upstream files and lines; the "
                     "counted figure for the parts that run the stock modules; for --engine sim); default: fused "
                     "for --engine sim, counted for a live run's twin; records say which (config.priced_ops)",
        sweep=True, choices=PRICINGS))
    dispatch_us: float | None = setting(default=None, metadata=_flag(
        "--dispatch-us", "the host's time per dispatched kernel in us, in place of the hardware profile's "
                         "host.dispatch_us (profile: the profile's own); records carry the profile as run",
        _dispatch_us, sweep=True, metavar="US|profile"))
    system_options: tuple[tuple[str, str], ...] = ()
    arm: str = ""  # the sweep arm this run belongs to (`specter sweep --arm`), or empty
    warmup_prompts: int = setting(default=8, metadata=_flag(
        "--warmup-prompts", "calibration-split prompts for systems that learn from history (MoE-Infinity, Fiddler)",
        int, metavar="N"))
    memo: tuple[str, ...] = ()  # recorded numerics to start from (`specter sweep --memo-out`)

    def __post_init__(self) -> None:
        if not isinstance(self.k, Window):
            object.__setattr__(self, "k", Window.parse(self.k))

    @property
    def resolved_pricing(self) -> str:
        """`pricing`, or where none was given, the engine's: counted for a live run's twin, fused for a simulation."""
        return self.pricing or ("counted" if self.engine == "live" else "fused")

    # the record's form -----------------------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        """The flat, JSON-ready form every record carries as its `config` (budget as its three flags' values)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "budget":
                out.update(value.as_fields())
            elif f.name == "k":
                out["k"] = value.value
            elif isinstance(value, tuple):
                out[f.name] = [list(v) if isinstance(v, tuple) else v for v in value]
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict) -> RunSpec:
        """The spec of `as_dict`'s form (also a record's `config`, whose resolved keys are ignored): the budget as its
        three flags' values, K raw, lists for tuples."""
        known = {f.name for f in fields(cls)} - {"budget"}
        unknown = set(data) - known - set(Budget.KINDS.values()) - RESOLVED_KEYS
        if unknown:
            raise SpecterError(f"unknown run settings {sorted(unknown)}; settings: {sorted(known)}")
        values = {k: v for k, v in data.items() if k in known}
        for name in ("system_options", "memo"):
            if name in values:
                values[name] = tuple(tuple(v) if isinstance(v, list) else v for v in values[name])
        return cls(budget=Budget.of(**{name: data.get(name) for name in Budget.KINDS.values()}), **values)

    def check_numbers(self) -> None:
        """Every number finite and in range, before anything is loaded."""
        ints = {f"--{name.replace('_', '-')}": (getattr(self, name), low, high) for name, (low, high) in LIMITS.items()}
        for flag, (value, low, high) in ints.items():
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                hint = " (TPOT needs two tokens)" if flag == "--max-new-tokens" else ""
                raise SpecterError(f"{flag} must be a whole number from {low} to {high}{hint}, got {value!r}")
        t = self.temperature
        if (isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t)
                or not (t == 0 or MIN_TEMPERATURE <= t <= 100)):
            raise SpecterError(f"--temperature must be 0 (greedy) or a number from {MIN_TEMPERATURE:g} to 100 (below "
                               f"it, logits over the temperature overflow; sampling there is greedy anyway), got {t!r}")
        if isinstance(self.expert_bits, bool) or self.expert_bits not in EXPERT_BITS:
            raise SpecterError(f"--expert-bits must be one of {', '.join(map(str, EXPERT_BITS))} (16: FP16 experts; "
                               f"q4_k_m: GGUF Q4_K_M), got {self.expert_bits!r}")
        d = self.dispatch_us
        if d is not None and (isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d)
                              or not 0 <= d <= 1e6):
            raise SpecterError(f"--dispatch-us must be a finite number of microseconds from 0 to 1e6 (or profile), "
                               f"got {d!r}")
        if self.k.fixed is not None and self.k.fixed > MAX_WINDOW:
            raise SpecterError(f"--k {self.k.fixed} is more than {MAX_WINDOW} proposals a window; give a smaller K")

    def describe(self) -> str:
        """One line for progress output."""
        k = f" K={self.k}" if self.k.value is not None else ""
        opts = "".join(f" {a}={b}" for a, b in self.system_options)
        policy = self.prefetch if self.k.value is not None else ""
        shapes = f" at {self.cost_as} shapes" if self.cost_as else ""
        temperature = f" T={self.temperature:g}" if self.temperature else ""
        arm = f" [{self.arm}]" if self.arm else ""
        priced = f" priced {self.pricing}" if self.pricing else ""
        dispatch = f" dispatch {self.dispatch_us:g} us" if self.dispatch_us is not None else ""
        return (f"{self.system}{k} {policy} {self.hardware}{shapes} {self.budget.describe()} prefix "
                f"{self.prefix_tokens}{temperature}{opts}{priced}{dispatch}{arm}")

    # the checks of data alone (`specter.runs.checks.resolve` runs them beside those that need a system, a hardware
    # profile or the model's config) ----------------------------------------------------------------------------------
    def check_names(self) -> None:
        """The engine, prefetch policy, live device, live draft kernel, host store and cache start are names this suite
        has."""
        if self.engine not in ENGINES:
            hint = f"; {NOT_ENGINES[self.engine]}" if self.engine in NOT_ENGINES else ""
            raise SpecterError(f"--engine {self.engine} is not an engine; engines: {', '.join(ENGINES)}{hint}")
        if self.prefetch not in PREFETCH_POLICIES:
            raise SpecterError(f"--prefetch {self.prefetch!r} is not a policy; policies: "
                               f"{', '.join(PREFETCH_POLICIES)}")
        for flag, value, choices, what in (
                ("--device", self.live_device, LIVE_DEVICES, "a device of the live engine"),
                ("--live-draft-kernel", self.live_draft_kernel, LIVE_DRAFT_KERNELS, "a kernel"),
                ("--host-store", self.host_store, HOST_STORES, "a host store"),
                ("--cache-start", self.cache_start, CACHE_STARTS, "a cache start"),
                ("--pricing", self.resolved_pricing, PRICINGS, "a pricing")):
            if value not in choices:
                raise SpecterError(f"{flag} {value!r} is not {what}; give one of {', '.join(choices)}")
        for flag, value in (("--model", self.model), ("--dataset", self.dataset), ("--cost-as", self.cost_as)):
            if isinstance(value, str) and not (value.isprintable() and "|" not in value):
                raise SpecterError(f"{flag} {value!r:.80}: tables and reports print it, and a | or a control "
                                   "character would break them; give a path without one (rename or link it)")
        if self.engine != "live":  # the live engine's settings, where another engine would ignore them
            for flag, value, default, what in (
                    ("--device", self.live_device, "cpu", "names the live engine's device"),
                    ("--live-draft-kernel", self.live_draft_kernel, "fused", "picks the live draft's kernel"),
                    ("--host-store", self.host_store, "auto", "keeps a live run's experts")):
                if value != default and not (flag == "--host-store" and value == "memory"):
                    raise SpecterError(f"{flag} {value} {what}; add --engine live, or drop {flag} (--engine "
                                       f"{self.engine} does not read it)")

    def check_files(self) -> None:
        """The budget, and the files the run reads (memos) and writes (`out`)."""
        from pathlib import Path

        self.budget.check()
        if self.budget.kind == "same_memory" and self.draft is None:
            raise SpecterError(f"--same-memory-as {int(self.budget.value)} charges Specter's draft: pass --draft DIR "
                               "(the draft whose memory sets the budget)")
        for memo in self.memo:
            if not Path(memo).is_file():
                said = "is not a regular file" if Path(memo).exists() else "does not exist"
                raise SpecterError(f"--memo {memo!r} {said}; record it with `specter sweep --memo-out`")
        if self.out and Path(self.out).is_dir():
            raise SpecterError(f"--out {self.out} is a directory; give a file name ending in .jsonl")


# The command line ----------------------------------------------------------------------------------------------------
def _flag_fields():
    return [f for f in fields(RunSpec) if "flag" in f.metadata]


#: Sweep axes by name (the workflow's `axes:` keys) and the flag that takes each axis's values.
AXES: dict[str, str] = {"system": "--systems", **{f.name: f.metadata["flag"] for f in _flag_fields()
                                                   if f.metadata["sweep"]},
                        **{name: Budget.FLAGS[kind] for kind, name in Budget.KINDS.items()}}


__all__ = ["ARM_SETTINGS", "AXES", "GOVERNORS", "LIMITS", "MAX_WINDOW", "PROFILE_KS", "Arm", "Budget", "RunSpec",
           "Window", "check_positions"]


from specter.runspec.arms import Arm  # noqa: E402  (an arm's settings are RunSpec fields: defined after it)
