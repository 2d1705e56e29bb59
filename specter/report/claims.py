"""The paper's claims, judged one by one from a run's own records (the `claims` table and figure).

Each claim of `specter/presets/claims/*.yaml` names a statistic (`STATISTICS`), the runs it is computed from (its
terms: a system and its budget against Specter's slots), the configurations it is computed in (its cells: the
paper's own first) and how cells combine. The suite's figure is the statistic over the runs' prompts; its interval is
a bootstrap over prompts (`BOOTSTRAP` resamples, the central `LEVEL`): a prompt is drawn with every term's record of
it, so a ratio of two systems is paired prompt by prompt, and each cell is resampled on its own before cells combine.

The verdict follows one stated rule per claim (`RULES`), from the interval, never from the point alone:
- `value` (the paper gives a figure): reproduced where the whole interval lies within `BAND` (0.8-1.25x) of the
  paper's figure, not reproduced where none of it does, inconclusive where it straddles an edge of the band;
- `at_least` (the paper says "above"): reproduced where the whole interval is at or above the paper's figure, not
  reproduced where all of it is below, inconclusive where it spans the figure.
A claim none of whose cells ran is `not run`, with the configuration that would run it. Records priced `upstream` are
preferred wherever a published figure is compared (`calibration.PREFERRED_PRICINGS`), at the profile's own dispatch
time.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from specter.errors import SpecterError
from specter.report.calibration import BAND, PREFERRED_PRICINGS, _runs, frame

#: bootstrap resamples of the prompts, and the central share of them the interval covers
BOOTSTRAP, LEVEL, SEED = 2000, 0.95, 0
#: how a verdict is read from the interval (see the module docstring)
RULES = ("value", "at_least")
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "not run")
#: how a claim's figures are written: a ratio, milliseconds, a share (a fraction, written in percent)
UNITS = ("x", "ms", "%")
#: how a claim's cells that ran make one figure
COMBINE = ("first", "mean", "max", "min")
#: a claim's columns, in the order the table gives them (the verdict and figures first, the configuration after)
COLUMNS = ("id", "short", "verdict", "paper", "suite", "low", "high", "unit", "ran_at", "rule", "claim", "source",
           "checked", "configuration",
           "hardware", "simulated", "rows", "cells", "prompts", "note", "beside_of")


def _ratio(a, b):
    return a.mean(axis=-1) / b.mean(axis=-1)


#: statistic -> (the terms it reads, the metric of each, the function of their per-prompt arrays); every function
#: takes arrays of shape (..., prompts) and reduces the last axis
STATISTICS = {
    "speedup": (("baseline", "specter"), "tpot_ms", lambda t: _ratio(t["baseline"], t["specter"])),
    "tpot_ms": (("specter",), "tpot_ms", lambda t: t["specter"].mean(axis=-1)),
    "saved": (("specter", "baseline"), "tpot_ms", lambda t: 1.0 - _ratio(t["specter"], t["baseline"])),
    "hit_ratio": (("specter", "baseline"), "hit_rate_pass", lambda t: _ratio(t["specter"], t["baseline"])),
    "hit_rate_pass": (("specter",), "hit_rate_pass", lambda t: t["specter"].mean(axis=-1)),
    "acceptance_rate": (("specter",), "acceptance_rate", lambda t: t["specter"].mean(axis=-1)),
    # the best fixed K's mean TPOT over the governor's (terms "K=<k>" and "auto", made from the specter term)
    "governor": (("specter",), "tpot_ms", None),
    # the draft's experts against the target's (fidelity reports): a share of (token, layer) pairs per prompt
    "fidelity_exact": ((), None, None),
    "fidelity_hard": ((), None, None),
}
#: the matches (a fidelity row's `match`: hard, soft or mismatch) each fidelity statistic counts
_RELATIONS = {"fidelity_exact": ("hard", "soft"), "fidelity_hard": ("hard",)}


def registry() -> list[dict]:
    """Every claim of every file in `specter/presets/claims/`, checked for what `claims_table` reads."""
    from importlib.resources import files

    from specter.report.calibration import papers

    row_ids = {row["id"] for data in papers() for row in data["rows"]}
    out, seen = [], set()
    for path in sorted((p for p in files("specter.presets").joinpath("claims").iterdir()
                        if p.name.endswith(".yaml")), key=lambda p: p.name):
        data = yaml.safe_load(path.read_text())
        for claim in data["claims"]:
            name = f"{path.name}: claim {claim.get('id')!r}"
            missing = [k for k in ("id", "short", "unit", "claim", "source", "checked", "paper", "rule", "statistic",
                                   "cells", "combine") if k not in claim]
            if missing:
                raise SpecterError(f"{name} lacks {', '.join(missing)}")
            if claim["id"] in seen:
                raise SpecterError(f"{name}: the id is given twice; give each claim its own")
            seen.add(claim["id"])
            for key, allowed in (("rule", RULES), ("statistic", STATISTICS), ("combine", COMBINE), ("unit", UNITS)):
                if claim[key] not in allowed:
                    raise SpecterError(f"{name}: {key} {claim[key]!r} is not one of {', '.join(allowed)}")
            needs = STATISTICS[claim["statistic"]][0]
            absent = [t for t in needs if t not in (claim.get("terms") or {})]
            if absent:
                raise SpecterError(f"{name}: statistic {claim['statistic']} reads the term(s) {', '.join(absent)}; "
                                   "give them under terms")
            unknown = [r for r in claim.get("rows") or [] if r not in row_ids]
            if unknown:
                raise SpecterError(f"{name}: rows {', '.join(unknown)} are not calibration rows of "
                                   "specter/presets/paper/*.yaml")
            out.append({**claim, "hardware_default": data["hardware"]})
    return out


def verdict(rule: str, paper: float, low: float | None, high: float | None) -> str:
    """The verdict of an interval [low, high] against the paper's figure under `rule` (see the module docstring)."""
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "not run"
    if rule == "value":
        lo, hi = sorted((BAND[0] * paper, BAND[1] * paper))
        if lo <= low and high <= hi:
            return "reproduced"
        if high < lo or low > hi:
            return "not reproduced"
        return "inconclusive"
    if rule == "at_least":
        if low >= paper:
            return "reproduced"
        if high < paper:
            return "not reproduced"
        return "inconclusive"
    raise SpecterError(f"unknown rule {rule!r}; rules: {', '.join(RULES)}")


