"""Tidy tables of the experiments: run records (JSONL) and fidelity summaries (JSON) in, one CSV per experiment out.

`records_frame` (`specter.report.frames`) flattens records to one row per (run, prompt) with the settings that tell
runs apart; an experiment's table is built by its registry entry's table kind (`specter.experiments`): `stats` (per
setting, means over prompts with TPOT's median, p90, p99 and n beside; the records keep every prompt), `routing`,
`calibration`, `sim_vs_measured` or `fidelity`. Every table keeps `simulated` and `hardware`, so a figure drawn from it
can say what its times are.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specter import experiments
from specter.errors import SpecterError
from specter.registry import Registry
from specter.report import frames
from specter.report.frames import COUNTS, METRICS, read_records, records_frame, scope


def timing_note(table: pd.DataFrame, many: str = "each profile shown") -> str:
    """What a table's times are, from its simulated and hardware columns: 'simulated on a100-40gb-pcie4' (`many` for
    more than two profiles; 'measured on' for CUDA runs; both kinds joined by '; '), or '' for a table without times."""
    if "hardware" not in table or "simulated" not in table:
        return ""
    kinds = []
    for simulated, part in table.groupby("simulated"):
        names = sorted(part["hardware"].dropna().astype(str).unique())
        hw = ", ".join(names) if len(names) <= 2 else many
        kinds.append(f"{'simulated' if str(simulated) == 'True' else 'measured'} on {hw}")
    return "; ".join(kinds)


def _stats(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per setting `keys`: the mean over prompts of every time and rate metric (the paper reports means), TPOT's
    median, p90, p99, fastest and slowest prompt beside it, the sums of the counts, and n (the runs: prompts, times
    their timed repeats on a device). Quantiles interpolate linearly, so at n = 5 the p99 lies between the two slowest
    prompts."""
    groups = df.groupby(keys, dropna=False, sort=True)
    agg = {m: "mean" for m in METRICS if m in df}
    agg.update({m: "sum" for m in COUNTS if m in df})
    out = groups.agg({**agg, "prompt_index": "count"}).rename(columns={"prompt_index": "n"})
    tpot = groups["tpot_ms"]
    out["tpot_ms_median"], out["tpot_ms_p90"], out["tpot_ms_p99"] = tpot.median(), tpot.quantile(0.9), tpot.quantile(
        0.99)
    out["tpot_ms_min"], out["tpot_ms_max"] = tpot.min(), tpot.max()
    return out.reset_index()


def _speedups(table: pd.DataFrame, scope: list[str], of: str = "specter") -> pd.DataFrame:
    """Add `speedup_of_<of>`: each row's mean TPOT over `of`'s in the same scope (a ratio of means, as the paper
    computes it; > 1: `of` is faster); empty where the scope has no single `of` row to compare with."""
    ref = table[table["system"] == of].groupby(scope, dropna=False)["tpot_ms"]
    ref = ref.first()[ref.size() == 1]
    keys = [tuple(row) for row in table[scope].itertuples(index=False, name=None)]
    table[f"speedup_of_{of}"] = [t / ref[k] if k in ref.index else None for t, k in zip(table["tpot_ms"], keys)]
    return table


# The label columns an experiment's table derives before its statistics (`experiments.Table.derive` names one) --------
def _ablation_arm(df):
    """Each run's arm (its name in the config's `arms`, else what its settings remove from Specter) and `arm_index`,
    the arm's place in the order the records list them (the config's order)."""
    def removed(prefetch: str, kernel: str, kv: str, serialize: str) -> str:
        parts = [part for part, gone in (("no prefetch", prefetch == "none"), ("unfused draft kernel", kernel ==
                                         "unfused"), ("copied KV", kv == "copied"),
                                         ("serialized demand", str(serialize).lower() in ("true", "1", "yes")))
                 if gone]
        return ", ".join(parts) or "full"
    arms = [arm or removed(p, k, kv, s) for arm, p, k, kv, s in
            zip(df["arm"], df["prefetch"], df["draft_kernel"], df["draft_kv"], df["serialize_demand"])]
    order = {arm: i for i, arm in enumerate(dict.fromkeys(arms))}
    return df.assign(arm=arms, arm_index=[order[a] for a in arms])


