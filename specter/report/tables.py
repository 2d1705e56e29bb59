"""Tidy tables of the experiments: run records (JSONL) and fidelity summaries (JSON) in, one CSV per experiment out.

`records_frame` flattens records to one row per (run, prompt) with the settings that tell runs apart; an experiment's
table is built by its registry entry's table kind (`specter.experiments`): `medians` (medians over prompts per setting;
the records keep every prompt), `routing` or `fidelity`. Every table keeps `simulated` and `hardware`, so a figure drawn
from it can say what its times are.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specter import experiments
from specter.errors import SpecterError
from specter.io import atomic_write
from specter.runspec import Budget

_MEDIANS = ["tpot_ms", "lower_bound_tpot_ms", "ttft_ms", "acceptance_rate", "window_utilization", "window_recall",
            "window_working_set", "stall_ms", "hit_rate"]
_SUMS = ["demand_misses", "h2d_bytes_demand", "h2d_bytes_prefetch", "live_forwards"]


def read_records(paths: list[str | Path]) -> list[dict]:
    from specter.runs.records import read_jsonl

    records = []
    for path in paths:
        records += read_jsonl(path)
    if not records:
        raise SpecterError(f"no records in {', '.join(map(str, paths))}; the runs wrote nothing")
    return records


def records_frame(records: list[dict]) -> pd.DataFrame:
    """One row per record: its settings, its metrics, and its model's name (the checkpoint directory's name)."""
    rows = []
    for r in records:
        cfg = r["config"]
        options = dict(cfg.get("system_options") or [])
        rows.append(dict(
            model=Path(r["model"]).name, cost_as=r.get("cost_as") or "", dataset=Path(str(r["dataset"])).stem,
            hardware=r["hardware"], simulated=r["simulated"], system=r["system"], k=r["k"],
            budget_kind=next((kind for kind, name in Budget.KINDS.items() if cfg.get(name) is not None), ""),
            budget_value=next((cfg[name] for name in Budget.KINDS.values() if cfg.get(name) is not None), None),
            draft_kernel=cfg.get("draft_kernel", "fused"),
            k_setting=str(cfg.get("k")) if cfg.get("k") is not None else "",
            prefetch=cfg.get("prefetch") if r["k"] is not None else "", slots_per_layer=r["slots_per_layer"],
            experts_per_layer=r["experts_per_layer"], resident_share=r["slots_per_layer"] / r["experts_per_layer"],
            prefix_tokens=cfg.get("prefix_tokens"), prompt_index=r["prompt_index"],
            serialize_demand=options.get("serialize-demand", "false"), noise=options.get("noise"),
            **{m: r.get(m) for m in _MEDIANS},
            demand_misses=r["demand_misses"], h2d_bytes_demand=r["h2d_bytes_demand"],
            h2d_bytes_prefetch=r["h2d_bytes_prefetch"], live_forwards=r.get("extra", {}).get("live_forwards", 0),
        ))
    return pd.DataFrame(rows)


def _medians(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Medians over prompts of the time and rate metrics, sums of the counts, per setting `keys`."""
    agg = {m: "median" for m in _MEDIANS if m in df}
    agg.update({m: "sum" for m in _SUMS if m in df})
    out = df.groupby(keys, dropna=False, sort=True).agg({**agg, "prompt_index": "count"})
    return out.rename(columns={"prompt_index": "prompts"}).reset_index()


def _speedups(table: pd.DataFrame, scope: list[str], of: str = "specter") -> pd.DataFrame:
    """Add `speedup_of_<of>`: each row's TPOT over `of`'s TPOT in the same scope (> 1: `of` is faster); empty where
    the scope has no single `of` row to compare with."""
    ref = table[table["system"] == of].groupby(scope, dropna=False)["tpot_ms"]
    ref = ref.first()[ref.size() == 1]
    keys = [tuple(row) for row in table[scope].itertuples(index=False, name=None)]
    table[f"speedup_of_{of}"] = [t / ref[k] if k in ref.index else None for t, k in zip(table["tpot_ms"], keys)]
    return table