def bootstrap(arrays: dict[str, np.ndarray], statistic, draws: int = BOOTSTRAP, seed: int = SEED) -> np.ndarray:
    """`statistic` over `draws` resamples of the prompts (the same prompts for every term: paired)."""
    n = len(next(iter(arrays.values())))
    index = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    return statistic({name: values[index] for name, values in arrays.items()})


def _interval(draws: np.ndarray) -> tuple[float, float]:
    tail = (1.0 - LEVEL) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def _budget(term: dict, cell: dict) -> dict:
    memory = term.get("memory", "same_slots")
    if memory not in ("same_slots", "same_memory"):
        raise SpecterError(f"a claim's term has memory {memory!r}; give same_slots or same_memory")
    return {"resident_per_layer" if memory == "same_slots" else "same_memory_as": cell["slots"]}


def _term_runs(df: pd.DataFrame, term: dict, cell: dict, default_hw: str) -> pd.DataFrame:
    row = {"architecture": cell["architecture"], "system": term["system"], "metric": "tpot_ms",
           "hardware": cell.get("hardware", default_hw), "budget": _budget(term, cell)}
    row.update({k: term[k] for k in ("prefetch", "draft_kernel") if k in term})
    return _runs(df, row, default_hw)


def _per_prompt(runs: pd.DataFrame, metric: str) -> pd.Series:
    """The mean of `metric` per prompt (a prompt: its prompt set and index), over repeats."""
    values = runs.dropna(subset=[metric])
    return values.groupby(["dataset", "prompt_index"])[metric].mean()