def _memory_label(df):
    """`same slots` or `same memory` from the record's budget kind (the paper's same-cache and same-memory)."""
    return df.assign(memory=["same memory" if kind == "same_memory" else "same slots" for kind in df["budget_kind"]])


def _main_rows(df):
    """`main`'s rows: the comparison (`_memory_label`), and each speculative system's run at a governor's K (the
    entry's `governors`) as a row of its own beside its run at the case's fixed K, which the ratios compare with."""
    df = _memory_label(df)
    return df.assign(system=[experiments.governed_label(s, str(k)) for s, k in zip(df["system"], df["k_setting"])])


def _oracle_forecast(df):
    """`draft` for Specter's own forecast, else the oracle's noise as a share of expert identities replaced."""
    return df.assign(forecast=["draft" if pd.isna(n) else f"target routes, {float(n):.0%} replaced"
                               for n in df["noise"]], noise=df["noise"].astype(float))


def _fixed_k(df):
    """The runs at a fixed K (a governor's run repeats the fixed-K run of the K it chose: counted once)."""
    return df[~df["k_setting"].isin(experiments.GOVERNORS)]


#: the hit_rate experiment's policies, as shown: Table 3's, then the field's caches (`specter.eviction`)
REPLACEMENTS = {"lfu": "LFU", "least-stale": "Least-Stale", "belady": "Belady"}
HIT_POLICIES = ("LRU", "LRU scaled to equal memory", "single prefetch sooner", "single prefetch later", "speculative",
                *(f"{pre}{name}{post}" for pre, post in (("", ""), ("", " scaled to equal memory"),
                                                         ("speculative, ", "")) for name in REPLACEMENTS.values()))


def _hit_policy(df):
    """The paper's Table 3 policies from the runs: on-demand LRU at Specter's slots (`LRU`) and at Specter's device
    memory (`LRU scaled to equal memory`, more slots); Specter with one plan after the first draft step (`single
    prefetch sooner`), one plan over the whole window before verification (`single prefetch later`) and its adaptive
    plans (`speculative`). `specter_slots`: the slots the comparison is built on (Specter's). A run whose cache
    replaces by another policy than LRU (`replacement`) is its own row: on-demand's named by the policy (`LFU`,
    `Least-Stale`, `Belady`, each also scaled to equal memory), Specter's adaptive plans as `speculative, <policy>`."""
    policy = []
    for system, kind, prefetch, replacement in zip(df["system"], df["budget_kind"], df["prefetch"],
                                                   df["replacement"]):
        cache = REPLACEMENTS.get(replacement, "LRU")
        if system == "on-demand":
            policy.append(cache if kind == "slots" else f"{cache} scaled to equal memory")
        elif system == "specter" and kind == "slots" and cache == "LRU":
            policy.append({"adaptive": "speculative", "early": "single prefetch sooner",
                           "late": "single prefetch later"}.get(prefetch))
        elif system == "specter" and kind == "slots" and prefetch == "adaptive":
            policy.append(f"speculative, {cache}")
        else:  # Specter at its own memory is Specter at its slots: counted once; one-plan prefetches under LRU only
            policy.append(None)
    from specter.report.calibration import table3

    published = table3()
    out = df.assign(policy=policy, specter_slots=df["budget_value"])
    out = out[out["policy"].notna()]
    return out.assign(paper_table3=[published.get((arch, pol, int(slots)), float("nan")) for arch, pol, slots in
                                    zip(out["cost_as"], out["policy"], out["specter_slots"])])


