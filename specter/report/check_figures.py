"""The figures that hold the suite against what it did not compute: a draft's fidelity to its target, the published
figures beside the suite's (`calibration`), the paper's claims judged (`claims`), and the live engine's measured times
beside their simulated twins (`sim_vs_measured`). Drawn with the kit of `specter.report.plotting`;
`specter.report.figures` dispatches to them.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from specter.report.claims import LEVEL
from specter.report.plotting import OTHER_COLOR, SPECTER_COLOR, finish, headroom, ordered, panel_grid


def plot_fidelity(figure, table: pd.DataFrame, out, timing: str) -> None:
    # one draft per (model, method, bits, group): two models' drafts of one method are two bars and two lines
    table = table.assign(draft=[f"{model}\n{m} INT{b} g{g}" for model, m, b, g in
                                zip(table["model"], table["method"], table["bits"], table["group_size"])])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    shares = table.drop_duplicates("draft").set_index("draft")[["expert_hard", "expert_soft", "expert_mismatch"]]
    shares.mul(100).plot.bar(stacked=True, ax=left, color=["#4c72b0", "#8fb0dd", "#c44e52"], rot=0)
    left.set_ylabel("(token, layer) pairs (%)")
    left.set_xlabel("draft")
    left.set_ylim(0, 122)  # room above the bars for the legend
    left.set_yticks(range(0, 101, 20))
    left.legend(["hard: same experts, same order", "soft: same set, other order", "mismatch: another set"],
                fontsize=7, loc="upper center", ncol=3)
    left.set_title("draft's ranked experts vs the target's (the paper's Fig 6)", fontsize=9)
    for draft, part in table.groupby("draft"):
        part = part.sort_values("k")
        right.plot(part["k"], part["acceptance_rate"], marker="o", label=draft.replace("\n", " "))
    right.set_xlabel("draft window K (tokens)")
    right.set_ylabel("greedy acceptance rate (accepted / checked)")
    right.set_ylim(0, 1.05)
    right.legend(fontsize=8)
    right.set_title("acceptance on the target's committed prefix", fontsize=9)
    models = ", ".join(sorted(table["model"].unique()))
    finish(fig, f"{figure.title} ({models}, {', '.join(sorted(table['dataset'].unique()))} prompts)", out)


def plot_calibration(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Per published figure the suite could compute, the suite's over the paper's on a log axis, grouped by paper,
    with the 0.8-1.25 band shaded; the rows without a suite figure are counted in the title."""
    from specter.report.calibration import BAND

    shown = table[table["suite_over_published"].notna()].reset_index(drop=True)
    if shown.empty:  # say so in the figure, with what the papers publish
        fig, ax = plt.subplots(figsize=(9, 3))
        ax.axis("off")
        ax.text(0, 1, f"No run of this workflow matches a published configuration ({len(table)} figures listed in "
                      "results/tables/calibration.csv, each with why).\nconfig/paper.yaml runs more of them.",
                va="top", fontsize=9, wrap=True)
        finish(fig, figure.title, out)
        return
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(shown) + 1.8))
    colors = {paper: c for paper, c in zip(dict.fromkeys(shown["paper"]), sns.color_palette("deep"))}
    ys = range(len(shown))
    ax.axvspan(*BAND, color="#dddddd", zorder=0)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.scatter(shown["suite_over_published"], list(ys), c=[colors[p] for p in shown["paper"]], zorder=3, s=18)
    ax.set_yticks(list(ys), [f"{i} ({m})" for i, m in zip(shown["id"], shown["metric"])], fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"suite / published (suite {timing}; grey: {BAND[0]}-{BAND[1]})")
    for paper, color in colors.items():
        ax.scatter([], [], c=[color], label=paper, s=18)
    ax.legend(fontsize=7, loc="lower right")
    missing = len(table) - len(shown)
    finish(fig, f"{figure.title} ({missing} published figures not run here: see the table)", out)


