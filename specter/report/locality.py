"""The `routing_locality` table and figure: how far each model's routing has a real model's temporal locality.

Each configured model's statistics come from `specter routing-stats` (a proxy's model card holds them, measured when
it was built; any other checkpoint is measured on the same held-out text: `specter.models.routing_stats`); the real
models' from `specter/presets/routing/published.yaml`, each with its source, table and page, and how it was read
(`read_in`; the suite's own rows say `computed`). One row per (source, model, statistic, depth, slots, text):
- `repeat_first_choice`, `repeat_any_choice` at the first, middle and last MoE layer (the Mixtral paper's layers 0,
  15 and 31 of 32; the middle is layer (n - 1) // 2 of n) and their mean over layers, with the value under uniform
  random routing of the model's experts beside (`random_routing`);
- `lru_hit_rate`, `lfu_hit_rate` at each slot count the statistics give, mean over layers;
- `reuse_distance_mean`, `routing_entropy_share`, `load_balance_max_over_mean`: means over layers.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from specter.errors import SpecterError
from specter.io import json_strict, not_a_file, read_at_most
from specter.presets import routing_published as published

#: layer measures given at the first, middle and last layer as well as their mean
AT_DEPTH = ("repeat_first_choice", "repeat_any_choice")
MEANS = ("reuse_distance_mean", "routing_entropy_share", "load_balance_max_over_mean")


def _statistics(path: Path) -> dict:
    """A model's routing statistics as `specter routing-stats` wrote them, checked to hold what the table reads."""
    from specter.models.routing_stats import MEASURES

    if (why := not_a_file(path)) is not None:
        raise SpecterError(f"routing statistics {str(path)!r} {why}; write them with `specter routing-stats`")
    try:
        stats = json_strict(read_at_most(path, 1 << 24))
    except (OSError, ValueError) as err:
        raise SpecterError(f"{path} is not routing statistics ({type(err).__name__}); write them again with "
                           "`specter routing-stats`") from None
    routing = stats.get("routing") if isinstance(stats, dict) else None
    missing = [m for m in MEASURES if not isinstance(routing, dict) or m not in routing]
    if missing:
        raise SpecterError(f"{path} lacks the routing measures {', '.join(missing)}; write it again with `specter "
                           "routing-stats` (a model card of an older build: build the model again)")
    from specter.models.routing_stats import impossible

    try:
        problem = impossible(stats)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as err:
        problem = f"a measure of another type or shape than `specter routing-stats` writes ({type(err).__name__})"
    if problem:
        raise SpecterError(f"{path}: {problem}, which no routing gives; write it again with `specter routing-stats`")
    return stats


