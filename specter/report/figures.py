"""One figure per experiment, drawn from its tidy table (seaborn on matplotlib's Agg backend).

Every panel is one (model, dataset); times are labelled with their unit and, when simulated, with "simulated on
<hardware profile>" (measured times say "measured on"). Figures are PNGs at 150 dpi sized for the report page.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specter.errors import SpecterError  # noqa: E402


def _timing_label(df: pd.DataFrame) -> str:
    """'simulated on a100-40gb-pcie4' (or several profiles / measured), for titles."""
    if "hardware" not in df:
        return ""
    kinds = []
    for simulated, part in df.groupby("simulated"):
        names = sorted(part["hardware"].unique())
        hw = ", ".join(names) if len(names) <= 2 else "each profile shown"
        kinds.append(f"{'simulated' if bool(simulated) else 'measured'} on {hw}")
    return "; ".join(kinds)


def _panels(df: pd.DataFrame, width: float = 5.2, height: float = 3.8, sharey: bool = False):
    """A row of axes, one per (model, dataset): [(ax, subset, title)], and the figure."""
    keys = sorted(df[["model", "dataset"]].drop_duplicates().itertuples(index=False, name=None))
    if not keys:
        raise SpecterError("the table is empty: nothing to draw")
    fig, axes = plt.subplots(1, len(keys), figsize=(width * len(keys), height), squeeze=False, sharey=sharey)
    out = []
    for ax, (model, dataset) in zip(axes[0], keys):
        sub = df[(df["model"] == model) & (df["dataset"] == dataset)]
        out.append((ax, sub, f"{model}, {dataset} prompts"))
    return fig, out


def _finish(fig, title: str, out: str | Path) -> None:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=150)
    plt.close(fig)


def _bars_with_bound(ax, sub: pd.DataFrame, x: str, order: list | None = None) -> None:
    """TPOT bars per `x`, the run's lower bound as a black tick on each bar."""
    order = order or list(sub[x])
    sns.barplot(data=sub, x=x, y="tpot_ms", order=order, ax=ax, color="#4c72b0", errorbar=None)
    lb = sub.set_index(x)["lower_bound_tpot_ms"]
    ax.scatter(range(len(order)), [lb.get(o) for o in order], marker="_", s=400, color="black", zorder=3,
               label="lower bound")
    ax.set_ylabel("TPOT (ms, median over prompts)")
    ax.tick_params(axis="x", rotation=35)
    for label in ax.get_xticklabels():
        label.set_ha("right")
    tpot = sub.set_index(x)["tpot_ms"]
    for i, o in enumerate(order):  # the value on each bar: differences can be small next to the bars' height
        ax.text(i, float(tpot[o]), f"{float(tpot[o]):.3f}", ha="center", va="bottom", fontsize=7)
    _headroom(ax, sub[["tpot_ms", "lower_bound_tpot_ms"]].max().max())
    ax.legend(loc="upper left", fontsize=8)


def _headroom(ax, top: float, share: float = 1.3) -> None:
    """Room above the tallest bar for value labels and the legend."""
    ax.set_ylim(0, top * share)


def plot(name: str, table: pd.DataFrame, out: str | Path) -> None:
    """Draw experiment `name`'s figure from its table to `out` (PNG), by its registry entry's figure kind."""
    from specter import experiments

    figure = experiments.get(name).figure
    if figure.kind not in KINDS:
        raise SpecterError(f"experiment {name!r}: no figure kind {figure.kind!r}; kinds: {', '.join(KINDS)}")
    sns.set_theme(style="whitegrid", context="paper")
    KINDS[figure.kind](figure, table, out, _timing_label(table))


def _plot_k_sweep(figure, table: pd.DataFrame, out, timing: str) -> None:
    fig, panels = _panels(table)
    for ax, sub, title in panels:
        fixed = sub[sub["k_setting"].str.fullmatch(r"\d+")].sort_values("k")
        ax.plot(fixed["k"], fixed["tpot_ms"], marker="o", label="TPOT")
        ax.plot(fixed["k"], fixed["lower_bound_tpot_ms"], ls="--", color="gray", label="lower bound")
        styles = iter([("*", "crimson", 180), ("D", "darkorange", 70), ("P", "purple", 110)])
        for setting, part in sub[~sub["k_setting"].str.fullmatch(r"\d+")].groupby("k_setting"):
            marker, color, size = next(styles)
            ax.scatter(part["k"], part["tpot_ms"], marker=marker, s=size, color=color, zorder=4,
                       label=f"governor ({setting}): K = {int(part['k'].iloc[0])}")
        ax.set_xlabel("draft window K (tokens)")
        ax.set_ylabel("TPOT (ms, median over prompts)")
        twin = ax.twinx()
        twin.plot(fixed["k"], fixed["acceptance_rate"], marker="s", color="seagreen", label="acceptance rate")
        twin.set_ylabel("acceptance rate")
        twin.set_ylim(0, 1.05)
        twin.grid(False)
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = twin.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")
        ax.set_title(title, fontsize=9)
    _finish(fig, f"{figure.title} ({timing})", out)


