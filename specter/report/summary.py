"""`specter summary`: the headline numbers of a results tree, written as one Markdown file by the workflow.

Quote this file rather than numbers copied by hand. It reads only what the workflow
wrote (the experiments' tables, the model cards, the drafts' files), prints no wall-clock time and no date, and orders
every row, so two reproductions of the same commit write the same bytes; its hashes (each model's `weights_sha256`,
each draft's and each table's sha256) say at a glance whether two trees agree.

Sections, each present when its table is: the models and drafts, the tables, the paper's claims (this run's verdicts,
the README's run's beside), `main` (every system's TPOT, its lower
bound and its TPOT over Specter's, per case, prompt set and comparison), Specter's TPOT over its lower bound beside
each baseline's, `ablation` (its arms in order, with the hit rates), `k_sweep` (each governor's K against the best
fixed K), `sensitivity` (greedy against sampling) and `calibration` (each published figure beside the suite's).

The README's tables and the report's front page are `specter.report.readme`'s.
"""

from __future__ import annotations

import hashlib
import math
import subprocess
import textwrap
from pathlib import Path

import pandas as pd

from specter.errors import SpecterError
from specter.experiments import GOVERNORS


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _commit(root: Path) -> str:
    """The checkout's commit, with `+ uncommitted changes` when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "."], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" + uncommitted changes" if dirty else "")


def _num(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{float(x):.{digits}f}"


def fmt_ms(x) -> str:
    """A time in ms as the summary prints it: four significant digits (0.2134, 207.9, 1814)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return ""
    return f"{float(x):.4g}"


def _markdown(rows: list[list[str]], header: list[str], tight: bool = False) -> list[str]:
    """A markdown table (a `|` or a backtick within a cell escaped, a cell that is one code span kept as it is, a line
    break or other control character written as its escape, so that a cell stays one cell of one line); `tight`: no
    padding around the cells (a wide table within the README's line length)."""
    bar, rule = ("|", "---|") if tight else (" | ", " --- |")
    edge = "|" if tight else "| "

    def cell(c) -> str:
        text = str(c)
        if not text.isprintable():
            text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
        code = len(text) > 1 and text[0] == text[-1] == "`" and "`" not in text[1:-1]  # a code span the suite made
        return text.replace("|", "\\|") if code else text.replace("|", "\\|").replace("`", "\\`")

    out = [edge + bar.join(header) + edge[::-1], "|" + rule * len(header)]
    out += [edge + bar.join(cell(c) for c in row) + edge[::-1] for row in rows]
    return out + [""]


def _system_key(system: str) -> tuple[int, str]:
    """A row's place: its system's (`specter.system_names.system_order`; its run at a governor's K, `specter (K
    auto)`, right after it)."""
    from specter.system_names import system_order

    base = system.split(" (K ")[0]
    return (system_order().index(base) if base in system_order() else len(system_order()), system)


#: the columns each section reads (a table without one is refused by name); `cost_as` and `memory` default
NEEDS = {
    "main": ("model", "dataset", "hardware", "simulated", "system", "k", "slots_per_layer", "tpot_ms",
             "lower_bound_tpot_ms", "hit_rate", "speedup_of_specter"),
    "ablation": ("model", "dataset", "arm_index", "arm", "slots_per_layer", "tpot_ms", "lower_bound_tpot_ms",
                 "hit_rate"),
    "k_sweep": ("model", "dataset", "hardware", "k_setting", "k", "tpot_ms", "n"),
    "sensitivity": ("model", "dataset", "temperature", "system", "tpot_ms", "speedup_of_specter"),
    "calibration": ("paper", "id", "where", "architecture", "hardware", "system", "configuration", "metric",
                    "published", "suite", "suite_over_published", "reason"),
    "claims": ("id", "short", "verdict", "paper", "suite", "low", "high", "unit", "beside_of"),
}


def _read(path: Path) -> pd.DataFrame | None:
    """A section's table, checked to hold the columns the section reads, or None where it was not written."""
    from specter.report.tablefile import read_table

    if not path.is_file():
        return None
    df = read_table(path)
    if df.empty:  # `specter aggregate` writes no table without rows
        raise SpecterError(f"{path} has a header and no rows; write it again with `specter aggregate` (or rerun the "
                           "workflow)")
    missing = [c for c in NEEDS[path.stem] if c not in df]
    if missing:
        raise SpecterError(f"{path} lacks the column(s) {', '.join(missing)}; it was written by another version of "
                           "the suite: write it again with `specter aggregate` (or rerun the workflow)")
    _its_own(path, df)
    return df.assign(**{c: df[c].fillna("") if c in df else "" for c in ("cost_as",)},
                     **({"memory": "same slots"} if "memory" not in df else {}))


