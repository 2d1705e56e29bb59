"""One figure per experiment, drawn from its tidy table (seaborn on matplotlib's Agg backend).

Every panel is one (model, dataset, pricing); times are labelled with their unit and, when simulated, with "simulated on
<hardware profile>" (measured times say "measured on"). Figures are PNGs at 150 dpi sized for the report page. The
drawing kit (order, colours, panels) is `specter.report.plotting`; the figures that hold the suite against measurements
are in `specter.report.check_figures`.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specter.errors import SpecterError  # noqa: E402
from specter.registry import Registry  # noqa: E402
from specter.report.check_figures import (  # noqa: E402
    plot_calibration,
    plot_claims,
    plot_fidelity,
    plot_sim_vs_measured,
)
from specter.report.locality import plot_routing_locality  # noqa: E402
from specter.report.plotting import (  # noqa: E402
    OTHER_COLOR,
    SPECTER_COLOR,
    bars_with_bound,
    base,
    finish,
    hardware_order,
    headroom,
    ordered,
    palette,
    panel_grid,
    save,
)
from specter.report.tablefile import its_own_table  # noqa: E402
from specter.report.tables import HIT_POLICIES, timing_note  # noqa: E402


def plot(name: str, table: pd.DataFrame, out: str | Path) -> None:
    """Draw experiment `name`'s figure from its table to `out` (PNG), by its registry entry's figure kind."""
    from specter import experiments

    spec = experiments.get(name)
    figure = spec.figure
    draw = KINDS[figure.kind]
    if table.empty:
        raise SpecterError(f"the {name} table has no rows; aggregate the experiment's records again")
    its_own_table(name, spec.table, table)
    sns.set_theme(style="whitegrid", context="paper")
    try:
        draw(figure, table, out, timing_note(table))
    except KeyError as err:  # a column name, or pandas' "None of [Index([...], dtype=...)] are in the [columns]"
        listed = re.search(r"Index\(\[(.*?)\]", str(err.args[0]))
        missing = ", ".join(re.findall(r"'([^']*)'", listed.group(1))) if listed else str(err.args[0])
        raise SpecterError(f"the table lacks columns the {name} figure draws (missing: {missing}); give the "
                           f"table `specter aggregate {name}` wrote") from None


def _plot_k_sweep(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT and its lower bound against fixed K, the acceptance rate on a second axis (green, right), and each
    governor's run as one marker at its TPOT over all its prompts (the online governor's K is the mean of its
    prompts' median windows); the legend sits below the axes, clear of the curves."""
    fig, panels = panel_grid(table, height=4.6)
    for ax, sub, title in panels:
        fixed = sub[sub["k_setting"].str.fullmatch(r"\d+")].sort_values("k")
        ax.plot(fixed["k"], fixed["tpot_ms"], marker="o", color=SPECTER_COLOR, label="TPOT at a fixed K")
        ax.plot(fixed["k"], fixed["lower_bound_tpot_ms"], ls="--", color="gray", label="lower bound")
        styles = {"auto": ("*", "black", 200), "profile": ("P", "purple", 120), "online": ("D", "darkorange", 80)}
        for setting, part in sub[~sub["k_setting"].str.fullmatch(r"\d+")].groupby("k_setting"):
            marker, color, size = styles.get(setting, ("X", "teal", 100))
            n = part["n"].astype(float)
            k, tpot = float((part["k"] * n).sum() / n.sum()), float((part["tpot_ms"] * n).sum() / n.sum())
            chose = (f"K = {int(part['k'].iloc[0])}" if len(part) == 1 else "K = " + ", ".join(
                f"{int(k)} ({int(c)} prompt{'s' if c > 1 else ''})" for k, c in sorted(zip(part["k"], part["n"]))))
            # hollow, so that governors choosing the same K (and the fixed-K point under them) all show
            ax.scatter([k], [tpot], marker=marker, s=size, facecolors="none", edgecolors=color, linewidths=1.6,
                       zorder=5, label=f"{setting} governor: {chose}, {tpot:.3g} ms")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(fixed["k"].unique()), [str(int(v)) for v in sorted(fixed["k"].unique())])
        ax.set_xlabel("draft window K (tokens, log scale)")
        ax.set_ylabel("TPOT (ms, mean over prompts)", color=SPECTER_COLOR)
        twin = ax.twinx()
        twin.plot(fixed["k"], fixed["acceptance_rate"], marker="s", ms=4, color="seagreen", lw=1,
                  label="acceptance rate (right axis)")
        twin.set_ylabel("acceptance rate (accepted / checked)", color="seagreen")
        twin.set_ylim(0, 1.05)
        twin.grid(False)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = twin.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2,
                  frameon=False)
        ax.set_title(title, fontsize=9)
    finish(fig, f"{figure.title} ({timing})", out)