def routing_locality_table(paths: list[str | Path]) -> pd.DataFrame:
    """The models' rows from their routing statistics at `paths` (`specter routing-stats`), then every published row
    (module docstring)."""
    rows, seen = [], {}
    for path in map(Path, paths):
        stats = _statistics(path)
        r, model = stats["routing"], stats["model"]
        if model in seen:
            raise SpecterError(f"{path} and {seen[model]} both give the routing statistics of {model!r}; give each "
                               "model's once")
        seen[model] = path
        base = dict(source=f"this suite, from {stats.get('measured_from', '')}", model=model,
                    stands_in_for=str(stats.get("stands_in_for") or ""), text=str(r.get("text", "")),
                    where=f"{model}'s routing statistics", read_in="computed")
        n = len(r["layers"])
        for measure in AT_DEPTH:
            values = [float(v) for v in r[measure]]
            for depth, i in (("first", 0), ("middle", (n - 1) // 2), ("last", n - 1)):
                rows.append(dict(base, statistic=measure, depth=depth, layer=r["layers"][i], value=values[i],
                                 random_routing=float(r["random_routing"][measure])))
            rows.append(dict(base, statistic=measure, depth="mean", value=sum(values) / n,
                             random_routing=float(r["random_routing"][measure])))
        for measure in ("lru_hit_rate", "lfu_hit_rate"):
            for slots, value in r[f"{measure}_mean"].items():
                rows.append(dict(base, statistic=measure, depth="mean", slots=int(slots), value=float(value)))
        for measure in MEANS:
            values = [float(v) for v in r[measure] if v is not None]
            mean = sum(values) / len(values) if values else None
            rows.append(dict(base, statistic=measure, depth="mean", value=mean))
    sources, published_rows = published()
    for row in published_rows:
        src = sources[row["source"]]
        rows.append(dict(source=f"{src['paper']}, {src['where']}", model=src["model"], stands_in_for=src["model"],
                         text=str(row.get("text") or src["text"]), where=src["where"], read_in=src["read_in"],
                         statistic=row["statistic"], depth=row["depth"], layer=row.get("layer"),
                         slots=row.get("slots"), value=float(row["value"]),
                         random_routing=(src.get("random_routing") or {}).get(row["statistic"])))
    columns = ["source", "model", "stands_in_for", "statistic", "depth", "layer", "slots", "value", "random_routing",
               "text", "where", "read_in"]
    table = pd.DataFrame(rows, columns=columns).astype({"layer": "Int64", "slots": "Int64"})
    bad = table[[not (isinstance(v, float) and math.isfinite(v) and v >= 0) for v in table["value"].fillna(-1.0)]]
    bad = bad[bad["value"].notna()]
    if len(bad):
        r = bad.iloc[0]
        raise SpecterError(f"{r['where']}: {r['statistic']} is {r['value']!r}, which no routing gives; build the model "
                           "again")
    return table


def plot_routing_locality(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Left and middle: each model's two repeat measures at the first, middle and last MoE layer (a proxy as a line,
    the Mixtral paper's Table 5 as its range over The Pile's subsets with their mean marked), random routing dashed.
    Right: each proxy's LRU and LFU hit rates against slots per layer, the Specter paper's Table 3 LRU marked. A
    published figure is drawn only beside a model that stands in for its model."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from specter.report.plotting import finish

    depths = ["first", "middle", "last"]
    models = sorted(table.loc[table["read_in"].eq("computed"), "model"].unique())
    # another model's experts and slots are not on the same axis (the table keeps every published row)
    stood_in = set(table.loc[table["read_in"].eq("computed"), "stands_in_for"])
    table = table[table["read_in"].eq("computed") | table["model"].isin(stood_in)]
    colours = dict(zip(models, sns.color_palette("colorblind", max(1, len(models)))))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, measure in zip(axes[:2], AT_DEPTH):
        sub = table[(table["statistic"] == measure) & table["depth"].isin(depths)]
        for model in models:
            own = sub[sub["model"] == model].set_index("depth").reindex(depths)
            ax.plot(depths, own["value"], marker="o", color=colours[model], label=f"{model} (this suite)")
            ax.axhline(float(own["random_routing"].iloc[0]), color=colours[model], ls="--", lw=0.8)
        real = sub[~sub["read_in"].eq("computed")]
        for model, part in real.groupby("model"):
            spread = part.groupby("depth")["value"].agg(["min", "max", "mean"]).reindex(depths)
            ax.vlines(depths, spread["min"], spread["max"], color="black", lw=3, label=f"{model} (published range)")
            ax.plot(depths, spread["mean"], ls="none", marker="_", ms=14, color="black")
        ax.set_ylim(0, 1)
        ax.set_xlabel("MoE layer (dashed: random routing)")
        ax.set_ylabel("share of consecutive token pairs")
        ax.set_title({"repeat_first_choice": "same first-choice expert",
                      "repeat_any_choice": "an expert in common"}[measure], fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    ax = axes[2]
    for measure, style in (("lru_hit_rate", "-"), ("lfu_hit_rate", ":")):
        sub = table[(table["statistic"] == measure) & table["slots"].notna()]
        for model in models:
            own = sub[(sub["model"] == model) & sub["read_in"].eq("computed")].sort_values("slots")
            ax.plot(own["slots"], own["value"], ls=style, marker=".", color=colours[model],
                    label=f"{model} {measure.split('_')[0].upper()}")
        for model, part in sub[~sub["read_in"].eq("computed")].groupby("model"):
            ax.plot(part["slots"], part["value"], ls="none", marker="s", color="black",
                    label=f"{model} LRU (published)")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, 1)
    ax.set_xlabel("slots per layer")
    ax.set_ylabel("hit rate")
    ax.set_title("cache hit rate, mean over layers", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    finish(fig, figure.title, out)
