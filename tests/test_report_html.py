"""An experiment's table as an HTML page for the report: every row, units in the headers, what the times are."""

from __future__ import annotations

import pandas as pd

from specter.report.html import column_unit, table_html


def _table() -> pd.DataFrame:
    return pd.DataFrame({
        "model": ["tiny-mixtral", "tiny-mixtral", "<b>odd</b>"], "hardware": ["a100-40gb-pcie4"] * 3,
        "simulated": [True, True, True], "system": ["specter", "on-demand", "naive"],
        "tpot_ms": [1.234567, 10.5, float("nan")], "h2d_bytes_demand": [1234567, 0, 5],
        "acceptance_rate": [0.75, None, None], "stall on copies": [0.5, 0.25, 0.0],
        "speedup_of_specter": [1.0, 8.5, 2.0]})


def test_every_row_and_column_with_its_unit_and_the_timing():
    page = table_html(_table(), "main: TPOT per system", "A caption & ``results/tables/main.csv``.")
    assert page.count("<tr>") == 1 + 3 and page.count("<th>") == 9
    assert "<th>tpot_ms<small>ms</small></th>" in page
    assert "<th>h2d_bytes_demand<small>bytes</small></th>" in page
    assert "<th>stall on copies<small>ms per token</small></th>" in page
    assert "<th>acceptance_rate<small>share, 0-1</small></th>" in page
    assert "<th>system</th>" in page  # a label has no unit
    assert "Times are simulated on a100-40gb-pcie4." in page
    assert "A caption &amp; <code>results/tables/main.csv</code>." in page
    assert "&lt;b&gt;odd&lt;/b&gt;" in page and "<b>odd</b>" not in page
    # 4 significant digits shown, the full value kept as the sort key; whole numbers in full; NaN empty
    assert '<td class=num data-v="1.234567">1.235</td>' in page
    assert '<td class=num data-v="1234567.0">1,234,567</td>' in page
    assert '<td class=num data-v=""></td>' in page


def test_measured_rows_are_named_measured():
    t = _table().assign(simulated=[True, False, False], hardware=["a100-40gb-pcie4", "this-gpu", "this-gpu"])
    assert "Times are measured on this-gpu; simulated on a100-40gb-pcie4." in table_html(t, "x")


def test_no_table_column_is_left_without_a_unit_it_has():
    """The columns of the suite's tables that hold quantities all have a unit (the labels have none)."""
    from specter.metrics import BREAKDOWN
    from specter.report.frames import COUNTS, METRICS
    from specter.report.tables import MEMORY_PARTS

    quantities = [*METRICS, *COUNTS, *BREAKDOWN, *(p.removesuffix("_bytes") + "_gb" for p in MEMORY_PARTS), "n",
                  "tpot_ms_p90", "speedup_of_specter", "entropy_bits", "entropy_share", "use_share", "uses",
                  "slots_per_layer", "experts_per_layer", "k", "precision", "recall", "top1_agreement"]
    assert [q for q in quantities if not column_unit(q)] == []


def test_the_page_parses_back_to_the_table():
    """Read with the standard library's HTML parser: the same cells, in order, as the table shows them."""
    from html.parser import HTMLParser

    class Cells(HTMLParser):
        def __init__(self):
            super().__init__()
            self.rows, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "tr":
                self.rows.append([])
            elif tag == "td":
                self.cell = ""

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

        def handle_endtag(self, tag):
            if tag == "td":
                self.rows[-1].append(self.cell)
                self.cell = None

    parser = Cells()
    parser.feed(table_html(_table(), "t"))
    body = parser.rows[1:]
    assert [r[0] for r in body] == ["specter", "on-demand", "naive"] and all(len(r) == 9 for r in body)
    assert [r[3] for r in body] == ["tiny-mixtral", "tiny-mixtral", "<b>odd</b>"]


def test_a_page_shows_what_a_row_is_and_its_figures_first_the_configuration_after():
    """The system, the figure's x column, TPOT, Specter's speedup and the lower bound lead; the CSV's other columns
    follow in their own order."""
    import re

    table = _table().assign(lower_bound_tpot_ms=[1.0, 2.0, 3.0], resident_share=[0.25, 0.25, 0.5])
    heads = re.findall(r"<th>([^<]+)", table_html(table, "budget", x="resident_share"))
    assert heads[:5] == ["system", "resident_share", "tpot_ms", "speedup_of_specter", "lower_bound_tpot_ms"]
    assert heads[5:] == ["model", "hardware", "simulated", "h2d_bytes_demand", "acceptance_rate", "stall on copies"]