def experiment_table(name: str, records: list[dict]) -> pd.DataFrame:
    """The tidy table of experiment `name` from its run records."""
    spec = experiments.get(name).table
    if spec.kind == "routing":
        return routing_table(records)
    if spec.kind == "paper_check":
        from specter.report.paper import paper_check_table

        return paper_check_table(records_frame(records))
    if spec.kind != "medians":
        raise SpecterError(f"experiment {name!r} is not built from run records (its table kind is {spec.kind!r})")
    df = records_frame(records)
    if spec.derive is not None:
        df = spec.derive(df)
    scope = list(experiments.SCOPE)
    table = _medians(df, scope + list(spec.keys))
    if spec.speedups is not None:
        table = _speedups(table, scope + list(spec.speedups))
    return table[list(spec.columns)] if spec.columns else table


def build_table(name: str, inputs: list[str | Path]) -> pd.DataFrame:
    """Experiment `name`'s table from its input files: fidelity summaries (.json) or run records (.jsonl)."""
    if experiments.get(name).table.kind == "fidelity":
        return fidelity_table(inputs)
    return experiment_table(name, read_records(inputs))


def routing_table(records: list[dict]) -> pd.DataFrame:
    """Expert prediction per (K, lookahead distance): precision and recall over layers and prompts (sums of hits are
    not in the records, so these are means of the per-(layer, distance) shares), with the window recall beside."""
    rows = []
    for r in records:
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


def fidelity_table(paths: list[str | Path]) -> pd.DataFrame:
    """One row per (draft, K) from `specter fidelity` JSON summaries: expert-set agreement, top-1, acceptance."""
    rows = []
    for path in paths:
        s = _fidelity_summary(Path(path))
        for a in s["acceptance"]:
            rows.append(dict(model=Path(s["model"]).name, dataset=s["dataset"], method=s["method"], bits=s["bits"],
                             group_size=s["group_size"], expert_exact=s["expert_exact"],
                             expert_partial=s["expert_partial"], expert_none=s["expert_none"],
                             top1_agreement=s["top1_agreement"], k=a["k"], mean_accepted=a["mean_accepted"],
                             acceptance_rate=a["acceptance_rate"], windows=a["windows"]))
    return pd.DataFrame(rows)


_FIDELITY_KEYS = ("model", "dataset", "method", "bits", "group_size", "expert_exact", "expert_partial", "expert_none",
                  "top1_agreement", "acceptance")


def _fidelity_summary(path: Path) -> dict:
    """A `specter fidelity` JSON summary, checked to have what the table reads."""
    if not path.is_file():
        raise SpecterError(f"fidelity summary {str(path)!r} does not exist; run `specter fidelity` (it writes the "
                           ".json beside its --out CSV)")
    try:
        s = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecterError(f"{path} is not a JSON fidelity summary ({err}); run `specter fidelity` again") from None
    missing = [k for k in _FIDELITY_KEYS if not isinstance(s, dict) or k not in s]
    if not missing and not (isinstance(s["acceptance"], list) and all(
            isinstance(a, dict) and {"k", "mean_accepted", "acceptance_rate", "windows"} <= set(a)
            for a in s["acceptance"])):
        missing = ["acceptance (a list of {k, mean_accepted, acceptance_rate, windows})"]
    if missing:
        raise SpecterError(f"{path} is not a fidelity summary (it lacks {', '.join(missing)}); give the .json "
                           "`specter fidelity` writes")
    return s


def read_table(path: str | Path) -> pd.DataFrame:
    """A table `write_table` wrote (CSV), or one SpecterError saying why it cannot be read."""
    path = Path(path)
    if not path.is_file():
        raise SpecterError(f"table {str(path)!r} does not exist; write it with `specter aggregate`")
    try:
        return pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise SpecterError(f"{path} is not a CSV table ({str(err).strip().splitlines()[0]}); write it with "
                           "`specter aggregate`") from None


def write_table(table: pd.DataFrame, out: str | Path) -> None:
    atomic_write(out, lambda f: table.to_csv(f, index=False))