def _plot_routing(figure, table: pd.DataFrame, out, timing: str) -> None:
    fig, panels = panel_grid(table)
    for ax, sub, title in panels:
        # draft and target both pick top-k experts, so the sets are equally large and precision equals recall;
        # both are drawn only where they differ
        same = (sub["precision"] - sub["recall"]).abs().max() < 1e-12
        for k, part in sub.groupby("k"):
            part = part.sort_values("distance")
            ax.plot(part["distance"], part["recall"], marker="o", ms=3,
                    label=f"K={k}" if same else f"recall, K={k}")
            if not same:
                ax.plot(part["distance"], part["precision"], marker="x", ls="--", label=f"precision, K={k}")
        ax.set_xlabel("lookahead distance (draft steps ahead of verification)")
        ax.set_ylabel("recall = precision (mean over layers)" if same else "share of experts (mean over layers)")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, ncol=3, loc="lower center")
        wr = ", ".join(f"K={k}: {v:.2f}" for k, v in sub.groupby("k")["window_recall"].first().items())
        ax.set_title(f"{title}\nwindow recall {wr}", fontsize=9)
    finish(fig, figure.title, out)


def _plot_working_set(figure, table: pd.DataFrame, out, timing: str) -> None:
    fig, panels = panel_grid(table)
    for ax, sub, title in panels:
        sub = sub.sort_values("k")
        ax.plot(sub["k"], sub["window_working_set"], marker="o", label="distinct experts per window")
        ax.axhline(sub["experts_per_layer"].iloc[0], color="gray", ls=":", label="experts per layer")
        ax.axhline(sub["slots_per_layer"].iloc[0], color="crimson", ls="--", label="device slots per layer")
        ax.set_xlabel("draft window K (tokens)")
        ax.set_ylabel("experts per MoE layer (mean)")
        ax.set_ylim(0, sub["experts_per_layer"].iloc[0] * 1.1)
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
    finish(fig, figure.title, out)