def _plot_routing(figure, table: pd.DataFrame, out, timing: str) -> None:
    fig, panels = _panels(table)
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
    _finish(fig, figure.title, out)


def _plot_working_set(figure, table: pd.DataFrame, out, timing: str) -> None:
    fig, panels = _panels(table)
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
    _finish(fig, figure.title, out)


def _plot_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per `figure.x`, each with its lower bound."""
    fig, panels = _panels(table)
    for ax, sub, title in panels:
        sub = sub.sort_values(figure.sort) if figure.sort else sub
        _bars_with_bound(ax, sub, figure.x)
        ax.set_xlabel(figure.xlabel)
        ax.set_title(title, fontsize=9)
    _finish(fig, f"{figure.title} ({timing})", out)


def _plot_system_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per system, fastest first, each with its lower bound; the budget in the panel title."""
    fig, panels = _panels(table, width=6.0)
    for ax, sub, title in panels:
        order = list(sub.sort_values("tpot_ms")["system"])
        _bars_with_bound(ax, sub, "system", order)
        ax.set_xlabel(figure.xlabel)
        share = sub["resident_share"].mode().iloc[0]  # the budget (resident keeps every expert)
        ax.set_title(f"{title}; budget: {share:.0%} of each layer's experts", fontsize=9)
    _finish(fig, f"{figure.title} ({timing})", out)


def _plot_lines(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT per system against `figure.x` (a share, drawn in percent)."""
    fig, panels = _panels(table, width=5.6)
    for ax, sub, title in panels:
        for system, part in sub.groupby("system"):
            part = part.sort_values(figure.x)
            ax.plot(part[figure.x] * 100, part["tpot_ms"], marker="o", label=system)
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel("TPOT (ms, median over prompts)")
        ax.legend(fontsize=8)
        ax.set_title(title, fontsize=9)
    _finish(fig, f"{figure.title} ({timing})", out)


def _plot_grouped_bars(figure, table: pd.DataFrame, out, timing: str) -> None:
    """TPOT bars per `figure.x`, one hue per system."""
    fig, panels = _panels(table, width=5.6)
    for ax, sub, title in panels:
        sns.barplot(data=sub, x=figure.x, y="tpot_ms", hue="system", ax=ax, errorbar=None)
        ax.set_xlabel(figure.xlabel)
        ax.set_ylabel("TPOT (ms, median over prompts)")
        if figure.x == "hardware":
            ax.tick_params(axis="x", rotation=25)
        _headroom(ax, sub["tpot_ms"].max(), 1.35)
        ax.legend(fontsize=8, title=None, loc="upper center", ncol=2)
        ax.set_title(title, fontsize=9)
    _finish(fig, f"{figure.title} ({timing})", out)


def _plot_fidelity(figure, table: pd.DataFrame, out, timing: str) -> None:
    table = table.assign(draft=[f"{m} INT{b} g{g}" for m, b, g in
                                zip(table["method"], table["bits"], table["group_size"])])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    shares = table.drop_duplicates("draft").set_index("draft")[["expert_exact", "expert_partial", "expert_none"]]
    shares.mul(100).plot.bar(stacked=True, ax=left, color=["#4c72b0", "#dd8452", "#c44e52"], rot=0)
    left.set_ylabel("(token, layer) pairs (%)")
    left.set_xlabel("draft")
    left.legend(["exact set", "partial overlap", "no overlap"], fontsize=8, loc="lower right")
    left.set_title("draft expert set vs the target's", fontsize=9)
    for draft, part in table.groupby("draft"):
        right.plot(part["k"], part["acceptance_rate"], marker="o", label=draft)
    right.set_xlabel("draft window K (tokens)")
    right.set_ylabel("greedy acceptance rate")
    right.set_ylim(0, 1.05)
    right.legend(fontsize=8)
    right.set_title("acceptance on the target's committed prefix", fontsize=9)
    models = ", ".join(sorted(table["model"].unique()))
    _finish(fig, f"{figure.title} ({models}, {', '.join(sorted(table['dataset'].unique()))} prompts)", out)


KINDS = {"system_bars": _plot_system_bars, "bars": _plot_bars, "grouped_bars": _plot_grouped_bars,
         "lines": _plot_lines, "k_sweep": _plot_k_sweep, "routing": _plot_routing, "working_set": _plot_working_set,
         "fidelity": _plot_fidelity}
