"""Published measurements beside the suite's (`calibration`): one row per figure a paper publishes for a configuration
the suite can run, from the papers' files in `specter/presets/paper/` (one YAML per paper, each row with where it is
printed), matched to the runs of the same configuration (the architecture that prices them, the hardware profile, the
system with its settings, the budget, the experts' storage), with the suite's value as the paper computes it (means
over prompts, ratios of means), the ratio, and for a ratio outside `BAND` a one-line reason written from what the
records show (where the suite's time goes, its copies, its hit rates), never a fitted constant. A figure whose
configuration no run of the records has stays in the table with no suite value and says why. Each row says how its
runs were priced (`pricing`: the kernels each op stands for, `fused` for the modelled runtime, `counted` for a
model's own modules) and whether it is `comparable`: a row that measures another quantity or follows another protocol
(its paper's file says which, and why, in `comparability`) stays in the table but out of `log_ratio_stats`.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import yaml

from specter.errors import SpecterError
from specter.metrics import BREAKDOWN, HIT_RATES

#: a ratio of the suite's figure to the paper's inside this band needs no reason
BAND = (0.8, 1.25)
#: what a row can compare (hit rates by their names in `specter.metrics.HIT_RATES`)
METRICS = ("tpot_ms", "s_per_token", "tokens_per_s", "speedup_of_specter", *HIT_RATES)
#: the settings that tell one run from another in the frame (with the prompt, one record)
RUN_KEYS = ("model", "cost_as", "dataset", "hardware", "system", "k", "budget_kind", "budget_value", "prefetch",
            "draft_kernel", "prefix_tokens", "serialize_demand", "noise", "draft_kv", "temperature", "expert_bits",
            "settings", "pricing", "dispatch_us", "prompt_index", "repeat")
_BUDGETS = {"resident_per_layer": "slots", "same_memory_as": "same_memory", "device_memory_gb": "gb",
            "resident_fraction": "fraction"}


def papers() -> list[dict]:
    """Every paper's file (`specter/presets/paper/*.yaml`), in name order, each row checked for what it needs."""
    from importlib.resources import files

    out = []
    for path in sorted((p for p in files("specter.presets").joinpath("paper").iterdir() if p.name.endswith(".yaml")),
                       key=lambda p: p.name):
        data = yaml.safe_load(path.read_text())
        for row in data["rows"]:
            missing = [key for key in ("id", "where", "architecture", "system", "metric", "value") if key not in row]
            if missing or row["metric"] not in METRICS:
                raise SpecterError(f"{path.name}: row {row.get('id')!r} lacks {missing or 'a known metric'}; "
                                   f"metrics: {', '.join(METRICS)}")
            if row.get("comparable", True) not in (True, False):
                raise SpecterError(f"{path.name}: row {row['id']!r} has comparable: {row['comparable']!r}; write "
                                   "true or false (unquoted)")
            if row.get("comparable", True) is False and not str(row.get("comparability") or "").strip():
                raise SpecterError(f"{path.name}: row {row['id']!r} is not comparable and does not say why; give it "
                                   "its comparability (the other quantity or protocol it measures)")
        out.append(data)
    return out


def table3() -> dict[tuple[str, str, int], float]:
    """The Specter paper's Table 3 by (architecture, policy of the hit_rate table, Specter's slots per layer)."""
    return {(row["architecture"], row["table3"], int(next(iter(row["budget"].values())))): row["value"]
            for data in papers() for row in data["rows"] if "table3" in row}


def frame(records: list[dict]) -> pd.DataFrame:
    """The records' frame (`records_frame`) with what calibration also reads: each run's resolved system settings,
    its commits and its time per token by part of the breakdown."""
    from specter.report.frames import records_frame

    df = records_frame(records)
    tokens = [max(1, len(r["extra"]["commit_ms"]) - 1) for r in records]
    df["settings"] = [json.dumps({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (
        r["config"].get("system_settings") or {}).items()}, sort_keys=True) for r in records]
    for part in BREAKDOWN:
        df[f"part:{part}"] = [(r["extra"].get("breakdown_ms") or {}).get(part, 0.0) / n
                              for r, n in zip(records, tokens)]
    df["dispatch_set"] = [(r["config"] or {}).get("dispatch_us") for r in records]  # --dispatch-us, or None
    df["kernels"] = [json.dumps(((r["config"] or {}).get("priced_ops") or {}).get("kernels") or {}, sort_keys=True)
                     for r in records]
    # the decode's copies a committed token: the prefill's left out (records without the split: every copy)
    df["h2d_mb_per_token"] = [(r["h2d_bytes_demand"] + r["h2d_bytes_prefetch"]
                               - (r["extra"].get("h2d_bytes_prefill") or 0)) / 1e6 / n
                              for r, n in zip(records, tokens)]
    return df