def plot_sim_vs_measured(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Per system, its measured TPOT beside its simulated twin's, the ratio (measured over simulated) above each pair;
    the title says where each was timed (measured on the live device; simulated on its measured profile)."""
    tpot = table[table["part"] == "TPOT"]
    fig, panels = panel_grid(tpot, width=5.6)
    for ax, sub, title in panels:
        order = ordered(sub["system"])
        long = pd.concat([sub.assign(time="measured", ms=sub["measured_ms"]),
                          sub.assign(time="simulated twin", ms=sub["simulated_ms"])])
        sns.barplot(data=long, x="system", y="ms", hue="time", order=order, hue_order=["measured", "simulated twin"],
                    palette=[SPECTER_COLOR, OTHER_COLOR], ax=ax, errorbar=None)
        ratio = sub.set_index("system")["measured_over_simulated"]
        top = long["ms"].max()
        for i, system in enumerate(order):
            if pd.notna(ratio.get(system)):
                ax.text(i, top * 1.05, f"{float(ratio[system]):.2f}x", ha="center", fontsize=7)
        ax.set_xlabel("system (above: measured over simulated)")
        ax.set_ylabel("TPOT (ms, mean over prompts)")
        ax.tick_params(axis="x", rotation=25)
        headroom(ax, top, 1.6)  # the legend sits in one row above the ratios, clear of them
        ax.legend(fontsize=8, title=None, loc="upper center", ncol=2)
        ax.set_title(title, fontsize=9)
    profiles = ", ".join(sorted(tpot["simulated_on"].astype(str).unique()))
    finish(fig, f"{figure.title}\n({timing}; twins simulated on {profiles})", out)


#: a verdict's colour in the claims figure
VERDICT_COLORS = {"reproduced": "#55a868", "not reproduced": "#c44e52", "inconclusive": "#dd8452",
                  "not run": "#999999"}


def plot_claims(figure, table: pd.DataFrame, out, timing: str) -> None:
    """Each claim of the paper (rows beside them left out): the suite's figure over the paper's, with its bootstrap
    interval, on a log axis; the band a `value` claim must lie in shaded, the line an `at_least` claim must clear
    dashed; coloured by verdict, and a claim that did not run written where its point would be."""
    claims = table[table["beside_of"].fillna("").astype(str) == ""].reset_index(drop=True)
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(claims) + 1.6))
    ax.axvspan(0.8, 1.25, color="#55a868", alpha=0.12, lw=0, label="within 0.8-1.25x of the paper's figure")
    ax.axvline(1.0, color="black", lw=0.8, ls="--")
    y = list(range(len(claims)))[::-1]
    for yi, (_, row) in zip(y, claims.iterrows()):
        color = VERDICT_COLORS.get(row["verdict"], "#999999")
        if pd.isna(row["suite"]):
            ax.text(1.0, yi, "not run in this configuration", va="center", ha="center", fontsize=7, color=color)
            continue
        paper = float(row["paper"])
        point, low, high = (float(row[c]) / paper for c in ("suite", "low", "high"))
        ax.plot([max(low, 1e-3), max(high, 1e-3)], [yi, yi], color=color, lw=2.4, solid_capstyle="round")
        ax.plot(max(point, 1e-3), yi, "o", color=color, ms=6, zorder=3)
        ax.text(1.02, yi, f"{row['verdict']}", transform=ax.get_yaxis_transform(), va="center", fontsize=7,
                color=color)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r['id']} ({r['rule'].replace('_', ' ')} {float(r['paper']):g})"
                        for _, r in claims.iterrows()], fontsize=8)
    ax.set_xscale("log")
    ticks = [t for t in (0.01, 0.03, 0.1, 0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0) if ax.get_xlim()[0] <= t
             <= ax.get_xlim()[1]]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("the suite's figure over the paper's (log scale; 1: the paper's figure; an at-least claim holds "
                  "at 1 or right of it)")
    ax.legend(fontsize=7, loc="lower right")
    note = f"{timing}; " if timing else ""
    finish(fig, f"{figure.title} ({note}bars: {int(LEVEL * 100)}% bootstrap intervals over prompts)", out)
