"""The figures' drawing kit: the systems' fixed order and colours, one panel per (model, priced-at architecture,
prompt set, pricing), TPOT bars with their lower bound, and the writing of a figure (`specter.report.figures` draws
each experiment's figure with it). matplotlib runs on its Agg backend: no display is needed.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from specter.errors import SpecterError  # noqa: E402
from specter.runspec import PRICINGS  # noqa: E402
from specter.system_names import system_colours  # noqa: E402

#: Specter's colour (`System.colour`) where a figure marks its bars among the others'
SPECTER_COLOR, OTHER_COLOR = system_colours()["specter"], "#4c72b0"
#: colours for a system that names none (`System.colour`), chosen by its name
_SPARE = ("#001c7f", "#b1400d", "#12711c", "#591e71", "#592f0d", "#a23582", "#3c3c3c", "#b8850a")


def palette(systems) -> dict[str, str]:
    """{system: colour}: each system's own (`System.colour`; a governor's row its system's), the same in every
    figure, or a spare one by its name."""
    import hashlib

    colours = system_colours()
    return {s: colours.get(base(s)) or _SPARE[hashlib.sha256(base(s).encode()).digest()[0] % len(_SPARE)]
            for s in ordered(systems)}


def hardware_order(sub: pd.DataFrame) -> list[str]:
    """The profiles in a panel by link generation (PCIe 3, 4, 5; a link the name does not date last), then by
    pinned host-to-device bandwidth, then by name."""
    import re

    def key(row) -> tuple:
        link = str(row.get("link") or "")
        gen = re.search(r"PCIe\s*(\d+)", link, re.I)
        gbps = row.get("link_gbps")
        return (int(gen[1]) if gen else 99, float(gbps) if pd.notna(gbps) else float("inf"), str(row["hardware"]))

    rows = sub.drop_duplicates("hardware").to_dict("records")
    return [r["hardware"] for r in sorted(rows, key=key)]


def base(system: str) -> str:
    """The system of a row: `specter` for `specter (K auto)`, Specter at its governor's K."""
    return str(system).split(" (K ")[0]


def ordered(systems) -> list[str]:
    """The rows in the systems' order (`specter.system_names.system_order`; a name no system has after, by name), a
    system's governor rows right after it."""
    from specter.system_names import system_order

    order = system_order()
    return sorted(set(systems), key=lambda s: (order.index(base(s)) if base(s) in order else len(order), s))


def shapes(model: str, cost_as) -> str:
    """What priced a panel's runs: 'Phi-3.5-MoE shapes, routing from smollm2-moe-16x2', or the model's own."""
    if isinstance(cost_as, str) and cost_as:
        return f"{cost_as} shapes, routing from {model}"
    return f"{model} (its own shapes)"


def panel_grid(df: pd.DataFrame, width: float = 5.2, height: float = 3.8, sharey: bool = False, columns: int = 3,
               x: str | None = None):
    """A grid of axes, one per (model, priced-at architecture, dataset, pricing, dispatch time): [(ax, subset, title)],
    and the figure. A panel's title names what priced its runs, its prompt set and, where all its runs share one, the
    hardware profile (the cases of one figure can run on different profiles; the figure's title says simulated or
    measured). A table of several pricings or dispatch times (sweep axes) gets a panel per value, unless `x`, the
    figure's x axis, is that column."""
    df = df.assign(cost_as=df["cost_as"].fillna("")) if "cost_as" in df else df.assign(cost_as="")
    # a table of several pricings (`--pricing` as an axis) gets a panel per pricing, in `PRICINGS`' order
    several = "pricing" in df and df["pricing"].nunique() > 1 and x != "pricing"
    df = df.assign(pricing=df["pricing"].fillna("") if several else "")
    dispatched = "dispatch_us" in df and df["dispatch_us"].nunique() > 1 and x != "dispatch_us"
    df = df.assign(_panel_dispatch=df["dispatch_us"].astype(float) if dispatched else 0.0)
    rank = {p: i for i, p in enumerate(PRICINGS)}
    keys = sorted(df[["model", "cost_as", "dataset", "pricing", "_panel_dispatch"]].drop_duplicates().itertuples(
        index=False, name=None), key=lambda k: (k[0], k[1], k[2], rank.get(k[3], len(rank)), k[3], k[4]))
    if not keys:
        raise SpecterError("the table is empty: nothing to draw")
    ncols = min(columns, len(keys))
    nrows = -(-len(keys) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False, sharey=sharey)
    out = []
    for ax, (model, cost_as, dataset, pricing, dispatch) in zip(axes.flat, keys):
        sub = df[(df["model"] == model) & (df["cost_as"] == cost_as) & (df["dataset"] == dataset)
                 & (df["pricing"] == pricing) & (df["_panel_dispatch"] == dispatch)].drop(columns="_panel_dispatch")
        # wrapped to the panel's width (about 11 characters an inch at the panels' font size)
        hardware = sorted(sub["hardware"].dropna().astype(str).unique()) if "hardware" in sub else []
        on = f", on {hardware[0]}" if len(hardware) == 1 else ""
        prompts = f", {dataset} prompts" if dataset else ""  # '': a panel over every prompt set
        priced = f", priced {pricing}" if pricing else ""
        priced += f", {dispatch:g} us a dispatched kernel" if dispatched else ""
        out.append((ax, sub, textwrap.fill(f"{shapes(model, cost_as)}{prompts}{on}{priced}", int(width * 11))))
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    return fig, out


def finish(fig, title: str, out: str | Path) -> None:
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save(fig, out)


def save(fig, out: str | Path) -> None:
    """Write `fig` to `out` as a PNG, whole or not at all (a full disk leaves no empty or cut figure), and close it."""
    from specter.io import atomic_write

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(out, lambda f: fig.savefig(f, dpi=150, format="png"), binary=True)
    finally:
        plt.close(fig)


def bars_with_bound(ax, sub: pd.DataFrame, x: str, order: list | None = None) -> None:
    """TPOT bars per `x`, the run's lower bound as a black tick on each bar."""
    order = order or list(sub[x])
    sns.barplot(data=sub, x=x, y="tpot_ms", order=order, ax=ax, color="#4c72b0", errorbar=None)
    lb = sub.set_index(x)["lower_bound_tpot_ms"]
    ax.scatter(range(len(order)), [lb.get(o) for o in order], marker="_", s=400, color="black", zorder=3,
               label="lower bound")
    ax.set_ylabel("TPOT (ms, mean over prompts)")
    ax.tick_params(axis="x", rotation=35)
    for label in ax.get_xticklabels():
        label.set_ha("right")
    tpot = sub.set_index(x)["tpot_ms"]
    for i, o in enumerate(order):  # the value on each bar: differences can be small next to the bars' height
        ax.text(i, float(tpot[o]), f"{float(tpot[o]):.3f}", ha="center", va="bottom", fontsize=7)
    headroom(ax, sub[["tpot_ms", "lower_bound_tpot_ms"]].max().max())
    ax.legend(loc="upper left", fontsize=8)


def headroom(ax, top: float, share: float = 1.3) -> None:
    """Room above the tallest bar for value labels and the legend."""
    ax.set_ylim(0, top * share)