def _plot_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per `figure.x`, each with its lower bound."""
    fig, panels = panel_grid(table, x=figure.x)
    for ax, sub, title in panels:
        sub = sub.sort_values(figure.sort, na_position="first") if figure.sort else sub  # no value: a baseline
        bars_with_bound(ax, sub, figure.x)
        ax.set_xlabel(figure.xlabel)
        ax.set_title(title, fontsize=9)
    finish(fig, f"{figure.title} ({timing})", out)


def _plot_system_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per system in the fixed order, one bar per comparison (same slots, same memory) where the table has
    both, each with its lower bound and value; Specter's bars marked; log scale when the bars span decades. A table of
    several pricings is drawn at the one a published figure is compared at (`upstream`, else `counted`), two panels a
    row, so that a panel stays legible at a report's width; the table keeps every pricing."""
    priced, others = "", []
    if "pricing" in table and table["pricing"].nunique() > 1:
        from specter.report.calibration import PREFERRED_PRICINGS

        priced = next((p for p in PREFERRED_PRICINGS if p in set(table["pricing"])), "")
        others = sorted(set(table["pricing"].dropna()) - {priced})
        table = table[table["pricing"] == priced] if priced else table
    fig, panels = panel_grid(table, width=7.0, height=4.2, columns=2)
    for ax, sub, title in panels:
        modes = sorted(sub["memory"].unique()) if "memory" in sub else [None]
        order = ordered(sub["system"])
        width = 0.8 / len(modes)
        for i, mode in enumerate(modes):
            part = (sub if mode is None else sub[sub["memory"] == mode]).set_index("system")
            if not part.index.is_unique:  # several budgets (or K) a system: bars a system cannot show them
                many = part.index[part.index.duplicated()][0]
                raise SpecterError(f"the figure draws one bar a system and comparison, and the table holds "
                                   f"{int((part.index == many).sum())} rows of {many} in {title or 'one panel'} (runs "
                                   "at several budgets or K): aggregate one budget and K per file, or draw the "
                                   "budget experiment's figure (`specter plot budget`)")
            xs = [j - 0.4 + width * (i + 0.5) for j, s in enumerate(order) if s in part.index]
            names = [s for s in order if s in part.index]
            tpot = [float(part.loc[s, "tpot_ms"]) for s in names]
            colors = [SPECTER_COLOR if base(s) == "specter" else OTHER_COLOR for s in names]
            ax.bar(xs, tpot, width=width * 0.95, color=colors, alpha=1.0 if i == 0 else 0.55,
                   label=mode or "TPOT", edgecolor="white")
            ax.scatter(xs, [float(part.loc[s, "lower_bound_tpot_ms"]) for s in names], marker="_", s=180,
                       color="black", zorder=3, label="lower bound" if i == 0 else None)
            top = tpot
            if "tpot_ms_min" in part:  # the spread over prompts: fastest to slowest prompt
                low = [float(part.loc[s, "tpot_ms_min"]) for s in names]
                top = [max(t, float(part.loc[s, "tpot_ms_max"])) for t, s in zip(tpot, names)]
                ax.vlines(xs, low, top, color="#222222", lw=0.8, zorder=4,
                          label="fastest to slowest prompt" if i == 0 else None)
            for x, t, y in zip(xs, tpot, top):
                ax.text(x, y, f"{t:,.0f}" if t >= 100 else f"{t:.3g}", ha="center", va="bottom", fontsize=6,
                        rotation=90)
        ax.set_xticks(range(len(order)), order, rotation=35, ha="right")
        spread = [c for c in ("tpot_ms", "lower_bound_tpot_ms", "tpot_ms_min", "tpot_ms_max") if c in sub]
        if sub["tpot_ms"].max() / max(sub["tpot_ms"].min(), 1e-12) > 30:
            ax.set_yscale("log")
            ax.set_ylim(sub[spread].min().min() / 2, sub[spread].max().max() * 4)
        else:
            headroom(ax, sub[["tpot_ms", "lower_bound_tpot_ms"]].max().max(), 1.35)
        ax.set_ylabel("TPOT (ms, mean over prompts)")
        ax.set_xlabel(figure.xlabel)
        slots = int(sub[sub["system"] == "specter"]["slots_per_layer"].iloc[0]) if "specter" in set(
            sub["system"]) else int(sub["slots_per_layer"].mode().iloc[0])
        ax.set_title(f"{title}\nSpecter: {slots} of {int(sub['experts_per_layer'].iloc[0])} experts per layer "
                     "resident", fontsize=9)
        ax.legend(loc="upper left", fontsize=7, ncol=3)
    said = f", priced {priced}; the table also has {', '.join(others)}" if priced else ""
    finish(fig, f"{figure.title} ({timing}{said})", out)


