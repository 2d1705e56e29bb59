"""The experiment registry: one definition per experiment, read by the workflow, the tables and the figures.

An experiment says where its records come from (`source`), how its tidy table is made (`Table`), how its figure is
drawn (`Figure`) and what the report's caption says. What it runs is configuration: the workflow's `experiments:`
block gives each experiment `{systems, axes, options, arms}` (the systems, the run settings it varies with their
values, system options with theirs, and named sets of settings every point also runs in), and every setting it does
not vary takes the main value. So adding an experiment is one entry here (with a table and figure kind that exists)
plus its config; nothing else changes.

Sources: `sweep` (its own `specter sweep` over its axes, in each of its cases and on the first prompt set, or on
every prompt set and in every case for `main`), `fidelity` (the drafts' fidelity reports), `memo` (the main recordings
of every case on every prompt set: the target's routes), `routing` (each model's `specter routing-stats`), or
another experiment's name (its records, read differently). A case (the config's `cases:`) is a regime: the model whose
numerics drive the runs, the architecture whose shapes price them (`cost_as`), the slots per layer and K. An experiment
that varies what the model computes (`NUMERICS_AXES`) records its own numerics; the others replay the main recording.

Table kinds (`specter/report/tables.py`): `stats` (per setting, means over prompts of times and rates with TPOT's
median, p90, p99 and n beside, sums of counts), `routing`, `breakdown`, `memory`, `routing_entropy`, `calibration`,
`claims`, `sim_vs_measured`, `fidelity`. Figure kinds (`specter/report/figures.py`): `system_bars`, `bars`,
`grouped_bars`, `lines`, `k_sweep`, `routing`, `working_set`, `fidelity`, `hit_rate`, `breakdown`, `memory`,
`routing_entropy`, `claims`, `calibration`, `sim_vs_measured`.

This module imports nothing heavy (the workflow imports it to plan jobs).
"""

from __future__ import annotations

from dataclasses import dataclass

from specter.registry import Registry
from specter.runspec.parts import GOVERNORS  # K settings that are governors rather than a window size

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
    caption: str
    all_cases: bool = False  # runs in every configured case (else its entry's `cases`, or the first case)
    all_datasets: bool = False  # on every prompt set (else the first)
    reads: tuple[str, ...] = ()  # other experiments whose records its table also reads, where they are configured
    #: its runs decode live (on the config's `hardware.device`) whatever the config's engine, each beside its simulated
    #: twin on this machine's measured profile (`specter profile-bandwidth`), in cases at the model's own shapes
    measured: bool = False


def governed_label(system: str, k_setting: str) -> str:
    """A run's row name in `main`: the system, or `<system> (K <governor>)` for its run at a governor's K."""
    return f"{system} (K {k_setting})" if k_setting in GOVERNORS else system


_BOUND = "black ticks: the lower bound."