def _cell_arrays(df: pd.DataFrame, claim: dict, cell: dict) -> tuple[dict[str, np.ndarray], pd.DataFrame] | None:
    """The per-prompt arrays of each of the claim's terms in `cell` (paired: the prompts every term has), and the
    runs they came from; None where a term has no runs."""
    names, metric, _ = STATISTICS[claim["statistic"]]
    default_hw = claim["hardware_default"]
    found = []
    for priced in PREFERRED_PRICINGS:
        frame_ = df[(df["pricing"] == priced) & df["dispatch_set"].isna()]
        series, used = {}, []
        for name in names:
            runs = _term_runs(frame_, claim["terms"][name], cell, default_hw)
            if claim["statistic"] != "governor":  # a speculative system at the case's K, not a governor's
                runs = runs[runs["k_setting"].isin(["", str(cell["k"])])]
            if runs.empty:
                break
            if claim["statistic"] == "governor":  # each K setting selected on its own: a governor's run at K 32
                # and the fixed K 32's are one run to `_runs`, which keeps one of two equal runs
                for setting in sorted(set(frame_.loc[frame_["system"] == claim["terms"][name]["system"],
                                                     "k_setting"])):
                    if setting == "auto" or setting.isdigit():
                        part = _term_runs(frame_[frame_["k_setting"] == setting], claim["terms"][name], cell,
                                          default_hw)
                        series["auto" if setting == "auto" else f"K={setting}"] = _per_prompt(part, metric)
                if "auto" not in series or not any(k.startswith("K=") for k in series):
                    series = {}
                    break
            else:
                series[name] = _per_prompt(runs, metric)
            used.append(runs)
        else:
            if not series:
                continue
            joined = pd.concat(series, axis=1, join="inner").dropna()
            if joined.empty:
                continue
            found.append(({name: joined[name].to_numpy(dtype=float) for name in joined}, pd.concat(used)))
            if claim["statistic"] != "governor":
                return found[0]
    # the governor against the widest sweep of fixed K (a pricing whose runs hold the k_sweep's, not main's one K)
    return max(found, key=lambda f: sum(name.startswith("K=") for name in f[0]), default=None)


def _governor(t: dict[str, np.ndarray]) -> np.ndarray:
    fixed = np.stack([v.mean(axis=-1) for name, v in t.items() if name.startswith("K=")])
    return fixed.min(axis=0) / t["auto"].mean(axis=-1)


def _fidelity_rows(paths: list[Path]) -> pd.DataFrame:
    """Every (prompt, position, layer) row of the fidelity reports of GPTQ INT4 drafts (the paper's), with its model's
    name: the CSV `specter fidelity` writes beside each JSON summary."""
    frames = []
    for path in paths:
        meta = json.loads(Path(path).read_text(encoding="utf-8"))
        if meta.get("method") != "gptq" or int(meta.get("bits", 0)) != 4:
            continue
        rows = Path(path).with_suffix(".csv")
        if not rows.is_file():
            raise SpecterError(f"{rows} is missing beside {path}; run `specter fidelity` again (it writes both)")
        with rows.open(newline="") as f:
            part = pd.DataFrame(list(csv.DictReader(f)))
        frames.append(part.assign(model=Path(str(meta["model"])).name, dataset=meta.get("dataset", "")))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _fidelity_arrays(rows: pd.DataFrame, claim: dict, cell: dict) -> tuple[dict[str, np.ndarray], str, int] | None:
    if rows.empty:
        return None
    sub = rows if cell.get("model", "any") == "any" else rows[rows["model"] == cell["model"]]
    if sub.empty:
        return None
    hit = sub["match"].isin(_RELATIONS[claim["statistic"]]).astype(float)
    per_prompt = sub.assign(hit=hit).groupby(["model", "prompt_index"])
    counts = per_prompt["hit"].agg(["sum", "count"])
    models = ", ".join(sorted(sub["model"].unique()))
    return {"hits": counts["sum"].to_numpy(float), "pairs": counts["count"].to_numpy(float)}, models, len(counts)


def _fidelity_share(t: dict[str, np.ndarray]) -> np.ndarray:
    return t["hits"].sum(axis=-1) / t["pairs"].sum(axis=-1)