def _where(row) -> str:
    """A case's name as the tables give it: the model, and the architecture its ops are priced at."""
    if isinstance(row["cost_as"], str) and row["cost_as"]:
        return f"{row['model']} priced as {row['cost_as']}"
    return f"{row['model']} at its own shapes"


def _models(results: Path) -> list[str]:
    from specter.io import json_strict
    from specter.models.integrity import model_hash

    rows = []
    for config in sorted((results / "models").glob("*/config.json")):
        card_path, card = config.parent / "model_card.json", {}
        if card_path.is_file():
            try:
                card = json_strict(card_path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:  # a key given twice included
                raise SpecterError(f"{card_path} is not a model card ({err}); build the model again") from None
            if not isinstance(card, dict):
                raise SpecterError(f"{card_path} is not a model card (not a JSON object); build the model again")
        digest = model_hash(config.parent)  # the files as they are now (cached by size and time after the first)
        if card.get("weights_sha256", digest) != digest:
            raise SpecterError(f"{card_path} gives weights_sha256 {str(card['weights_sha256'])[:64]!r}, and the "
                               f"model's config and weights hash to {digest}: they changed since the build; build "
                               "the model again")
        stands_in = card.get("stands_in_for", "")
        if not (isinstance(stands_in, str) and stands_in.isprintable() and "`" not in stands_in):
            raise SpecterError(f"{card_path}: stands_in_for is {stands_in!r:.60}, and a card names a model in one line "
                               "of text; build the model again")
        ratio = card.get("perplexity_ratio")  # per held-out corpus: {prose: x, code: y}
        values = list(ratio.values()) if isinstance(ratio, dict) else [ratio]
        if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                 and 0 < v < 1e6) for v in values) or (isinstance(ratio, dict) and not all(
                                     isinstance(c, str) and c.isprintable() for c in ratio)):
            raise SpecterError(f"{card_path}: perplexity_ratio is {ratio!r:.80}, and a card gives each held-out "
                               "corpus's perplexity over the dense model's, a positive number; build the model again")
        ratio = ", ".join(f"{c} {_num(v, 2)}" for c, v in sorted(ratio.items())) if isinstance(ratio, dict) else \
            _num(ratio, 2)
        rows.append([config.parent.name, stands_in, ratio, f"`{digest}`"])
    for draft in sorted((results / "drafts").glob("*/*/experts.safetensors")):
        rows.append([f"{draft.parent.parent.name} / {draft.parent.name}", "draft", "", f"`{_sha256(draft)}`"])
    if not rows:
        return []
    return ["## Models and drafts", "",
            "Each model's `weights_sha256` (over its config and weights, as its card and every draft's sidecar give "
            "it); each draft's `experts.safetensors`.", "",
            *_markdown(rows, ["model", "stands in for", "perplexity / dense", "sha256"])]


def _its_own(path: Path, df: pd.DataFrame) -> None:
    """Refuse another experiment's table under an experiment's name (it would be read as that one's)."""
    from specter.experiments import EXPERIMENTS
    from specter.report.tablefile import its_own_table

    if path.stem in EXPERIMENTS:
        try:
            its_own_table(path.stem, EXPERIMENTS[path.stem].table, df)
        except SpecterError as err:
            raise SpecterError(f"{path}: {err}") from None


def _tables(tables: list[Path]) -> list[str]:
    """The tables' listing, each checked to be the table its name says."""
    from specter.report.tablefile import read_table

    rows = []
    for p in tables:
        df = read_table(p)
        _its_own(p, df)
        rows.append([p.name, str(len(df)), f"`{_sha256(p)}`"])
    return ["## Tables", "", *_markdown(rows, ["table", "rows", "sha256"])]