def _runs(df: pd.DataFrame, row: dict, default_hardware: str, system: str | None = None,
          budget: dict | None = None) -> pd.DataFrame:
    """The prompts' records of the row's configuration (another `system` or `budget` for the reference of a ratio):
    the architecture, the hardware (the paper's unless the row says `any`), the system and its settings, the budget,
    the experts' storage; a speculative system at the row's K, prefetch policy and draft kernel (adaptive and fused
    unless said), demand copies not serialized, the shared KV, LRU slots, greedy, no oracle; each run once (a run in two
    experiments' records counts once)."""
    system = system or row["system"]
    budget = row.get("budget") if budget is None else budget
    sub = df[(df["cost_as"] == row["architecture"]) & (df["system"] == system)
             & (df["expert_bits"] == row.get("expert_bits", 16))]
    hardware = row.get("hardware", default_hardware)
    if hardware != "any":
        sub = sub[sub["hardware"] == hardware]
    for name, value in (budget or {}).items():
        sub = sub[(sub["budget_kind"] == _BUDGETS[name]) & (sub["budget_value"].astype(float) == float(value))]
    for name, value in (row.get("settings") or {}).items():
        want = str(value).lower() if isinstance(value, bool) else str(value)
        sub = sub[pd.Series([json.loads(s).get(name) == want for s in sub["settings"]], index=sub.index, dtype=bool)]
    if system == row["system"] and row.get("k") is not None:
        sub = sub[sub["k"] == row["k"]]
    speculative = sub["k"].notna()
    sub = sub[~speculative | ((sub["prefetch"] == row.get("prefetch", "adaptive"))
                              & (sub["draft_kernel"] == row.get("draft_kernel", "fused")))]
    sub = sub[(sub["serialize_demand"].astype(str).str.lower() != "true") & sub["noise"].isna()
              & sub["draft_kv"].isin(["", "shared"]) & (sub["temperature"] == 0)]
    if "replacement" not in (row.get("settings") or {}):  # the papers' caches are LRU unless the row says
        sub = sub[sub["replacement"] == "lru"]
    return sub.drop_duplicates([c for c in RUN_KEYS if c in sub])


def _value(runs: pd.DataFrame, metric: str) -> float | None:
    if metric in HIT_RATES:
        values = runs[metric].dropna()
        return float(values.mean()) if len(values) else None
    tpot = float(runs["tpot_ms"].mean())
    return {"tpot_ms": tpot, "s_per_token": tpot / 1e3, "tokens_per_s": 1e3 / tpot}.get(metric, tpot)


def _where_time_goes(runs: pd.DataFrame) -> str:
    """'stall on copies 71%, target compute 20%' (the two largest parts of the mean time per token)."""
    parts = {part: float(runs[f"part:{part}"].mean()) for part in BREAKDOWN}
    total = sum(parts.values()) or 1.0
    top = sorted(parts.items(), key=lambda kv: -kv[1])[:2]
    return ", ".join(f"{part} {value / total:.0%}" for part, value in top if value > 0)


def _priced_as(runs: pd.DataFrame) -> str:
    """'priced upstream: 81 kernels an attention block, 32 a routed expert, 10 the head, 14 host reads a MoE layer'
    (the runs' kernels per op, where they share one pricing)."""
    kernels = runs["kernels"].unique() if "kernels" in runs else []
    if len(kernels) != 1 or not json.loads(kernels[0]):
        return ""
    k = json.loads(kernels[0])
    reads = (f", {k['host_reads']} host reads a MoE layer" if k.get("host_reads") is not None
             else ", the routing read once a MoE layer where the cache can miss")
    return (f"priced {runs['pricing'].iloc[0]}: {k.get('attention')} kernels an attention block, {k.get('expert')} a "
            f"routed expert, {k.get('head')} the head{reads}")