def _combine(values: list, how: str):
    if how == "first":
        return values[0]
    stacked = np.stack(values)
    return {"mean": stacked.mean(axis=0), "max": stacked.max(axis=0), "min": stacked.min(axis=0)}[how]


def _describe_cell(cell: dict, runs: pd.DataFrame) -> str:
    if "architecture" not in cell:
        return f"proxies {cell}"
    models = ", ".join(sorted(runs["model"].unique()))
    hardware = ", ".join(sorted(runs["hardware"].unique()))
    pricing = ", ".join(sorted(runs["pricing"].unique()))
    datasets = "+".join(sorted(runs["dataset"].unique()))
    return (f"{cell['architecture']} shapes (routing from {models}), {hardware}, priced {pricing}, {cell['slots']} "
            f"slots a layer, K {cell['k']}, {datasets} prompts")


def _where(cell: dict) -> str:
    if "architecture" not in cell:
        return f"the fidelity reports of {cell.get('model', 'any')}"
    return f"{cell['architecture']} at {cell['slots']} slots"


def _ran_at(cells: list[dict], first: dict, claim: dict | None = None) -> str:
    """Where a claim's figure comes from, in a table cell: 'phi-3.5-moe at 1, 2 slots', with the paper's own
    configuration beside where the runs are not at it (for a mean or maximum over the paper's cases: how many of them
    ran)."""
    if "architecture" not in cells[0]:
        where = "the proxies' drafts" if cells[0].get("model", "any") == "any" else f"{cells[0]['model']}'s draft"
        paper = "" if cells[0] is first else " (paper: Qwen1.5-MoE, top-4)"
        return where + paper
    by_arch: dict[str, list] = {}
    for cell in cells:
        by_arch.setdefault(cell["architecture"], []).append(str(cell["slots"]))
    where = "; ".join(f"{arch} at {', '.join(slots)} slots" for arch, slots in by_arch.items())
    if claim is not None and claim["combine"] != "first" and not claim.get("fallback"):
        total = len(claim["cells"])
        return where if len(cells) == total else f"{where} ({len(cells)} of the paper's {total} cases)"
    return where if first["architecture"] in by_arch else f"{where} (paper: {first['architecture']})"