def _main(df: pd.DataFrame) -> list[str]:
    out = ["## main: every system, per case", "",
           "TPOT is the mean over prompts (ms; the paper reports means); `LB` its run's lower bound; `TPOT / LB` how "
           "far above the bound it runs; `over Specter` its TPOT over Specter's in the same comparison (above 1: "
           "Specter is faster).", ""]
    df = df.assign(pricing=df["pricing"].fillna("fused") if "pricing" in df else "fused")
    scope = ["model", "cost_as", "dataset", "hardware", "pricing", "memory"]
    for key, group in df.groupby(scope, dropna=False, sort=True):
        row = dict(zip(scope, key))
        sim = "simulated" if bool(group["simulated"].all()) else "measured"
        out += [f"### {_where(row)}, {row['dataset']}, {row['memory']} ({sim} on {row['hardware']}, priced "
                f"{row['pricing']})", ""]
        rows = []
        for _, r in sorted(group.iterrows(), key=lambda kv: _system_key(kv[1]["system"])):
            ratio = r["tpot_ms"] / r["lower_bound_tpot_ms"] if r["lower_bound_tpot_ms"] else float("nan")
            rows.append([r["system"], str(int(r["slots_per_layer"])), "" if pd.isna(r["k"]) else str(int(r["k"])),
                         fmt_ms(r["tpot_ms"]), fmt_ms(r["lower_bound_tpot_ms"]), _num(ratio, 2),
                         _num(r.get("hit_rate"), 3), _num(r.get("speedup_of_specter"), 2)])
        out += _markdown(rows, ["system", "slots", "K", "TPOT", "LB", "TPOT / LB", "hit rate", "over Specter"])
        case = df[(df["model"] == row["model"]) & (df["cost_as"] == row["cost_as"]) & (df["dataset"] == row["dataset"])
                  & (df["pricing"] == row["pricing"])]
        absent = sorted(set(case["system"]) - set(group["system"]), key=_system_key)
        if absent:  # a run that does not fit its budget writes no record (its log says why)
            out += [f"No record (does not fit this comparison's device memory): {', '.join(absent)}.", ""]
    return out


def _ablation(df: pd.DataFrame) -> list[str]:
    out = ["## ablation", ""]
    rows = []
    for _, r in df.sort_values(["model", "cost_as", "dataset", "arm_index"]).iterrows():
        rows.append([_where(r), r["dataset"], r["arm"], str(int(r["slots_per_layer"])), fmt_ms(r["tpot_ms"]),
                     fmt_ms(r["lower_bound_tpot_ms"]), _num(r["hit_rate"], 3)])
    return out + _markdown(rows, ["case", "prompt set", "arm", "slots", "TPOT", "LB", "hit rate"])


def _k_sweep(df: pd.DataFrame) -> list[str]:
    out = ["## k_sweep: the governors against the best fixed K", "",
           "Each governor's run beside the fastest fixed-K run of the same case; `over best` is its TPOT over that "
           "one's (TPOT: the mean over prompts; `online`'s K is each prompt's median window, so it may list several).",
           ""]
    rows = []
    for key, group in df.groupby(["model", "cost_as", "dataset", "hardware"], dropna=False, sort=True):
        fixed = group[~group["k_setting"].astype(str).isin(GOVERNORS)]
        if fixed.empty:
            continue
        best = fixed.loc[fixed["tpot_ms"].idxmin()]
        where = _where(dict(zip(["model", "cost_as"], key[:2])))
        rows.append([where, key[2], "best fixed", str(int(best["k"])), fmt_ms(best["tpot_ms"]), ""])
        for governor in GOVERNORS:
            sub = group[group["k_setting"].astype(str) == governor]
            if sub.empty:
                continue
            # one governor run; `online` re-chooses K every cycle, so its prompts can fall in several K rows
            tpot = float((sub["tpot_ms"] * sub["n"]).sum() / sub["n"].sum())
            ks = "/".join(str(int(k)) for k in sorted(sub["k"].dropna().unique()))
            rows.append([where, key[2], governor, ks, fmt_ms(tpot), _num(tpot / best["tpot_ms"], 3)])
    return out + _markdown(rows, ["case", "prompt set", "K setting", "K", "TPOT", "over best"])


def _sensitivity(df: pd.DataFrame) -> list[str]:
    out = ["## sensitivity: greedy against sampling", "",
           "Each system's TPOT (mean over prompts) at each temperature (0: greedy; above 0, rejection sampling, drawn "
           "live), the acceptance rate and window utilization beside Specter's, and each system's TPOT over Specter's.",
           ""]
    rows = []
    for _, r in df.sort_values(["model", "cost_as", "dataset", "temperature"], kind="stable").iterrows():
        rows.append([_where(r), r["dataset"], f"{float(r['temperature']):g}", r["system"], fmt_ms(r["tpot_ms"]),
                     _num(r.get("acceptance_rate"), 3), _num(r.get("window_utilization"), 3),
                     _num(r.get("speedup_of_specter"), 2)])
    rows.sort(key=lambda row: (row[0], row[1], float(row[2]), _system_key(row[3])))
    return out + _markdown(rows, ["case", "prompt set", "T", "system", "TPOT", "acceptance", "window use",
                                  "over Specter"])