def _reason(row: dict, runs: pd.DataFrame, reference: pd.DataFrame | None, ratio: float, departures: list) -> str:
    """Why the suite's figure is `ratio` x the paper's, from the records: where its time goes and what crosses the
    link (times), the two systems' breakdowns (speedups), the bound a pass's working set puts on a per-pass rate or
    the proxy's locality (hit rates); then the configuration's known departures."""
    side = "above" if ratio > 1 else "below"
    metric = row["metric"]
    if metric in HIT_RATES:
        slots = int(runs["slots_per_layer"].iloc[0])
        parts = [f"suite {side} the paper ({ratio:.2f}x)"]
        working = runs["window_working_set"].dropna()
        if metric in ("hit_rate", "hit_rate_pass") and len(working):
            bound = min(1.0, slots / float(working.mean()))
            parts.append(f"a verification needs {float(working.mean()):.1f} distinct experts a layer, so at {slots} "
                         f"slots at most {bound:.0%} of them can be resident")
        if len(runs["prefetch_precision"].dropna()):
            parts.append(f"the same runs' prefetch precision is {float(runs['prefetch_precision'].mean()):.2%}")
        if row["system"] == "on-demand":
            parts.append(f"LRU at {slots} of {int(runs['experts_per_layer'].iloc[0])} slots keeps "
                         f"{float(runs[metric].mean()):.1%} of the proxy's routings: its routing has "
                         f"{'more' if ratio > 1 else 'less'} temporal locality than the paper's model")
        return "; ".join(parts + departures)
    parts = [f"suite {side} the paper ({ratio:.2f}x): {float(runs['tpot_ms'].mean()):.1f} ms a token "
             f"({_where_time_goes(runs)}), {float(runs['h2d_mb_per_token'].mean()):.0f} MB copied a token in decode"]
    parts += [_priced_as(runs)] if _priced_as(runs) else []
    if len(runs["hit_rate"].dropna()):
        parts.append(f"{float(runs['hit_rate'].mean()):.0%} of its experts found on the device (the proxy's routing)")
    if reference is not None and not reference.empty:
        parts.append(f"Specter {float(reference['tpot_ms'].mean()):.1f} ms ({_where_time_goes(reference)})")
    return "; ".join(parts + departures)


#: the pricings a row's figure is taken from, the first with runs (`upstream` wherever a published figure is compared)
PREFERRED_PRICINGS = ("upstream", "counted", "fused")
#: the host's dispatch times (us a kernel) every row is also given at, where its runs were swept over them
DISPATCH_US = (5, 10, 20)


def _figure(df: pd.DataFrame, row: dict, default_hw: str):
    """(the suite's value, its runs, Specter's reference runs for a speedup, why there is none) for `row` in `df`."""
    suite, reference, why = None, None, ""
    runs = _runs(df, row, default_hw)
    if runs.empty:
        why = f"not run: no records of {row['system']} at this configuration ({_describe(row, default_hw)})"
    elif row["metric"] == "speedup_of_specter":
        specter_budget = {"resident_per_layer": next(iter(row["budget"].values()))}
        reference = _runs(df, {**row, "k": None, "prefetch": "adaptive"}, default_hw, "specter", specter_budget)
        if reference.empty:
            why = f"not run: no records of specter at {_describe(row, default_hw)}"
        else:
            suite = float(runs["tpot_ms"].mean()) / float(reference["tpot_ms"].mean())
    else:
        suite = _value(runs, row["metric"])
    return suite, runs, reference, why


def _band(ratio: float | None) -> str | None:
    return None if ratio is None else "below" if ratio < BAND[0] else "above" if ratio > BAND[1] else "inside"