def _judge(claim: dict, df: pd.DataFrame, fidelity: pd.DataFrame, terms: dict | None = None) -> dict:
    """One claim's row: the suite's figure, its interval, the configuration that gave it, the verdict."""
    claim = {**claim, "terms": terms or claim.get("terms") or {}}
    statistic = claim["statistic"]
    ran, described, prompts, used = [], [], 0, []
    first_architecture = None
    for cell in claim["cells"]:
        if claim.get("fallback") and first_architecture not in (None, cell.get("architecture")):
            break
        if statistic in _RELATIONS:
            got = _fidelity_arrays(fidelity, claim, cell)
            if got is None:
                continue
            arrays, models, n = got
            function = _fidelity_share
            described.append(f"the GPTQ INT4 drafts of {models} (fidelity reports)")
        else:
            got = _cell_arrays(df, claim, cell)
            if got is None:
                continue
            arrays, runs = got
            n = len(next(iter(arrays.values())))
            function = _governor if statistic == "governor" else STATISTICS[statistic][2]
            described.append(_describe_cell(cell, runs))
            used.append(runs)
        first_architecture = cell.get("architecture")
        ran.append((cell, function(arrays), bootstrap(arrays, function)))
        prompts += n
        if claim["combine"] == "first":
            break
    base = dict(id=claim["id"], short=claim["short"], unit=claim["unit"], paper=claim["paper"], rule=claim["rule"],
                claim=" ".join(claim["claim"].split()),
                source=f"{claim['source']['version']}, {claim['source']['where']}"
                       + (f", p. {claim['source']['page']}" if claim["source"].get("page") else ""),
                checked=" ".join(str(claim["checked"]).split()), rows=", ".join(claim.get("rows") or []),
                note=" ".join(str(claim.get("note") or "").split()), beside_of="")
    if not ran:
        wanted = ", ".join(_where(c) for c in claim["cells"])
        return {**base, "verdict": "not run", "suite": None, "low": None, "high": None, "prompts": 0, "cells": 0,
                "ran_at": f"not run (paper: {_where(claim['cells'][0])})",
                "hardware": "", "simulated": None,
                "configuration": f"not run: no records at {wanted} (config/paper.yaml runs every case of the paper; "
                                 "config/calibration.yaml the DeepSeek-V2-Lite and Qwen1.5-MoE ones)"}
    point = float(_combine([float(p) for _, p, _ in ran], claim["combine"]))
    low, high = _interval(_combine([d for _, _, d in ran], claim["combine"]))
    configuration = "; ".join(described)
    first = claim["cells"][0]
    if (claim["combine"] == "first" or claim.get("fallback")) and ran[0][0] is not first:
        configuration = f"not the paper's configuration ({_where(first)} did not run): {configuration}"
    elif len(ran) < len(claim["cells"]):
        missed = [_where(c) for c in claim["cells"] if all(c is not r for r, _, _ in ran)]
        configuration += f"; not run here: {', '.join(missed)}"
    combined = f" ({claim['combine']} over {len(ran)} cells)" if len(ran) > 1 else ""
    ran_at = _ran_at([cell for cell, _, _ in ran], first, claim)
    return {**base, "suite": point, "low": low, "high": high, "verdict": verdict(claim["rule"], claim["paper"], low,
                                                                                 high),
            "configuration": configuration + combined, "prompts": prompts, "cells": len(ran), "ran_at": ran_at,
            "hardware": ", ".join(sorted({h for r in used for h in r["hardware"].unique()})),
            "simulated": bool(all(r["simulated"].all() for r in used)) if used else None,
            "_ran": [cell for cell, _, _ in ran]}


def claims_table(records: list[dict], fidelity_reports: list[str | Path] = ()) -> pd.DataFrame:
    """One row per claim of the registry, judged from `records` (run records of the experiments the claims read) and
    the fidelity reports (`specter fidelity`'s JSON summaries, their CSV beside); then, for each claim with `beside`,
    the same statistic over each of those systems, without a verdict."""
    if not records and not fidelity_reports:
        raise SpecterError("the claims table needs run records (.jsonl) or fidelity reports (.json); give the "
                           "records of main, ablation, hit_rate and k_sweep and the drafts' fidelity reports")
    df = frame(records) if records else None
    fidelity = _fidelity_rows([Path(p) for p in fidelity_reports])
    out = []
    for claim in registry():
        if df is None and claim["statistic"] not in _RELATIONS:
            out.append(_judge(claim, pd.DataFrame(columns=["pricing", "dispatch_set"]), fidelity))
            continue
        judged = _judge(claim, df, fidelity)
        out.append(judged)
        for system in claim.get("beside") or []:  # in the cells the claim ran in, so that the rows compare
            terms = {**claim["terms"], "baseline": {**claim["terms"]["baseline"], "system": system}}
            cells = judged.get("_ran") or claim["cells"]
            row = _judge({**claim, "id": f"{claim['id']}@{system}", "cells": cells}, df, fidelity, terms)
            out.append({**row, "verdict": "", "rule": "", "beside_of": claim["id"], "short": system,
                        "claim": f"the same statistic over {system} (not a claim of the paper)"})
    return pd.DataFrame(out)[list(COLUMNS)]


def figure_text(value, unit: str) -> str:
    """A claim's figure as its unit writes it: '1.53x', '163.1 ms', '90.9%'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    value = float(value)
    return {"x": f"{value:.2f}x", "ms": f"{value:.1f} ms", "%": f"{value * 100:.1f}%"}[unit]


def verdict_counts(table: pd.DataFrame) -> dict[str, int]:
    """How many claims (not the rows beside them) got each verdict."""
    claims = table[table["beside_of"].fillna("").astype(str) == ""]
    return {v: int((claims["verdict"] == v).sum()) for v in VERDICTS}