def _plot_lines(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT per system against `figure.x` (a share is drawn in percent), systems in the fixed order and colours; a
    table with a `memory` column of both comparisons draws the same-memory runs dashed."""
    two = "memory" in table and table["memory"].nunique() > 1
    fig, panels = panel_grid(table, width=5.6, height=5.4 if two else 3.8, x=figure.x)
    percent = figure.x.endswith("share")
    for ax, sub, title in panels:
        colors = palette(sub["system"])
        memories = sorted(sub["memory"].dropna().unique(), reverse=True) if "memory" in sub else [None]
        for system in colors:
            for memory in memories:
                part = sub[(sub["system"] == system) & ((sub["memory"] == memory) if memory else True)]
                if part.empty:
                    continue
                part = part.sort_values(figure.x)
                label = f"{system}, {memory}" if len(memories) > 1 else system
                ax.plot(part[figure.x] * (100 if percent else 1), part["tpot_ms"], marker="o", label=label,
                        color=colors[system], lw=2.2 if system == "specter" else 1.4,
                        linestyle="--" if memory == "same memory" else "-")
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel("TPOT (ms, mean over prompts)")
        if sub["tpot_ms"].max() > 10 * max(sub["tpot_ms"].min(), 1e-12):  # decades apart: a slope stays visible
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if len(memories) > 1:  # many lines: the legend below the axes, clear of them
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
        else:
            ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
    finish(fig, f"{figure.title}\n({timing})", out)


def _plot_grouped_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per `figure.x` (hardware by link generation), one hue per system in the fixed order and colours."""
    fig, panels = panel_grid(table, width=5.6, x=figure.x)
    for ax, sub, title in panels:
        colors = palette(sub["system"])
        order = hardware_order(sub) if figure.x == "hardware" else None
        sns.barplot(data=sub, x=figure.x, y="tpot_ms", hue="system", hue_order=list(colors), palette=colors,
                    order=order, ax=ax, errorbar=None)
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel("TPOT (ms, mean over prompts)")
        if figure.x == "hardware":
            ax.tick_params(axis="x", rotation=25)
        headroom(ax, sub["tpot_ms"].max(), 1.35)
        ax.legend(fontsize=8, title=None, loc="upper center", ncol=2)
        ax.set_title(title, fontsize=9)
    finish(fig, f"{figure.title} ({timing})", out)


def _plot_hit_rate(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Hit rate (%) per caching policy, grouped by Specter's expert slots per layer (the paper's Table 3 policies), the
    paper's figure marked on each bar it publishes one for (DeepSeek-V2-Lite's panel); any other panel says that it is
    not Table 3's configuration."""
    fig, panels = panel_grid(table, width=6.4, height=5.4)
    for ax, sub, title in panels:
        order = [p for p in HIT_POLICIES if p in set(sub["policy"])]
        sns.barplot(data=sub.assign(hit_pct=sub["hit_rate"] * 100), x=figure.x, y="hit_pct", hue="policy",
                    hue_order=order, ax=ax, errorbar=None)
        xs = sorted(sub[figure.x].unique())
        published = "paper_table3" in sub and sub["paper_table3"].notna().any()
        for policy, container in zip(order, ax.containers):
            ax.bar_label(container, fmt="%.0f", fontsize=6)
            for x, bar in zip(xs, container):  # the paper's figure for this bar, where it publishes one
                paper = sub.loc[(sub["policy"] == policy) & (sub[figure.x] == x), "paper_table3"] if published else []
                if len(paper) and pd.notna(paper.iloc[0]):
                    ax.plot(bar.get_x() + bar.get_width() / 2, float(paper.iloc[0]) * 100, marker="_", ms=11, mew=2.2,
                            color="black", zorder=5)
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel("hit rate (% of required experts on the device)")
        ax.set_ylim(0, 119)
        ax.legend(fontsize=7, title=None, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)  # below: the
        # field's policies make the legend as tall as the bars
        said = ("black marks: the paper's Table 3" if published else
                "not Table 3's configuration (DeepSeek-V2-Lite at 6 / 16 / 32 of 64 slots)")
        ax.set_title(f"{title}\n{int(sub['experts_per_layer'].iloc[0])} experts per layer; {said}", fontsize=9)
    finish(fig, f"{figure.title}\n({timing})", out)  # one panel is narrower than the title


