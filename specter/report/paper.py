"""The paper's published figures beside the suite's (`paper_check`): one row per figure of
`specter/presets/paper/specter-v1.yaml`, matched to the runs of the same case (architecture, Specter's slots per layer,
the comparison), with the suite's value as the paper computes it (means over prompts, ratios of means) and the ratio.
A published figure whose case this run did not include stays in the table with no suite value.
"""

from __future__ import annotations

import pandas as pd
import yaml

METRICS = ("tpot_ms", "speedup_of_specter", "hit_rate", "tokens_per_s")


def published() -> tuple[str, list[dict]]:
    from importlib.resources import files

    data = yaml.safe_load(files("specter.presets").joinpath("paper", "specter-v1.yaml").read_text())
    return data["source"], data["rows"]


#: the settings that tell one run from another in the frame (with the prompt, one record)
RUN_KEYS = ("model", "cost_as", "dataset", "hardware", "system", "k", "budget_kind", "budget_value", "prefetch",
            "draft_kernel", "prefix_tokens", "serialize_demand", "noise", "draft_kv", "temperature", "arm",
            "prompt_index", "repeat")


def _runs(df: pd.DataFrame, row: dict, system: str, memory: str) -> pd.DataFrame:
    """The prompts' records of `system`, as the paper runs it, in the row's case and comparison: the adaptive
    prefetch, demand copies not serialized, the fused draft kernel, the shared KV, greedy, no oracle (other
    experiments' variants, which the table also reads, are left out), each run once (a run in two experiments' records
    counts once)."""
    kind = "same_memory" if memory == "same_memory" else "slots"
    sub = df[(df["cost_as"] == row["architecture"]) & (df["system"] == system) & (df["budget_kind"] == kind)
             & (df["budget_value"] == row["slots"])]
    if row.get("k") is not None and system == "specter":
        sub = sub[sub["k"] == row["k"]]
    sub = sub[sub["prefetch"].isin(["", "adaptive"]) & (sub["serialize_demand"].astype(str).str.lower() != "true")
              & sub["noise"].isna() & (sub["draft_kernel"] == "fused") & sub["draft_kv"].isin(["", "shared"])
              & (sub["temperature"] == 0)]
    return sub.drop_duplicates([c for c in RUN_KEYS if c in sub and c != "arm"])


def _value(df: pd.DataFrame, row: dict) -> tuple[float | None, int, str]:
    """(the suite's value of the row's metric, the prompts behind it, the proxy model)."""
    memory = row.get("memory", "same_slots")
    runs = _runs(df, row, row["system"], memory)
    if runs.empty:
        return None, 0, ""
    model = ", ".join(sorted(runs["model"].unique()))
    if row["metric"] == "tpot_ms":
        return float(runs["tpot_ms"].mean()), len(runs), model
    if row["metric"] == "tokens_per_s":
        return 1000.0 / float(runs["tpot_ms"].mean()), len(runs), model
    if row["metric"] == "hit_rate":
        return float(runs["hit_rate"].mean()), len(runs), model
    specter = _runs(df, {**row, "k": None}, "specter", memory)
    if specter.empty:
        return None, 0, model
    return float(runs["tpot_ms"].mean()) / float(specter["tpot_ms"].mean()), len(runs), model


def paper_check_table(df: pd.DataFrame) -> pd.DataFrame:
    source, rows = published()
    hardware = ", ".join(sorted(df["hardware"].unique()))
    out = []
    for row in rows:
        suite, prompts, model = _value(df, row)
        out.append(dict(id=row["id"], where=row["where"], architecture=row["architecture"], slots=row["slots"],
                        system=row["system"], comparison=row.get("memory", ""), metric=row["metric"],
                        paper=row["value"], suite=suite, suite_over_paper=suite / row["value"] if suite else None,
                        prompts=prompts, proxy=model, hardware=hardware if suite else "",
                        simulated=bool(df["simulated"].all()) if suite else None, note=row.get("note", ""),
                        paper_source=source))
    return pd.DataFrame(out)