def calibration_table(records: list[dict]) -> pd.DataFrame:
    """One row per published figure of every paper's file: the suite's value from `records` (priced as the first of
    `PREFERRED_PRICINGS` with runs, at the profile's own dispatch time), the ratio, the reason (required outside
    `BAND`); beside it the ratio priced `fused` (the modelled runtime) and, under the row's pricing, at each of
    `DISPATCH_US` (from runs swept over `--dispatch-us`, or run on a profile of that figure); `diagnostic` is False
    where the ratio's band (below, inside, above) changes across them."""
    df = frame(records)
    out = []
    for data in papers():
        default_hw = data["hardware"]
        for row in data["rows"]:
            suite, runs, reference, why, priced = None, df.iloc[0:0], None, "", ""
            by_dispatch, fused = {}, None
            if row["system"] is None:
                why = "not run: " + row.get("note", "no system of the suite runs this configuration")
            else:
                own = df[df["dispatch_set"].isna()]
                for priced in PREFERRED_PRICINGS:
                    suite, runs, reference, why = _figure(own[own["pricing"] == priced], row, default_hw)
                    if not runs.empty:
                        break
                if runs.empty:
                    suite, runs, reference, why = _figure(own, row, default_hw)
                fused = _figure(own[own["pricing"] == "fused"], row, default_hw)[0]
                for us in DISPATCH_US:
                    at = _figure(df[(df["pricing"] == priced) & (df["dispatch_us"] == us)], row, default_hw)[0]
                    by_dispatch[us] = at / row["value"] if at is not None else None
            ratio = suite / row["value"] if suite is not None else None
            inside = ratio is not None and BAND[0] <= ratio <= BAND[1]
            if ratio is not None and not inside:
                why = _reason(row, runs, reference, ratio, list(data.get("departures") or []))
            comparable = row.get("comparable", True) is not False
            swept = list(by_dispatch.values())
            out.append(dict(
                paper=data["paper"], id=row["id"], where=row["where"], page=row.get("page"),
                architecture=row["architecture"], hardware=row.get("hardware", default_hw),
                system=row["system"] or "", configuration=_describe(row, default_hw), metric=row["metric"],
                published=row["value"], suite=suite, suite_over_published=ratio,
                in_band=inside if ratio is not None else None,
                reason=why, comparable=comparable, comparability=row.get("comparability", ""),
                pricing=", ".join(sorted(runs["pricing"].unique())) if len(runs) else "",
                fused_over_published=fused / row["value"] if fused is not None else None,
                **{f"at_{us}us": by_dispatch.get(us) for us in DISPATCH_US},
                diagnostic=len({_band(r) for r in swept}) == 1 if swept and None not in swept else None,
                prompts=len(runs), proxy=", ".join(sorted(runs["model"].unique())),
                simulated=bool(runs["simulated"].all()) if len(runs) else None, note=row.get("note", ""),
                source=data["source"]))
    table = pd.DataFrame(out)
    check_reasons(table)
    return table


def _describe(row: dict, default_hardware: str) -> str:
    """The row's configuration in words: budget, experts' storage, settings, K and policy."""
    parts = [f"{name}={value}" for name, value in (row.get("budget") or {}).items()]
    parts += [f"expert_bits={row['expert_bits']}"] if row.get("expert_bits", 16) != 16 else []
    parts += [f"{k}={v}" for k, v in (row.get("settings") or {}).items()]
    parts += [f"{k}={row[k]}" for k in ("k", "prefetch", "draft_kernel") if row.get(k) is not None]
    return ", ".join(parts)


def check_reasons(table: pd.DataFrame) -> None:
    """Every row whose ratio is outside `BAND` says why (a ratio is reported, never fitted: its reason is the
    record's account of it)."""
    for _, row in table.iterrows():
        ratio = row["suite_over_published"]
        if ratio is None or (isinstance(ratio, float) and math.isnan(ratio)):
            continue
        if not BAND[0] <= ratio <= BAND[1] and not str(row["reason"] or "").strip():
            raise SpecterError(f"calibration row {row['id']!r}: suite / published = {ratio:.3g} is outside "
                               f"{BAND[0]}-{BAND[1]} and has no reason; give the row its reason")


def log_ratio_stats(table: pd.DataFrame) -> tuple[float | None, float | None]:
    """(median, largest) |log ratio| over the comparable rows with a suite figure."""
    comparable = (table["comparable"].astype(str).str.lower() != "false" if "comparable" in table
                  else pd.Series(True, index=table.index))  # a table written before the column: every row
    values = [abs(math.log(r)) for r in table.loc[comparable, "suite_over_published"].dropna() if r > 0]
    if not values:
        return None, None
    return float(pd.Series(values).median()), max(values)