DERIVES = Registry("derive", {"main_rows": _main_rows, "memory_label": _memory_label, "ablation_arm": _ablation_arm,
                              "fixed_k": _fixed_k, "oracle_forecast": _oracle_forecast, "hit_policy": _hit_policy},
                   fix="name one of them in the experiment's Table(derive=...)")


def derive(name: str | None, df: pd.DataFrame) -> pd.DataFrame:
    """The records' frame with the label columns `name` (of `DERIVES`) adds; unchanged for None."""
    return df if name is None else DERIVES[name](df)


def experiment_table(name: str, records: list[dict]) -> pd.DataFrame:
    """The tidy table of experiment `name` from its run records."""
    spec = experiments.get(name).table
    if spec.kind in FROM_FILES:
        raise SpecterError(f"experiment {name!r} is not built from run records (its table kind is {spec.kind!r})")
    return FROM_RECORDS[spec.kind](name, records)


def _stats_table(name: str, records: list[dict]) -> pd.DataFrame:
    """A `stats` table (`experiments.Table`): per setting, means over prompts of times and rates and sums of counts."""
    spec = experiments.get(name).table
    df = records_frame(records).assign(_run=range(len(records)))
    if spec.speculative and df["k"].isna().any():
        system = df.loc[df["k"].isna(), "system"].iloc[0]
        raise SpecterError(f"the {name} table compares draft windows, and {system} drafts none (its records have no "
                           f"K); give the records of {name}'s own runs (speculative systems)")
    if spec.systems and not df["system"].isin(spec.systems).all():
        system = df.loc[~df["system"].isin(spec.systems), "system"].iloc[0]
        raise SpecterError(f"the {name} table's rows are runs of {' and '.join(spec.systems)}, and a record is of "
                           f"{system}; give the records of {name}'s own runs")
    frames.one_record_a_prompt(df, records)
    df = derive(spec.derive, df)
    scope = list(experiments.SCOPE)
    frames.one_run_a_row(df, scope + list(spec.keys), records)
    if spec.speedups is not None:
        frames.one_protocol(df, scope + list(spec.speedups), records, name)
    table = _stats(df.drop(columns="_run"), scope + list(spec.keys))
    if table.empty:  # none of the records is of a run this experiment's table reads (its systems, its settings)
        raise SpecterError(f"none of the {len(records)} records makes a row of the {name} table (not the systems "
                           f"or settings it compares); give the records of {name}'s own runs")
    if spec.speedups is not None:
        table = _speedups(table, scope + list(spec.speedups))
    return table[list(spec.columns)] if spec.columns else table


def build_table(name: str, inputs: list[str | Path]) -> pd.DataFrame:
    """Experiment `name`'s table from its input files: fidelity summaries (.json), memos (.json.gz) or run records
    (.jsonl); the claims read run records and fidelity summaries together."""
    kind = experiments.get(name).table.kind
    if kind in FROM_FILES:
        return FROM_FILES[kind](inputs)
    return experiment_table(name, read_records(inputs))


def _lazy(module: str, function: str):
    """`function` of `module`, imported when it is first called (a table kind's module that others need not load)."""
    import importlib

    return lambda *args: getattr(importlib.import_module(module), function)(*args)


def _claims(inputs: list[str | Path]) -> pd.DataFrame:
    """The claims: from run records (.jsonl) and the drafts' fidelity reports (.json) together."""
    from specter.report.claims import claims_table

    reports = [p for p in inputs if str(p).endswith(".json")]
    runs = [p for p in inputs if p not in reports]
    return claims_table(read_records(runs) if runs else [], reports)



