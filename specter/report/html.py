"""An experiment's table as one self-contained HTML page, for the workflow's report beside its figure.

The page holds the table as written (`specter aggregate`'s CSV, every row and column), each header with its unit, the
experiment's caption and what its times are (simulated on which hardware profile, or measured). Clicking a header sorts
by that column (numbers as numbers; a small inline script, nothing fetched). Numbers show 4 significant digits and
whole numbers in full; the CSV beside keeps every digit.
"""

from __future__ import annotations

import html
import math
import re

import pandas as pd

from specter.io import atomic_write_text
from specter.metrics import BREAKDOWN
from specter.report.tables import timing_note

#: columns whose unit their name does not carry (suffixes _ms, _gb, _bits and "bytes" in a name do)
_UNITS = {
    **dict.fromkeys(BREAKDOWN, "ms per token"),
    **dict.fromkeys(("acceptance_rate", "window_utilization", "window_recall", "hit_rate", "resident_share",
                     "precision", "recall", "expert_hard", "expert_soft", "expert_mismatch", "expert_exact",
                     "expert_partial", "expert_none", "top1_agreement", "use_share", "entropy_share", "hit_rate_pass",
                     "hit_rate_token", "prefetch_precision", "prefetch_recall"), "share, 0-1"),
    "speedup_of_specter": "x (ratio of mean TPOTs)", "suite_over_paper": "x",
    "measured_ms": "ms per token", "simulated_ms": "ms per token", "measured_over_simulated": "x",
    "tokens_as_recorded": "share, 0-1",
    "n": "runs (prompts x timed repeats)", "prompts": "prompts", "demand_misses": "expert loads",
    "live_forwards": "forwards",
    "k": "tokens", "prefix_tokens": "tokens", "mean_accepted": "tokens", "tokens": "tokens",
    "slots_per_layer": "experts", "experts_per_layer": "experts", "window_working_set": "experts",
    "specter_slots": "experts", "slots": "experts per layer", "uses": "routed tokens", "windows": "windows",
    "layers": "layers", "bits": "bits", "group_size": "inputs", "link_gbps": "GB/s (pinned host to device)",
}


def column_unit(column: str) -> str:
    """The unit of a table column ('' for a label such as system or model)."""
    if column in _UNITS:
        return _UNITS[column]
    if column.endswith("_ms") or "_ms_" in column:
        return "ms"
    if column.endswith("_gb"):
        return "GB"
    if column.endswith("_bits"):
        return "bits"
    if "bytes" in column:
        return "bytes"
    return ""


def _cell(value) -> tuple[str, str]:
    """(shown text, sort key) of one cell."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", ""
    if isinstance(value, bool):
        return str(value), str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return f"{int(value):,}", repr(float(value))
    if isinstance(value, float):
        return f"{value:.4g}", repr(value)
    return str(value), str(value)


_STYLE = """body{font-family:system-ui,sans-serif;font-size:13px;margin:12px;color:#222}
h1{font-size:16px;margin:0 0 6px}p{margin:4px 0 10px;max-width:110ch}
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:3px 6px;white-space:nowrap}
th{background:#f2f2f2;cursor:pointer;position:sticky;top:0;vertical-align:bottom}
th small{display:block;font-weight:normal;color:#555}td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#fafafa}"""

_SORT = """document.querySelectorAll('th').forEach(function(th,i){th.onclick=function(){
var body=th.closest('table').tBodies[0],rows=Array.from(body.rows),up=th.dataset.dir!=='up';
rows.sort(function(a,b){var x=a.cells[i].dataset.v,y=b.cells[i].dataset.v,p=parseFloat(x),q=parseFloat(y);
var c=(!isNaN(p)&&!isNaN(q))?p-q:x.localeCompare(y);return up?c:-c;});
rows.forEach(function(r){body.appendChild(r);});th.dataset.dir=up?'up':'down';};});"""


def _inline(text: str) -> str:
    """A caption (reStructuredText, as the report's) as HTML: escaped, its ``literals`` as code."""
    return re.sub(r"``(.+?)``", r"<code>\1</code>", html.escape(text))


#: the columns a reader looks for first, in this order where a table has them: what a row is (a claim, a verdict, a
#: comparison, a system, an arm, a policy), then its figures (TPOT, Specter's speedup, the lower bound; a claim's or
#: a published row's figures); the configuration follows in the table's own order
ROW_LABELS = ("id", "short", "verdict", "memory", "system", "arm", "policy", "k_setting")
KEY_FIGURES = ("tpot_ms", "speedup_of_specter", "lower_bound_tpot_ms", "paper", "suite", "low", "high", "published",
               "suite_over_published", "measured_ms", "simulated_ms", "measured_over_simulated")


def key_columns_first(table: pd.DataFrame, x: str | None = None) -> pd.DataFrame:
    """`table` with `ROW_LABELS`, the figure's x column `x`, then `KEY_FIGURES` first, every other column after."""
    first = [c for c in (*ROW_LABELS, *([x] if x else []), *KEY_FIGURES) if c in table]
    first = list(dict.fromkeys(first))
    return table[first + [c for c in table.columns if c not in first]]


def table_html(table: pd.DataFrame, title: str, caption: str = "", x: str | None = None) -> str:
    """The page: title, caption, what the times are, and the table with a unit under every header that has one, its
    key columns first (`key_columns_first`; the CSV keeps the table's own order)."""
    table = key_columns_first(table, x)
    note = timing_note(table, many="each row's hardware profile")
    head = "".join(
        f"<th>{html.escape(str(c))}" + (f"<small>{html.escape(column_unit(str(c)))}</small>" if column_unit(str(c))
                                        else "") + "</th>" for c in table.columns)
    numeric = [pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c])
               for c in table.columns]
    body = []
    for row in table.itertuples(index=False, name=None):
        cells = []
        for value, is_num in zip(row, numeric):
            shown, key = _cell(value.item() if hasattr(value, "item") else value)
            cells.append(f'<td{" class=num" if is_num else ""} data-v="{html.escape(key)}">{html.escape(shown)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body>\n<h1>{html.escape(title)}</h1>\n"
            + (f"<p>{_inline(caption)}</p>\n" if caption else "")
            + (f"<p><b>Times are {html.escape(note)}.</b></p>\n" if note else "")
            + f"<p>{len(table):,} rows; click a header to sort.</p>\n"
            f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>\n"
            f"<script>{_SORT}</script>\n</body></html>\n")


def write_table_html(table: pd.DataFrame, out, title: str, caption: str = "", x: str | None = None) -> None:
    atomic_write_text(out, table_html(table, title, caption, x))
