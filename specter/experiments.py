"""The experiment registry: one definition per experiment, read by the workflow, the tables and the figures.

An experiment says where its records come from (`source`), how its tidy table is made (`Table`), how its figure is drawn
(`Figure`) and what the report's caption says (its file, `specter/presets/captions/NAME.rst`). What it runs is
configuration: the workflow's `experiments:` block gives each experiment `{systems, axes, options, arms}` (the systems,
the run settings it varies with their values, system options with theirs, and named sets of settings every point also
runs in), and every setting it does not vary takes the main value. So adding an experiment is one entry here (with a
table and figure kind that exists), its caption file and its config; nothing else changes.

Sources: `sweep` (its own `specter sweep` over its axes, in each of its cases and on the first prompt set, or on
every prompt set and in every case for `main`), `fidelity` (the drafts' fidelity reports), `memo` (the main recordings
of every case on every prompt set: the target's routes), `routing` (each model's `specter routing-stats`), or
another experiment's name (its records, read differently). A case (the config's `cases:`) is a regime: the model whose
numerics drive the runs, the architecture whose shapes price them (`cost_as`), the slots per layer and K. An experiment
that varies what the model computes (`NUMERICS_AXES`) records its own numerics; the others replay the main recording.

Table kinds (`specter/report/tables.py`'s `FROM_RECORDS` and `FROM_FILES`): `stats` (per setting, means over prompts
of times and rates with TPOT's median, p90, p99 and n beside, sums of counts), `routing`, `breakdown`, `memory`,
`calibration`, `sim_vs_measured`; `fidelity`, `claims`, `routing_entropy`, `routing_locality`. Figure kinds
(`specter/report/figures.py`'s `KINDS`).

This module imports nothing heavy (the workflow imports it to plan jobs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specter.registry import Registry
from specter.runspec.parts import GOVERNORS  # K settings that are governors rather than a window size

#: each experiment's caption, one file a name
CAPTIONS = Path(__file__).resolve().parent / "presets" / "captions"

#: where an experiment's records come from, besides another experiment's name (see the module docstring)
SOURCES = ("sweep", "fidelity", "memo", "routing")
#: axes that change the numerics (which windows the draft proposes, which prompts): such an experiment records its own
NUMERICS_AXES = ("k", "prefix_tokens")
#: the columns that say where a time comes from; every table keeps them
SCOPE = ("model", "cost_as", "dataset", "hardware", "pricing", "dispatch_us", "simulated")


@dataclass(frozen=True)
class Table:
    """How an experiment's table is made. `stats`: per setting (SCOPE + `keys`), means over prompts of times and rates
    (TPOT's median, p90, p99, n beside), sums of counts; `derive` adds label columns first (one of `tables.DERIVES`);
    `speedups` adds `speedup_of_specter` in SCOPE + those; `columns` keeps those."""

    kind: str = "stats"
    keys: tuple[str, ...] = ()
    derive: str | None = None
    speedups: tuple[str, ...] | None = None
    columns: tuple[str, ...] | None = None
    speculative: bool = False  # its rows compare draft windows: a record of a system that drafts none is refused
    systems: tuple[str, ...] = ()  # the only systems its rows are made of (none: any): another's record is refused

@dataclass(frozen=True)
class Figure:
    """How an experiment's figure is drawn: a figure kind, its title, and the column on its x axis."""

    kind: str
    title: str
    x: str | None = None
    xlabel: str = ""
    sort: str | None = None  # sort each panel's rows by this column first


@dataclass(frozen=True)
class Experiment:
    name: str
    source: str
    table: Table
    figure: Figure
    #: what the report says under its figure and table; None: its caption file (`specter/presets/captions/NAME.rst`)
    caption: str | None = None
    all_cases: bool = False  # runs in every configured case (else its entry's `cases`, or the first case)
    all_datasets: bool = False  # on every prompt set (else the first)
    reads: tuple[str, ...] = ()  # other experiments whose records its table also reads, where they are configured
    #: its runs decode live (on the config's `hardware.device`) whatever the config's engine, each beside its simulated
    #: twin on this machine's measured profile (`specter profile-bandwidth`), in cases at the model's own shapes
    measured: bool = False

    def __post_init__(self) -> None:
        if self.caption is None:  # one paragraph, wrapped in its file
            text = (CAPTIONS / f"{self.name}.rst").read_text("utf-8")
            object.__setattr__(self, "caption", " ".join(text.split("\n")).strip())


def governed_label(system: str, k_setting: str) -> str:
    """A run's row name in `main`: the system, or `<system> (K <governor>)` for its run at a governor's K."""
    return f"{system} (K {k_setting})" if k_setting in GOVERNORS else system


EXPERIMENTS: Registry[Experiment] = Registry("experiment", {e.name: e for e in [
    Experiment(
        "claims", "main",
        Table(kind="claims"),
        Figure("claims", "The paper's claims, judged"),
        reads=("ablation", "hit_rate", "k_sweep", "fidelity")),
    Experiment(
        "main", "sweep",
        Table(keys=("memory", "system", "k", "slots_per_layer", "experts_per_layer", "resident_share"),
              derive="main_rows",
              speedups=("memory",)),
        Figure("system_bars", "TPOT per system", x="system", xlabel="system"),
        all_cases=True, all_datasets=True),
    Experiment(
        "k_sweep", "sweep",
        Table(keys=("system", "k_setting", "k", "slots_per_layer"), speculative=True),
        Figure("k_sweep", "TPOT and acceptance vs K")),
    Experiment(
        "prefix_sweep", "sweep",
        Table(keys=("prefix_tokens", "system", "k", "slots_per_layer"), speedups=("prefix_tokens",)),
        Figure("grouped_bars", "TPOT vs prompt length", x="prefix_tokens", xlabel="prompt length (tokens)")),
    Experiment(
        "routing", "k_sweep", Table(kind="routing"),
        Figure("routing", "Draft routing as a forecast of the target's experts")),
    Experiment(
        "working_set", "k_sweep",
        Table(keys=("system", "k", "slots_per_layer", "experts_per_layer"), derive="fixed_k", speculative=True,
              columns=(*SCOPE, "system", "k", "slots_per_layer", "experts_per_layer", "window_working_set",
                       "window_recall", "acceptance_rate", "n")),
        Figure("working_set", "Working set of one verification vs K")),
    Experiment(
        "prefetch_policy", "sweep",
        Table(keys=("system", "k", "prefetch", "slots_per_layer"), speculative=True),
        Figure("bars", "Prefetch policies at equal capacity", x="prefetch", xlabel="prefetch policy")),
    Experiment(
        "ablation", "sweep",
        Table(keys=("system", "k", "arm_index", "arm", "prefetch", "draft_kernel", "draft_kv", "serialize_demand",
                    "slots_per_layer"), derive="ablation_arm"),
        Figure("bars", "Ablation", x="arm", xlabel="arm (in the config's order)",
               sort="arm_index")),
    Experiment(
        "oracle", "sweep",
        Table(keys=("system", "forecast", "noise", "k", "slots_per_layer"), derive="oracle_forecast", speculative=True),
        Figure("bars", "Perfect and degraded forecasts", x="forecast", xlabel="prefetch forecast", sort="noise")),
    Experiment(
        "hit_rate", "sweep",
        Table(keys=("policy", "specter_slots", "paper_table3", "system", "k", "slots_per_layer", "experts_per_layer"),
              derive="hit_policy", systems=("on-demand", "specter")),
        Figure("hit_rate", "Expert hit rate per caching policy (the policies of the paper's Table 3)",
               x="specter_slots", xlabel="Specter's expert slots per layer")),
    Experiment(
        "sensitivity", "sweep",
        Table(keys=("temperature", "system", "k", "slots_per_layer"), speedups=("temperature",)),
        Figure("grouped_bars", "TPOT vs sampling temperature", x="temperature",
               xlabel="sampling temperature (0: greedy)"),
        all_datasets=True),
    Experiment(
        "budget", "sweep",
        Table(keys=("resident_share", "slots_per_layer", "system", "k"), speedups=("resident_share",)),
        Figure("lines", "TPOT vs device budget", x="resident_share",
               xlabel="device expert slots (% of each layer's experts)")),
    Experiment(
        "hardware", "sweep",
        Table(keys=("link", "link_gbps", "system", "k", "slots_per_layer"), speedups=()),
        Figure("grouped_bars", "TPOT on each hardware profile", x="hardware",
               xlabel="hardware profile (by link generation)")),
    Experiment(
        "dispatch", "sweep",
        Table(keys=("memory", "system", "k", "slots_per_layer"), derive="memory_label", speedups=("memory",)),
        Figure("lines", "TPOT vs the host's dispatch time", x="dispatch_us",
               xlabel="host time per dispatched kernel (us)")),
    Experiment(
        "breakdown", "main",
        Table(kind="breakdown"),
        Figure("breakdown", "Where a token's time goes (the paper's Fig 4)")),
    Experiment(
        "routing_entropy", "memo",
        Table(kind="routing_entropy"),
        Figure("routing_entropy", "Routing entropy and expert use (the paper's Fig 5)")),
    Experiment(
        "routing_locality", "routing", Table(kind="routing_locality"),
        Figure("routing_locality", "Routing locality: the proxies beside the real models' published statistics")),
    Experiment(
        "memory", "main",
        Table(kind="memory"),
        Figure("memory", "Device memory per system (the paper's Table 2)")),
    Experiment(
        "calibration", "sweep",
        Table(kind="calibration"),
        Figure("calibration", "The suite beside published measurements"),
        reads=("main", "hit_rate", "ablation", "dispatch")),
    Experiment(
        "sim_vs_measured", "sweep",
        Table(kind="sim_vs_measured"),
        Figure("sim_vs_measured", "Measured beside simulated"),
        measured=True),
    Experiment(
        "fidelity", "fidelity",
        Table(kind="fidelity"),
        Figure("fidelity", "Draft fidelity")),
]})


def get(name: str) -> Experiment:
    return EXPERIMENTS[name]


def records_experiment(name: str) -> str:
    """The experiment whose records `name` reads: itself, unless its source names another (not a kind of source)."""
    source = get(name).source
    return source if source in EXPERIMENTS and source not in SOURCES else name


def cases_of(config: dict, name: str) -> list[str]:
    """The cases experiment `name` runs in (those of the experiment whose records it reads), by the workflow's
    `config`: its entry's `cases`, else every case (for one run in all, as `main`) or the first."""
    source = records_experiment(name) if name in EXPERIMENTS else name
    entry = config["experiments"].get(source) or {}
    every = source in EXPERIMENTS and EXPERIMENTS[source].all_cases
    return list(entry.get("cases") or (list(config["cases"]) if every else list(config["cases"])[:1]))


def own_numerics(entry: dict) -> bool:
    """Whether an experiment's config entry varies what the model computes (so it records its own numerics)."""
    return any(axis in NUMERICS_AXES for axis in (entry.get("axes") or {}))


def sweep_flags(entry: dict, main: dict, numerics_only: bool = False, measured: tuple[str, ...] = ()) -> list[str]:
    """The `specter sweep` arguments of an experiment's config entry: its systems, its axes (every setting it does not
    vary at its case's `main` value: `k`, `hardware`, `prefix_tokens`, `slots` per layer, `engine` (and the live
    engine's `device`), `cost_as`), its options and its arms (named settings every point also runs in, in order).
    `governors`: the speculative systems also run at each governor's K, beside the case's (an entry with a `k` axis
    lists its K itself). The pseudo-axis `memory` takes `same_slots` (the case's slots for every system) and
    `same_memory` (Specter's device memory at those slots for every system).

    `numerics_only`: only the axes that change the numerics, simulated, without options (the experiment's own
    recording). `measured`: profiles that join a `hardware` axis (this machine's, where it was measured), which is
    always simulated: it replays the same runs on other profiles."""
    from specter.runspec import AXES, Budget

    def csv(values) -> str:
        return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in values)

    axes = dict(entry.get("axes") or {})
    if numerics_only:
        axes = {a: v for a, v in axes.items() if a in NUMERICS_AXES}
    memory = axes.pop("memory", ["same_slots"])  # the main budget: Specter's slots, or Specter's memory at them
    ks = [main["k"], *(entry.get("governors") or [])]  # the case's K, and each governor's beside it
    values = {"k": ks, "hardware": [main["hardware"]], "prefix_tokens": [main["prefix_tokens"]], **axes}
    if "hardware" in axes:
        values["hardware"] = [*values["hardware"], *measured]
    if not any(name in axes for name in Budget.KINDS.values()):
        for mode in memory:
            values["resident_per_layer" if mode == "same_slots" else "same_memory_as"] = [main["slots"]]
    args = ["--systems", csv(entry["systems"])]
    if main.get("cost_as"):
        args += ["--cost-as", main["cost_as"]]
    for axis, vals in values.items():
        args += [AXES[axis], csv(vals)]
    engine = "sim" if numerics_only or "hardware" in axes else main["engine"]
    args += ["--engine", engine]
    if engine == "live":
        args += ["--device", main.get("device", "cpu")]
    for option, vals in ({} if numerics_only else entry.get("options") or {}).items():
        args += ["--system-option", f"{option}={csv(vals)}"]
    for name, settings in ({} if numerics_only else entry.get("arms") or {}).items():
        items = [f"{key}={csv([value])}" for key, value in (settings or {}).items()]
        args += ["--arm", f"{name}:{','.join(items)}" if items else name]
    return args