def _plot_breakdown(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Stacked bars per system (same slots): the parts of a token's time as shares of its TPOT (the paper's Fig 4
    shows shares), the TPOT itself written beside each bar; one legend for the figure, below the panels."""
    from specter.metrics import BREAKDOWN

    colors = ["#dd8452", "#4c72b0", "#8fb0dd", "#c44e52", "#55a868", "#bbbbbb"]
    same = table[table["memory"] == "same slots"] if "same slots" in set(table["memory"]) else table
    fig, panels = panel_grid(same, width=6.2, height=4.2)
    for ax, sub, title in panels:
        sub = sub.set_index("system").loc[ordered(sub["system"])]
        left = pd.Series(0.0, index=sub.index)
        for part, color in zip(BREAKDOWN, colors):
            share = sub[part] / sub["tpot_ms"] * 100
            ax.barh(sub.index, share, left=left, color=color, label=part, edgecolor="white")
            left = left + share
        for i, tpot in enumerate(sub["tpot_ms"]):
            ax.text(101, i, f"{tpot:,.0f} ms" if tpot >= 100 else f"{tpot:.3g} ms", va="center", fontsize=7)
        for label in ax.get_yticklabels():
            if label.get_text() == "specter":
                label.set_fontweight("bold")
        ax.invert_yaxis()
        ax.set_xlim(0, 118)
        ax.set_xticks(range(0, 101, 20))
        ax.set_xlabel("share of the time per output token (%); right: TPOT, mean over prompts")
        ax.set_title(f"{title}\nsame slots: {int(sub['slots_per_layer'].min())}+ per layer", fontsize=9)
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(BREAKDOWN), fontsize=8, frameon=False)
    fig.suptitle(f"{figure.title} ({timing})", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    save(fig, out)


def _plot_memory(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Stacked bars per system (same slots): the parts of its device memory in GB, the device's memory as a line."""
    parts = ("non_expert_gb", "draft_gb", "kv_gb", "workspace_gb", "expert_slot_gb")
    names = ("non-expert weights (FP16)", "draft", "KV", "workspace", "expert slots")
    colors = ["#4c72b0", "#dd8452", "#55a868", "#bbbbbb", "#8172b3"]
    same = table[table["memory"] == "same slots"] if "same slots" in set(table["memory"]) else table
    fig, panels = panel_grid(same.drop_duplicates(["model", "cost_as", "system"]).assign(dataset=""), width=6.2,
                          height=3.8)
    for ax, sub, title in panels:
        sub = sub.set_index("system").loc[ordered(sub["system"])]
        left = pd.Series(0.0, index=sub.index)
        for part, name, color in zip(parts, names, colors):
            ax.barh(sub.index, sub[part], left=left, color=color, label=name, edgecolor="white")
            left = left + sub[part]
        for i, total in enumerate(sub["total_gb"]):
            ax.text(total, i, f" {total:.3g}", va="center", fontsize=7)
        device = sub["device_gb"].dropna()
        top = float(sub["total_gb"].max()) * 1.3
        on_scale = len(device) and float(device.iloc[0]) <= 2 * top  # a far larger device would flatten the bars
        if on_scale:
            ax.axvline(float(device.iloc[0]), color="black", linestyle="--", linewidth=1,
                       label=f"device ({float(device.iloc[0]):g} GB)")
            top = max(top, float(device.iloc[0]) * 1.1)
        for label in ax.get_yticklabels():
            if label.get_text() == "specter":
                label.set_fontweight("bold")
        ax.invert_yaxis()
        ax.set_xlim(0, top)
        ax.set_xlabel("device memory (GB)")
        slots = int(sub["slots_per_layer"].min())
        off = f"; device {float(device.iloc[0]):g} GB, off scale" if len(device) and not on_scale else ""
        ax.set_title(f"{title}\nsame slots: {slots} per layer{off}", fontsize=9)
        ax.legend(fontsize=6, loc="lower right")
    finish(fig, f"{figure.title} (profile: {', '.join(sorted(same['hardware'].unique()))})", out)


def _plot_routing_entropy(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Left: each layer's entropy of expert use (share of its maximum) per model and prompt set; right: the heatmap of
    expert use per layer of the first model and prompt set."""
    layers = table.drop_duplicates(["model", "dataset", "layer"])
    first = sorted(table[["model", "dataset"]].drop_duplicates().itertuples(index=False, name=None))[0]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 4.4), gridspec_kw={"width_ratios": [1, 1.25]})
    for (model, dataset), sub in layers.groupby(["model", "dataset"], sort=True):
        experts = int(sub["experts_per_layer"].iloc[0])
        left.plot(sub["layer"], sub["entropy_share"], marker="o", markersize=3,
                  label=f"{model} ({experts} experts), {dataset}")
    left.set_ylim(0, 1.05)
    left.axhline(1.0, color="black", linewidth=0.8, linestyle=":")
    left.set_xlabel("MoE layer")
    left.set_ylabel("entropy of expert use / log2(experts)")
    left.set_title("per-layer routing entropy (1: every expert equally used)", fontsize=9)
    left.legend(fontsize=7, loc="lower left")
    sub = table[(table["model"] == first[0]) & (table["dataset"] == first[1])]
    grid = sub.pivot(index="layer", columns="expert", values="use_share")
    sns.heatmap(grid, ax=right, cmap="viridis", cbar_kws={"label": "share of the layer's routed slots"})
    right.set_title(f"expert use per layer: {first[0]}, {first[1]} prompts", fontsize=9)
    right.set_xlabel("expert")
    right.set_ylabel("MoE layer")
    finish(fig, f"{figure.title} (the target's routes on the prompts it decoded)", out)


KINDS = Registry("figure kind", {
         "system_bars": _plot_system_bars, "sim_vs_measured": plot_sim_vs_measured, "calibration": plot_calibration,
         "claims": plot_claims,
         "bars": _plot_bars,
         "grouped_bars": _plot_grouped_bars, "lines": _plot_lines, "k_sweep": _plot_k_sweep, "routing": _plot_routing,
         "working_set": _plot_working_set, "fidelity": plot_fidelity, "hit_rate": _plot_hit_rate,
         "breakdown": _plot_breakdown, "memory": _plot_memory,
         "routing_entropy": _plot_routing_entropy, "routing_locality": plot_routing_locality},
                 fix="name one in the experiment's Figure(kind=...)")