EXPERIMENTS: Registry[Experiment] = Registry("experiment", {e.name: e for e in [
    Experiment(
        "claims", "main",
        Table(kind="claims"),
        Figure("claims", "The paper's claims, judged"),
        "Every quantitative claim of the paper the suite can test (``specter/presets/claims/specter.yaml``: each with "
        "its source, version, section and figure or table, and whether it was read in the paper's own text), beside "
        "the suite's figure from this run's records and the drafts' fidelity reports: the point, and a 95% bootstrap "
        "interval over prompts (a prompt drawn with every system's record of it). The verdict follows one stated "
        "rule: a claim of a figure is reproduced where the whole interval lies within 0.8-1.25x of the paper's, not "
        "reproduced where none of it does, inconclusive where it straddles an edge; a claim of at least a figure "
        "is reproduced where the whole interval clears it. A claim whose configuration did not run says so, and one "
        "computed in another configuration than the paper's says which. The headline (1.50x mean, up to 1.88x) is "
        "also given over every baseline, without a verdict, so that the reader sees where it would hold. Times are "
        "simulated at the paper's published shapes with a proxy's routing, priced upstream where the runs were (each "
        "claim's configuration names its pricing).",
        reads=("ablation", "hit_rate", "k_sweep", "fidelity")),
    Experiment(
        "main", "sweep",
        Table(keys=("memory", "system", "k", "slots_per_layer", "experts_per_layer", "resident_share"),
              derive="main_rows",
              speedups=("memory",)),
        Figure("system_bars", "TPOT per system", x="system", xlabel="system"),
        "Time per output token (TPOT, mean over prompts) of every configured system in each case (the model whose "
        "routing drives the runs, the architecture whose shapes price them, Specter's expert slots per layer and K) "
        "and on each prompt set, at the main hardware profile. Two comparisons, as the paper makes them: every "
        "system with the same expert slots per layer (same cache), and every system with the device memory Specter "
        "needs at those slots, its INT4 draft charged (same memory: a system without a draft gets more slots). The "
        "black tick on each bar is that run's lower bound (its own passes at roofline, or Belady's fewest expert "
        "loads over the link per pass, whichever is larger). ``results/tables/main.csv`` adds each system's TPOT "
        "over Specter's in the same comparison (``speedup_of_specter``: above 1, Specter is faster). Where the "
        "entry lists ``governors``, each speculative system also runs at the K its governor chooses (``auto``: the "
        "paper's amortization model), as a row of its own (``specter (K auto)``, its K beside it); the ratios "
        "compare with Specter at the case's fixed K. Where the runs are priced more than one way, the figure draws "
        "the pricing a published figure is compared at (``upstream``: each system at the kernels and host reads its "
        "own code makes) and the table has every pricing.",
        all_cases=True, all_datasets=True),
    Experiment(
        "k_sweep", "sweep",
        Table(keys=("system", "k_setting", "k", "slots_per_layer"), speculative=True),
        Figure("k_sweep", "TPOT and acceptance vs K"),
        "Specter's TPOT (mean over prompts) and greedy acceptance rate against the draft window K, on the first "
        "prompt set at the main hardware profile and budget; the dashed line is the lower bound. Each governor's "
        "choice is a marker of its own (``auto``: the amortization model; ``profile``: the empirical profiler; the "
        "legend names K), run like any other K."),
    Experiment(
        "prefix_sweep", "sweep",
        Table(keys=("prefix_tokens", "system", "k", "slots_per_layer"), speedups=("prefix_tokens",)),
        Figure("grouped_bars", "TPOT vs prompt length", x="prefix_tokens", xlabel="prompt length (tokens)"),
        "TPOT (mean over prompts) at each prompt length (prompts truncated to the first N tokens), per system, at "
        "the main settings. Longer prompts fill more KV and warm the expert cache differently during prefill."),
    Experiment(
        "routing", "k_sweep", Table(kind="routing"),
        Figure("routing", "Draft routing as a forecast of the target's experts"),
        "How well the draft's routing forecasts the target's: for each lookahead distance d (draft step d against "
        "the target's verification input d - 1, which read the same token), the precision and recall of the draft's "
        "expert set against the target's, averaged over MoE layers and prompts, for each K of the k_sweep. The panel "
        "title gives the window recall (planned experts the verification used over experts it used)."),
    Experiment(
        "working_set", "k_sweep",
        Table(keys=("system", "k", "slots_per_layer", "experts_per_layer"), derive="fixed_k", speculative=True,
              columns=(*SCOPE, "system", "k", "slots_per_layer", "experts_per_layer", "window_working_set",
                       "window_recall", "acceptance_rate", "n")),
        Figure("working_set", "Working set of one verification vs K"),
        "Distinct experts one verification of K + 1 tokens uses per MoE layer (mean over windows and layers), "
        "against K, with the experts per layer and the device slots per layer at the main budget. Where the working "
        "set exceeds the slots, no prefetch plan can hold it all."),
    Experiment(
        "prefetch_policy", "sweep",
        Table(keys=("system", "k", "prefetch", "slots_per_layer"), speculative=True),
        Figure("bars", "Prefetch policies at equal capacity", x="prefetch", xlabel="prefetch policy"),
        "Specter's TPOT (mean over prompts) under each prefetch policy at equal device capacity: ``adaptive`` "
        "(cold start, chunks sized from measured bandwidth and draft-step time, final cleanup), ``none``, ``early`` "
        "(one plan after the first draft step), ``late`` (one plan over the whole window before verification). "
        "Only ``adaptive`` issues just the copies that land while the draft drafts: ``early`` and ``late`` copies may "
        "still be on the link when the verification starts, its demand copies queue behind them on the one copy "
        "stream, and so either can be slower than ``none``. Black ticks: the lower bound."),
    Experiment(
        "ablation", "sweep",
        Table(keys=("system", "k", "arm_index", "arm", "prefetch", "draft_kernel", "draft_kv", "serialize_demand",
                    "slots_per_layer"), derive="ablation_arm"),
        Figure("bars", "Ablation", x="arm", xlabel="arm (in the config's order)",
               sort="arm_index"),
        "Specter with its parts removed, in the config's order (the artifact's cumulative arms): ``full``; ``no "
        "fused kernel`` (the draft's experts priced one kernel group each instead of one fused INT4 MoE kernel per "
        "layer); ``no prefetch`` (the draft still speculates, nothing is copied ahead); ``+ copied KV`` (also, the "
        "draft keeps a KV cache of its own, the target's KV copied into it after every verification: a second KV on "
        "the device and a copy per cycle); ``+ serialized demand`` (also, each demand copy waits for the compute "
        "issued before it, so hot-first overlap is gone). The table lists each arm's settings. TPOT is the mean over "
        f"prompts; {_BOUND}"),
    Experiment(
        "oracle", "sweep",
        Table(keys=("system", "forecast", "noise", "k", "slots_per_layer"), derive="oracle_forecast", speculative=True),
        Figure("bars", "Perfect and degraded forecasts", x="forecast", xlabel="prefetch forecast", sort="noise"),
        "Specter's prefetch planned from the draft's routing (``draft``) against plans from the target's own "
        "recorded routes with 0, 25, 50 or 75% of the expert identities replaced at random (``specter-oracle``): "
        f"how much a better forecast could still buy. TPOT is the mean over prompts; {_BOUND}"),
    Experiment(
        "hit_rate", "sweep",
        Table(keys=("policy", "specter_slots", "paper_table3", "system", "k", "slots_per_layer", "experts_per_layer"),
              derive="hit_policy", systems=("on-demand", "specter")),
        Figure("hit_rate", "Expert hit rate per caching policy (the policies of the paper's Table 3)",
               x="specter_slots", xlabel="Specter's expert slots per layer"),
        "The share of the experts a target pass needs that are already in a device slot when it asks for them (mean "
        "over prompts), per caching policy, at each of Specter's slot counts: ``LRU`` (on-demand loading, the same "
        "slots), ``LRU scaled to equal memory`` (on-demand with the device memory Specter needs at those slots, its "
        "INT4 draft charged: more slots), ``single prefetch sooner`` (Specter with one plan after the first draft "
        "step), ``single prefetch later`` (one plan over the whole window just before verification) and "
        "``speculative`` (Specter's adaptive plans); where the config sets the ``replacement`` option, the field's "
        "caches beside LRU (``LFU``, ``Least-Stale`` as SpecMD's, ``Belady`` as the optimum on the recorded decode), "
        "each under on-demand loading and as ``speculative, <policy>``. The table keeps each run's TPOT and slots per "
        "layer, and carries "
        "every definition of a hit rate (``specter.metrics.HIT_RATES``) beside the paper's Table 3 "
        "(``paper_table3``, DeepSeek-V2-Lite only): ``hit_rate_pass`` (per pass over the decode passes: the "
        "artifact's), ``hit_rate`` (the same with the prefill's pass), ``hit_rate_token`` (per token and layer), "
        "``prefetch_precision`` (experts a window's prefetch placed that its verification used, over those placed) "
        "and ``prefetch_recall`` (over those used). At one token a pass (LRU) the per-pass and per-token rates are "
        "one and the same, and the LRU column is the one comparison every definition supports. A per-pass or "
        "per-token rate of a K + 1-token verification cannot exceed the slots over the distinct experts it needs, so "
        "Table 3's 99.85% at 6 of 64 slots is out of its reach; the prefetch's precision can reach it, and it falls "
        "as slots grow (more experts placed, fewer of them used), as Table 3's speculative columns do: of the "
        "definitions here, only the precision behaves as those columns do."),
    Experiment(
        "sensitivity", "sweep",
        Table(keys=("temperature", "system", "k", "slots_per_layer"), speedups=("temperature",)),
        Figure("grouped_bars", "TPOT vs sampling temperature", x="temperature",
               xlabel="sampling temperature (0: greedy)"),
        "TPOT (mean over prompts) at greedy decoding and when sampling at each temperature, per system, on every "
        "prompt set (each its own domain: code, chat): speculative systems sample with rejection sampling (a draft "
        "token is kept with probability min(1, p/q), else a token is drawn from the residual), which keeps the "
        "target's distribution but accepts fewer proposals as the distributions flatten. Sampled runs are drawn "
        "live with the run's seed, so each system decodes its own sequence; ``results/tables/sensitivity.csv`` has "
        "the acceptance rate beside each TPOT.",
        all_datasets=True),
    Experiment(
        "budget", "sweep",
        Table(keys=("resident_share", "slots_per_layer", "system", "k"), speedups=("resident_share",)),
        Figure("lines", "TPOT vs device budget", x="resident_share",
               xlabel="device expert slots (% of each layer's experts)"),
        "TPOT (mean over prompts) against the device budget, given as the share of each MoE layer's experts that "
        "fit in device slots, for the listed systems at the main hardware profile and K."),
    Experiment(
        "hardware", "sweep",
        Table(keys=("link", "link_gbps", "system", "k", "slots_per_layer"), speedups=()),
        Figure("grouped_bars", "TPOT on each hardware profile", x="hardware",
               xlabel="hardware profile (by link generation)"),
        "The same recorded runs scheduled on every configured hardware profile (PCIe 3.0, 4.0 and 5.0 links and "
        "their GPUs' compute; ``specter hardware`` lists each preset's numbers and their sources), per system: TPOT "
        "is the mean over prompts, simulated."),
    Experiment(
        "dispatch", "sweep",
        Table(keys=("memory", "system", "k", "slots_per_layer"), derive="memory_label", speedups=("memory",)),
        Figure("lines", "TPOT vs the host's dispatch time", x="dispatch_us",
               xlabel="host time per dispatched kernel (us)"),
        "TPOT (mean over prompts, simulated) of each listed system as the host's time per dispatched kernel grows "
        "(``--dispatch-us``: the profile's own figure replaced, nothing else), at the same slots (solid) and at "
        "Specter's device memory (dashed). A system whose code dispatches many small kernels and reads the device "
        "often (its pricing: ``upstream``, each system at the kernels and host reads its public code makes) grows "
        "steeply; one bound by its copies stays flat. Where two systems' lines cross, which one wins depends on the "
        "host, not the link. ``results/tables/dispatch.csv`` has each point's speedup of Specter; the calibration "
        "table reads these runs for the published rows of the same configuration (its 5, 10 and 20 us columns)."),
    Experiment(
        "breakdown", "main",
        Table(kind="breakdown"),
        Figure("breakdown", "Where a token's time goes (the paper's Fig 4)"),
        "Each system's time per output token in the main comparison at the same slots, split by what the device was "
        "doing between the first and the last commit: draft steps, target compute with no copy on the link, with "
        "copies overlapped, stalls on copies (no compute, a copy on the link), host compute (Fiddler's experts on the "
        "CPU) and the rest (the host reading routes, launch gaps between ops), as shares of each system's TPOT (mean "
        "over prompts, beside its bar); an op counts from its first kernel to its last, the gaps between its kernels "
        "as they were launched included, as events around it time it. ``results/tables/breakdown.csv`` gives the "
        "parts in ms per token (they sum to the TPOT) and also the same-memory comparison."),
    Experiment(
        "routing_entropy", "memo",
        Table(kind="routing_entropy"),
        Figure("routing_entropy", "Routing entropy and expert use (the paper's Fig 5)"),
        "How evenly each model's router spreads tokens over its experts, from the main recordings (the target's own "
        "routes for every token of every prompt it decoded, prompt and decode steps): left, each MoE layer's entropy "
        "of expert use as a share of its maximum, log2 of the experts per layer (1: every expert used equally often, "
        "so no small set of experts can be kept resident to catch most tokens); right, the share of the layer's "
        "routed slots each expert took, for the first model and prompt set. The proxies' routing is what drives "
        "every run priced at a real architecture's shapes; the real model's may be more skewed."),
    Experiment(
        "routing_locality", "routing", Table(kind="routing_locality"),
        Figure("routing_locality", "Routing locality: the proxies beside the real models' published statistics"),
        "How often consecutive tokens keep an expert (the same first choice; one in common) at the first, middle and "
        "last MoE layer, beside random routing's, and LRU and LFU hit rates by slots: each model's on held-out text "
        "beside the Mixtral paper's Table 5 and Specter's Table 3 (``specter/presets/routing/published.yaml``)."),
    Experiment(
        "memory", "main",
        Table(kind="memory"),
        Figure("memory", "Device memory per system (the paper's Table 2)"),
        "What each system keeps on the device in the main comparison, in GB, as the memory plan of its run counts it "
        "(the paper's order): the target's non-expert weights in FP16; the draft, which for Specter is its INT4 "
        "self-draft's experts alone (they share the target's other weights and KV) and for SpecMoEOff a separate "
        "draft (its INT4 experts plus its own copy of the non-expert weights, and its own KV); KV for the run's "
        "context; the workspace of staging buffers; and the expert slots. The dashed line is the device's memory. "
        "The figure shows the same-slots comparison; ``results/tables/memory.csv`` also has the same-memory one "
        "(there each system's slots fill Specter's memory at its slots). Resident keeps every expert and has no plan."),
    Experiment(
        "calibration", "sweep",
        Table(kind="calibration"),
        Figure("calibration", "The suite beside published measurements"),
        "Every figure a paper publishes for a configuration the suite can run (one YAML per paper in "
        "``specter/presets/paper/``: the Specter paper's Fig 13, Table 3 and Table 4, Mixtral-Offloading's Table 2, "
        "MoE-Infinity's README table), beside the suite's: TPOT as the mean over prompts, speedups as ratios of "
        "means, hit rates under the definition named in the row. The suite's times are simulated on the row's "
        "hardware profile at the architecture's published shapes, with routing from a proxy of the same routing "
        "structure; the papers' are measured on real checkpoints. Each peer's machine and budget is an arm of this "
        "experiment's own runs (HQQ 2-bit experts where the peer quantizes them). Every ratio outside 0.8 to 1.25 has "
        "a reason written from the records (where the suite's time goes, what crosses the link, a pass's working "
        "set, the proxy's locality), never a fitted constant. On locality: where a proxy's LRU hit rate is above the "
        "real model's (Table 3's LRU rows), caching systems (on-demand, Mixtral-Offloading, MoE-Infinity) gain from "
        "it more than speculative ones, whose prefetch does not rely on reuse, so the suite then understates "
        "Specter's speedups over them; below it, it overstates them. ``results/tables/calibration.csv`` also lists "
        "the published figures whose configuration this run did not include, with why.",
        reads=("main", "hit_rate", "ablation", "dispatch")),
    Experiment(
        "sim_vs_measured", "sweep",
        Table(kind="sim_vs_measured"),
        Figure("sim_vs_measured", "Measured beside simulated"),
        "Every run of this experiment decodes live: the model itself runs through the offload runtime on the config's "
        "``hardware.device`` (its router's choices drive real copies into real slots), and each prompt is measured "
        "(commit timestamps, the cache state restored outside the timed region). Beside it stands its simulated twin: "
        "the same system on the tokens, routes and draft windows the live decode computed (the recorded decode for "
        "Mixtral-Offloading, whose gate guesses a live pass does not compute), scheduled on the profile ``specter "
        "profile-bandwidth`` measured on this machine. ``results/tables/sim_vs_measured.csv`` gives both TPOTs and "
        "their ratio (measured over simulated), and the same for each part of the breakdown (draft, target "
        "compute, compute with copies overlapped, stalls on copies, host compute, host syncs and idle), in ms per "
        "token, means over prompts. On the CPU as device the times are the CPU's: the ratios say how well the "
        "simulator prices this machine, never how well it prices a GPU.",
        measured=True),
    Experiment(
        "fidelity", "fidelity",
        Table(kind="fidelity"),
        Figure("fidelity", "Draft fidelity"),
        "Each configured draft against its target on held-out prompts (``specter fidelity``): left, the share of "
        "(token, MoE layer) pairs whose draft top-k experts match the target's as the paper counts them (v1 Fig 6): "
        "hard (the same experts in the same rank order), soft (the same set in another order), mismatch (another "
        "set); the table adds the set overlap (exact = hard + soft, partial, none). Right: the greedy acceptance rate "
        "(accepted proposals over proposals checked, as in run records) for K = 1..16 with the draft speculating on "
        "the target's committed prefix; the table adds the window utilization (accepted / K)."),
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