def breakdown_table(records: list[dict]) -> pd.DataFrame:
    """Per (case, prompt set, comparison, system): where a committed token's time goes, in ms per token (each prompt's
    `extra.breakdown_ms` over its N - 1 tokens, then the mean over prompts), with TPOT beside: the parts sum to it."""
    from specter.metrics import BREAKDOWN

    rows = []
    for i, r in enumerate(records):
        parts = (r.get("extra") or {}).get("breakdown_ms")
        tokens = len(r.get("output_token_ids") or [])
        if not isinstance(parts, dict) or tokens < 2:
            continue
        cfg = r["config"]
        rows.append(dict(**scope(r), memory="same memory" if cfg.get("same_memory_as") is not None else "same slots",
                         system=experiments.governed_label(r["system"], str(cfg.get("k"))), k=r["k"], _run=i,
                         slots_per_layer=r["slots_per_layer"], tpot_ms=r["tpot_ms"],
                         **{p: float(parts.get(p, 0.0)) / (tokens - 1) for p in BREAKDOWN}))
    if not rows:
        raise SpecterError("the breakdown table needs run records with extra.breakdown_ms (records of this suite's "
                           "version); run the experiment again")
    df = pd.DataFrame(rows)
    keys = [*experiments.SCOPE, "memory", "system", "k", "slots_per_layer"]
    frames.one_run_a_row(df, keys, records)
    out = df.drop(columns="_run").groupby(keys, dropna=False, sort=True).agg(
        {"tpot_ms": "mean", **dict.fromkeys(BREAKDOWN, "mean"), "system": "size"})
    return out.rename(columns={"system": "n"}).reset_index()


def sim_vs_measured_table(records: list[dict]) -> pd.DataFrame:
    """Per (case, prompt set, system) and part (`TPOT`, then each part of the breakdown): the measured time per token
    of the live runs and their simulated twins' (each prompt's `extra.breakdown_ms` and `simulated_breakdown_ms` over
    its N - 1 tokens; TPOT from the record and `extra.simulated_tpot_ms`), means over prompts and timed repeats, and
    their ratio (measured over simulated; empty where the twin spent no time on a part). `measured_on` says what the
    times are (on the CPU as device: never a calibration of a GPU); `simulated_on` names the twins' profile;
    `tokens_as_recorded` is the share of runs whose live tokens are the recorded ones, of those whose twin decoded the
    recorded trace (empty where every twin was priced from its live decode itself)."""
    from specter.metrics import BREAKDOWN

    rows = []
    for r in records:
        extra = r.get("extra") or {}
        measured, simulated = extra.get("breakdown_ms"), extra.get("simulated_breakdown_ms")
        tokens = len(r.get("output_token_ids") or [])
        if (r["simulated"] or not isinstance(measured, dict) or not isinstance(simulated, dict)
                or not isinstance(extra.get("live"), dict) or tokens < 2):
            continue
        cfg = r["config"]
        base = dict(**scope(r), simulated_on=extra.get("simulated_on", ""),
                    measured_on=(cfg.get("device") or {}).get("measured_on", ""),
                    system=experiments.governed_label(r["system"], str(cfg.get("k"))), k=r["k"],
                    slots_per_layer=r["slots_per_layer"],
                    tokens_as_recorded=(float(bool(extra["live"]["tokens_as_recorded"]))
                                        if extra["live"].get("tokens_as_recorded") is not None else float("nan")))
        rows.append({**base, "part": "TPOT", "measured_ms": r["tpot_ms"],
                     "simulated_ms": extra["simulated_tpot_ms"]})
        rows += [{**base, "part": part, "measured_ms": float(measured.get(part, 0.0)) / (tokens - 1),
                  "simulated_ms": float(simulated.get(part, 0.0)) / (tokens - 1)} for part in BREAKDOWN]
    if not rows:
        raise SpecterError("the sim_vs_measured table needs measured run records with extra.breakdown_ms and "
                           "extra.simulated_breakdown_ms (`--engine live` records of this suite's version); run the "
                           "experiment again")
    df = pd.DataFrame(rows)
    order = {part: i for i, part in enumerate(("TPOT", *BREAKDOWN))}
    keys = [*experiments.SCOPE, "simulated_on", "measured_on", "system", "k", "slots_per_layer", "part"]
    out = df.groupby(keys, dropna=False, sort=False).agg(
        measured_ms=("measured_ms", "mean"), simulated_ms=("simulated_ms", "mean"),
        tokens_as_recorded=("tokens_as_recorded", "mean"), n=("measured_ms", "size")).reset_index()
    out["measured_over_simulated"] = [m / s if s > 0 else None for m, s in zip(out["measured_ms"], out["simulated_ms"])]
    out["part_index"] = out["part"].map(order)
    out = out.sort_values([*keys[:-1], "part_index"]).drop(columns="part_index")
    return out.reset_index(drop=True)