def _calibration(df: pd.DataFrame) -> list[str]:
    from specter.report.calibration import BAND, log_ratio_stats

    median, largest = log_ratio_stats(df)
    comparable = (df["comparable"].astype(str).str.lower() != "false") if "comparable" in df else True
    counted = int((df["suite_over_published"].notna() & comparable).sum())
    spread = (f"Median |log(suite / published)| {median:.3f}, largest {largest:.3f}, over the {counted} comparable "
              "rows with a suite figure (a row marked not comparable measures another quantity or follows another "
              "protocol, and says which)." if median is not None else "No comparable row has a suite figure.")
    out = ["## calibration: published figures beside the suite's", "",
           f"Rows whose configuration this run did not include have no suite figure and say why; a ratio outside "
           f"{BAND[0]}-{BAND[1]} has its reason. {spread}", ""]
    rows = [[r["paper"], r["id"], r["system"] if isinstance(r["system"], str) else "", r["metric"],
             f"{r['published']:.4g}", "" if pd.isna(r["suite"]) else f"{r['suite']:.4g}",
             _num(r["suite_over_published"], 2),
             "" if str(r.get("comparable", True)).lower() != "false" else f"not comparable: {r['comparability']}",
             r["reason"] if isinstance(r["reason"], str) else ""]
            for _, r in df.iterrows()]
    return out + _markdown(rows, ["paper", "id", "system", "metric", "published", "suite", "suite / published",
                                  "comparable", "reason"])


def _claims(df: pd.DataFrame, tracked: Path) -> list[str]:
    """This run's verdict on each claim of the paper, with the figures and verdicts of the README's run beside
    (`docs/results/claims.csv` of the checkout, where it is tracked)."""
    from specter.report.claims import figure_text

    df = df[df["beside_of"].fillna("").astype(str) == ""]
    from specter.report.tablefile import read_table

    theirs = read_table(tracked).set_index("id") if tracked.is_file() else None
    out = ["## The paper's claims", "",
           *textwrap.wrap("Each claim with this run's figure, its 95% bootstrap interval over prompts and verdict "
                          "(`results/tables/claims.csv` has the rule, the configuration and the rows each rests on)"
                          + ("; beside them, the README's run (docs/results/claims.csv)." if theirs is not None
                             else "; the README's run is not tracked in this checkout."), 120), ""]
    rows = []
    for _, r in df.iterrows():
        row = [r["id"], figure_text(r["paper"], r["unit"]), _interval_text(r), r["verdict"]]
        if theirs is not None:
            mine = theirs.loc[r["id"]] if r["id"] in theirs.index else None
            row += [ABSENT, ABSENT] if mine is None else [_interval_text(mine), mine["verdict"]]
        rows.append(row)
    header = ["claim", "paper", "this run [95% interval]", "verdict"]
    header += ["README's run", "README's verdict"] if theirs is not None else []
    return out + _markdown(rows, header) + [""]


def summary(results: str | Path, root: str | Path | None = None) -> str:
    """The summary of results tree `results` (the directory holding `tables/`, `models/`, `drafts/`); `root`: the
    checkout whose commit it names (default: the suite's own)."""
    results = Path(results)
    tables_dir = results / "tables"
    tables = sorted(tables_dir.glob("*.csv"))
    if not tables:
        raise SpecterError(f"{tables_dir} holds no tables (*.csv); run the workflow (snakemake --cores all) first")
    root = Path(root) if root else Path(__file__).resolve().parents[2]
    hardware = sorted({h for p in tables for h in _hardware(p)})
    lines = ["# Results summary", "",
             f"Written by `specter summary` from `{results}`; commit {_commit(root)}. Times are simulated unless a "
             f"section says measured; hardware profiles: {', '.join(hardware) or 'none'} (`specter hardware` gives "
             "their numbers).", ""]
    lines += _models(results)
    lines += _tables(tables)
    claims = _read(tables_dir / "claims.csv")
    if claims is not None and not claims.empty:
        lines += _claims(claims, root / "docs" / "results" / "claims.csv")
    for name, section in (("main", _main), ("ablation", _ablation), ("k_sweep", _k_sweep),
                          ("sensitivity", _sensitivity), ("calibration", _calibration)):
        df = _read(tables_dir / f"{name}.csv")
        if df is not None and not df.empty:
            lines += section(df)
    return "\n".join(lines).rstrip() + "\n"


def _hardware(path: Path) -> list[str]:
    from specter.report.tablefile import read_table

    df = read_table(path)
    if "hardware" not in df:
        return []
    return [h for cell in df["hardware"].dropna().unique() for h in str(cell).split(", ") if h and h != "any"]


#: a cell of the README's table without a record
ABSENT = "-"

def _interval_text(row) -> str:
    from specter.report.claims import figure_text

    if pd.isna(row["suite"]):
        return ABSENT
    return (f"{figure_text(row['suite'], row['unit'])} [{figure_text(row['low'], row['unit'])}, "
            f"{figure_text(row['high'], row['unit'])}]")