#: the parts of a run's device memory, as its memory plan records them (bytes), in the order they are drawn
MEMORY_PARTS = ("non_expert_bytes", "draft_bytes", "kv_bytes", "workspace_bytes", "expert_slot_bytes")


def memory_table(records: list[dict]) -> pd.DataFrame:
    """Per (case, prompt set, comparison, system): the device memory of its run, part by part, in GB (the paper's Table
    2 counts): the target's non-expert weights (FP16), the draft (the self-draft's INT4 experts, which share the
    target's other weights and KV; a separate draft adds its own copy of those), KV for the run's context (twice for a
    draft with its own KV), the workspace of staging buffers, and the expert slots (those a system placing whole layers'
    experts keeps there); their sum, the budget and the device. Every prompt of a run has the same plan: one row per
    run. A system with fixed slots (resident: every expert) keeps no plan and has no row."""
    rows = []
    for i, r in enumerate(records):
        cfg = r["config"]
        plan = cfg.get("memory")
        if not isinstance(plan, dict):
            continue
        placed = plan.get("placed_slot_bytes")  # a system placing whole layers: the experts it keeps there
        plan = {**plan, "expert_slot_bytes": plan["expert_slot_bytes"] if placed is None else placed}
        gb = {part.removesuffix("_bytes") + "_gb": plan[part] / 1e9 for part in MEMORY_PARTS}
        rows.append(dict(**scope(r), memory="same memory" if cfg.get("same_memory_as") is not None else "same slots",
                         system=experiments.governed_label(r["system"], str(cfg.get("k"))), k=r["k"],
                         slots_per_layer=plan["slots_per_layer"], **gb,
                         total_gb=(plan["resident_bytes"] + plan["expert_slot_bytes"]) / 1e9,
                         budget_gb=plan["budget_bytes"] / 1e9 if plan.get("budget_bytes") is not None else None,
                         device_gb=plan["device_bytes"] / 1e9 if plan.get("device_bytes") is not None else None,
                         fits_device=plan.get("fits_device"), _run=i))
    if not rows:
        raise SpecterError("the memory table needs run records with config.memory (records of this suite's version, "
                           "from systems that plan their memory); run the experiment again")
    keys = [*experiments.SCOPE, "memory", "system", "k", "slots_per_layer"]
    df = pd.DataFrame(rows)
    frames.one_run_a_row(df, keys, records)
    return df.drop(columns="_run").drop_duplicates(keys).sort_values(keys).reset_index(drop=True)


def _memo_scope(path: Path) -> tuple[str, str]:
    """(model, prompt set) of a main recording, from its path `memo/<model>/<set>-p<prefix>-k<K>.json.gz` (the
    workflow's layout); another path gives its file name for both."""
    stem = path.name.removesuffix(".json.gz")
    if "-p" in stem:
        return path.parent.name, stem.rsplit("-p", 1)[0]
    return stem, stem


def routing_entropy_table(paths: list[str | Path]) -> pd.DataFrame:
    """Per (model, prompt set, MoE layer, expert): how often the target routed a token to that expert (`uses`, over
    every token of every prompt: the prompt's and each decode step's), its share of the layer's routed slots, and the
    layer's entropy of expert use in bits and as a share of log2(experts) (1: every expert equally used; the paper's
    Fig 5), from the main recordings' routes."""
    import math

    from specter.numerics.memo import read_memo_routes

    rows, hashes = [], {}
    for path in map(Path, paths):
        model, dataset = _memo_scope(path)
        counts: dict[int, dict[int, int]] = {}
        tokens = 0
        traces, shape, model_hash = read_memo_routes(path)
        other, hashes[model, dataset] = hashes.get((model, dataset)), (model_hash, path)
        if other is not None and other[0] != model_hash:  # two models' memos under one folder name
            raise SpecterError(f"{str(other[1])!r} and {str(path)!r} are memos of two different models (their model "
                               f"hashes differ) that both read as model {model!r} on {dataset!r}; give each model's "
                               "memos in a folder of its own name")
        for trace in traces:
            tokens += len(trace)
            for routes in trace:
                for layer, experts in routes.items():
                    layer_counts = counts.setdefault(layer, {})
                    for e in experts:
                        layer_counts[e] = layer_counts.get(e, 0) + 1
        if not counts:
            raise SpecterError(f"{str(path)!r} holds no routes; record it again")
        for layer in sorted(counts):
            experts = shape.layers[str(layer)][0]  # the model's, not the highest id the prompts happened to use
            total = sum(counts[layer].values())
            probs = [counts[layer].get(e, 0) / total for e in range(experts)]
            entropy = -sum(p * math.log2(p) for p in probs if p > 0)
            for e, p in enumerate(probs):
                rows.append(dict(model=model, dataset=dataset, layer=layer, expert=e, uses=counts[layer].get(e, 0),
                                 use_share=p, entropy_bits=entropy, entropy_share=entropy / math.log2(experts),
                                 experts_per_layer=experts, tokens=tokens))
    return pd.DataFrame(rows).drop_duplicates(["model", "dataset", "layer", "expert"])


def routing_table(records: list[dict]) -> pd.DataFrame:
    """Expert prediction per (K, lookahead distance): precision and recall over layers and prompts (sums of hits are
    not in the records, so these are means of the per-(layer, distance) shares), with the window recall beside."""
    rows = []
    for r in records:
        if str(r["config"].get("k")) in experiments.GOVERNORS:  # a governor's run repeats its K's fixed run
            continue
        for p in r.get("expert_prediction") or []:
            rows.append(dict(model=Path(r["model"]).name, dataset=Path(str(r["dataset"])).stem, system=r["system"],
                             k=r["k"], distance=p["distance"], layer=p["layer"], precision=p["precision"],
                             recall=p["recall"], window_recall=r["window_recall"]))
    if not rows:
        raise SpecterError("the routing table needs speculative runs' records (expert_prediction is empty)")
    df = pd.DataFrame(rows)
    return (df.groupby(["model", "dataset", "system", "k", "distance"]).agg(
        precision=("precision", "mean"), recall=("recall", "mean"), window_recall=("window_recall", "mean"),
        layers=("layer", "nunique")).reset_index())


#: the table kinds built from run records (`experiments.Table.kind`): (experiment name, records) -> table
FROM_RECORDS = Registry("table kind", {
    "stats": _stats_table, "routing": lambda name, records: routing_table(records),
    "breakdown": lambda name, records: breakdown_table(records), "memory": lambda name, records: memory_table(records),
    "calibration": lambda name, records: _lazy("specter.report.calibration", "calibration_table")(records),
    "sim_vs_measured": lambda name, records: sim_vs_measured_table(records)},
    fix="name one in the experiment's Table(kind=...)")
#: the table kinds built from other files (fidelity reports, routing statistics, model cards): inputs -> table
FROM_FILES = Registry("table kind", {
    "fidelity": _lazy("specter.report.fidelity", "fidelity_table"), "claims": _claims,
    "routing_entropy": routing_entropy_table, "routing_locality": _lazy("specter.report.locality",
                                                                        "routing_locality_table")})
