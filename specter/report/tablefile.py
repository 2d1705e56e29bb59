"""Experiments' tables as files: `write_table` writes a table as CSV with its sha256 beside it, and `read_table`
reads one back, checked (its checksum, its lines, its times, shares, counts and ratios) before anything is drawn or
summarized from it.
"""

from __future__ import annotations

import math
import numbers
import re
from pathlib import Path

import pandas as pd

from specter.errors import SpecterError
from specter.io import atomic_write, atomic_write_text, not_a_file, read_at_most

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|[+-]?(nan|inf|infinity)", re.IGNORECASE | re.ASCII)
_UNCHECKED: set[str] = set()  # tables read without a checksum, warned of once a process


def _share(v: float) -> bool:
    return 0 <= v <= 1


def _count(least: int):
    return lambda v: math.isfinite(v) and v == int(v) and v >= least


def _ratio(v: float) -> bool:
    return math.isfinite(v) and v > 0


#: the columns whose cells a table's reader checks beside its times: (the rule, the rule in words)
VALUE_RULES = {
    **{name: (_share, "a share is in [0, 1]") for name in (
        "acceptance_rate", "window_utilization", "window_recall", "hit_rate", "hit_rate_pass", "hit_rate_token",
        "prefetch_precision", "prefetch_recall", "resident_share")},
    **{name: (_count(1), "a whole number, at least 1") for name in ("k", "n", "experts_per_layer")},
    **{name: (_count(0), "a whole number, never negative") for name in (
        "slots_per_layer", "demand_misses", "h2d_bytes_demand", "h2d_bytes_prefetch", "live_forwards", "prompts")},
    "dispatch_us": (lambda v: math.isfinite(v) and v >= 0, "a time is finite and never negative"),
    "temperature": (lambda v: math.isfinite(v) and v >= 0, "finite and never negative"),
    "published": (lambda v: math.isfinite(v) and v > 0, "a published figure is finite and positive"),
    **{name: (_ratio, "a ratio is finite and positive") for name in (
        "speedup_of_specter", "measured_over_simulated", "suite_over_published", "fused_over_published")},
}


#: ratio columns and the columns they are the ratio of
RATIOS_OF = {"measured_over_simulated": ("measured_ms", "simulated_ms"), "suite_over_published": ("suite", "published")}
#: the comparisons `main`'s table holds: each system at Specter's slots, and at Specter's device memory
COMPARISONS = ("same slots", "same memory")
#: columns only a run that drafts a window fills
WINDOW_COLUMNS = ("acceptance_rate", "window_utilization", "window_recall", "window_working_set")
#: columns of True or False
FLAGS = ("simulated", "in_band", "comparable")


def _text_rules() -> dict:
    """{column: (the values a run writes in it, in words)} for the columns whose text names something the suite
    defines: a system (by its registry name, or `<name> (K <governor>)` for its run at a governor's K), a pricing, a
    comparison, a prefetch policy, a draft kernel, a calibration row's metric."""
    from specter.report.calibration import METRICS
    from specter.runspec import DRAFT_KERNELS, PREFETCH_POLICIES, PRICINGS
    from specter.runspec.parts import GOVERNORS
    from specter.system_names import system_names

    names = sorted(system_names())
    systems = set(names) | {f"{name} (K {g})" for name in names for g in GOVERNORS}
    return {"system": (systems, f"a system the suite has ({', '.join(names)})"),
            **{column: (set(values), ", ".join(values)) for column, values in (
                ("pricing", PRICINGS), ("memory", COMPARISONS), ("prefetch", PREFETCH_POLICIES),
                ("draft_kernel", DRAFT_KERNELS), ("metric", METRICS))}}


def _row_problem(row) -> str | None:
    """What in one row contradicts itself: a ratio other than its columns', a flag neither True nor False, a simulated
    TPOT under its own lower bound."""
    for ratio, (num, den) in RATIOS_OF.items():
        values = [_cell_number(row.get(c)) for c in (ratio, num, den)]
        if all(v is not None and math.isfinite(v) for v in values) and values[2] > 0 and not math.isclose(
                values[0], values[1] / values[2], rel_tol=1e-6):
            return f"{ratio} is {values[0]:g}, and {num} over {den} is {values[1] / values[2]:g}"
    for flag in FLAGS:
        value = row.get(flag)
        if flag in row and not pd.isna(value) and str(value) not in ("True", "False"):
            return f"{flag} is {str(value)[:40]!r}, neither True nor False"
    ratio = _cell_number(row.get("suite_over_published"))
    if "diagnostic" in row:
        from specter.report.calibration import DISPATCH_US, _band

        swept = [_cell_number(row.get(f"at_{us}us")) for us in DISPATCH_US]
        swept = [None if v is None or math.isnan(v) else v for v in swept]
        want = "" if not swept or None in swept else str(len({_band(v) for v in swept}) == 1)
        if str(row.get("diagnostic")).replace("nan", "") != want:
            return (f"diagnostic is {str(row.get('diagnostic'))[:10]!r}, and the ratios at "
                    f"{', '.join(f'{us} us' for us in DISPATCH_US)} give {want or 'none'!r}")
    if "in_band" in row and ratio is not None:
        from specter.report.calibration import BAND

        want = "" if math.isnan(ratio) else str(BAND[0] <= ratio <= BAND[1])
        if str(row.get("in_band")).replace("nan", "") != want:
            return (f"in_band is {str(row.get('in_band'))[:10]!r}, and suite_over_published {ratio:g} is "
                    f"{'no ratio' if not want else 'inside' if want == 'True' else 'outside'} {BAND[0]}-{BAND[1]}")
    system, k = row.get("system"), _cell_number(row.get("k"))
    if "k" in row and isinstance(system, str) and k is not None:
        from specter.system_names import speculative_names

        drafts = system.split(" (K ")[0] in speculative_names()
        if drafts == math.isnan(k):
            return (f"k is {'empty' if drafts else f'{k:g}'} for {system}, which "
                    f"{'drafts a window, and so has a K' if drafts else 'drafts no window (a K is a draft window)'}")
        for column in WINDOW_COLUMNS if not drafts else ():
            value = _cell_number(row.get(column))
            if value is not None and not math.isnan(value):
                return f"{column} is {value:g} for {system}, which drafts no window"
    slots, experts = _cell_number(row.get("slots_per_layer")), _cell_number(row.get("experts_per_layer"))
    if slots is not None and experts is not None and slots > experts:
        return f"slots_per_layer is {slots:g} with {experts:g} experts a layer"
    share = _cell_number(row.get("resident_share"))
    if None not in (slots, experts, share) and experts > 0 and not math.isnan(share) and not math.isclose(
            share, slots / experts, rel_tol=1e-9):
        return f"resident_share is {share:g}, and its slots over its experts give {slots / experts:g}"
    order = [(c, _cell_number(row.get(c))) for c in ("tpot_ms_min", "tpot_ms_median", "tpot_ms_p90", "tpot_ms_p99",
                                                      "tpot_ms_max")]
    order = [(c, v) for c, v in order if v is not None and not math.isnan(v)]
    for (a, x), (b, y) in zip(order, order[1:]):
        if x > y * (1 + 1e-9):
            return f"{a} is {x:g}, above {b} {y:g} (a quantile is never above a higher one)"
    low, high = _cell_number(row.get("tpot_ms_min")), _cell_number(row.get("tpot_ms_max"))
    if low is not None and high is not None and not (math.isnan(low) or math.isnan(high)):
        for column in ("tpot_ms", "tpot_ms_median", "tpot_ms_p90", "tpot_ms_p99"):
            value = _cell_number(row.get(column))
            if value is not None and not math.isnan(value) and not low * (1 - 1e-9) <= value <= high * (1 + 1e-9):
                return f"{column} is {value:g}, outside its prompts' range [{low:g}, {high:g}]"
    tpot, bound = _cell_number(row.get("tpot_ms")), _cell_number(row.get("lower_bound_tpot_ms"))
    if str(row.get("simulated")) == "True" and tpot and bound and tpot < bound * (1 - 1e-9):
        return f"tpot_ms is {tpot:g}, under its own lower bound {bound:g} (a simulated run never is)"
    return None


def _cell_number(value) -> float | None:
    """A cell as a number (NaN for an empty cell), or None where it is text."""
    if isinstance(value, str):
        return float(value) if _NUMBER.fullmatch(value.strip()) else None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _claims_row_problem(row) -> str | None:
    """What in a claims table's row no `claims` table holds (`specter.report.claims`), or None: a verdict it does not
    give, a figure that is negative or not finite, an interval that does not hold its value, a verdict other than its
    interval's."""
    from specter.report.claims import RULES, UNITS, VERDICTS, verdict

    if pd.isna(row.get("verdict")) and pd.isna(row.get("rule")):
        return None  # a row beside a claim: a figure of another configuration, no verdict of its own
    if row.get("verdict") not in VERDICTS:
        return f"verdict is {str(row.get('verdict'))[:40]!r}, not one of {', '.join(VERDICTS)}"
    if row.get("rule") not in RULES or ("unit" in row and row.get("unit") not in UNITS):
        return (f"a verdict under rule {str(row.get('rule'))[:20]!r} in unit {str(row.get('unit'))[:20]!r}, where "
                f"claims are judged by {', '.join(RULES)} in {', '.join(UNITS)}")
    if _cell_number(row.get("paper")) is None or pd.isna(row.get("paper")):
        return f"paper is {str(row.get('paper'))[:40]!r}, and a verdict is against the paper's figure"
    figures = {k: row.get(k) for k in ("paper", "suite", "low", "high")}
    for name, value in figures.items():
        if not pd.isna(value) and not (isinstance(value, numbers.Real) and math.isfinite(value) and value >= 0):
            return f"{name} is {value!r}, and a figure is finite and never negative"
    if not any(pd.isna(figures[k]) for k in ("suite", "low", "high")) and not (
            figures["low"] <= figures["suite"] <= figures["high"]):
        return f"the interval [{figures['low']:g}, {figures['high']:g}] does not hold suite {figures['suite']:g}"
    want = verdict(row["rule"], figures["paper"], None if pd.isna(figures["low"]) else figures["low"],
                   None if pd.isna(figures["high"]) else figures["high"])
    if want != row["verdict"]:
        return f"verdict is {row['verdict']!r}, and its interval against the paper's figure gives {want!r}"
    return None


#: the fix for a damaged table
FIX = "write it again with `specter aggregate` (or rerun the workflow)"
#: the largest table read (the suite's largest is well under a megabyte): a larger file is damage, not read whole
MAX_TABLE_BYTES = 1 << 28


def checksum_problem(path: Path, data: bytes) -> str | None:
    """Why the table at `path` (its bytes `data`) is not the one its checksum file beside it (`<table>.sha256`, as
    `sha256sum` writes it) was written for, or None where it is, or where it has no checksum file."""
    import hashlib

    sidecar = path.with_name(path.name + ".sha256")
    if sidecar.exists() and not sidecar.is_file():
        return f"{sidecar} is not a file (a table's checksum is a file beside it)"
    if not sidecar.is_file():
        return None
    try:
        line = read_at_most(sidecar, 4096).split()
    except (OSError, ValueError):
        line = []
    if not (len(line) == 2 and re.fullmatch(rb"[0-9a-fA-F]{64}", line[0])):
        return f"{sidecar} is not a sha256sum line (damaged)"
    if line[1].lstrip(b"*") != path.name.encode():
        return f"{sidecar} is the checksum of {line[1].decode(errors='replace')[:60]!r}, not of {path.name}"
    if line[0].lower() != hashlib.sha256(data).hexdigest().encode():
        return f"{path} is not the table that was written: its bytes differ from {sidecar.name} (cut short or edited)"
    return None


def read_table(path: str | Path) -> pd.DataFrame:
    """A table `write_table` wrote (CSV), checked before it is read, or one SpecterError naming the file, the line
    and the fix: bytes other than its checksum file says (`<table>.csv.sha256`; a table without one is read with a
    warning that its completeness is unchecked), an empty file, a line with another number of fields than the header
    (a half line), a line given twice, a TPOT that is not a positive finite number, another time that is negative or
    infinite, a share, count or ratio no run gives (`VALUE_RULES`)."""
    path = Path(path)
    if (why := not_a_file(path)) is not None:
        raise SpecterError(f"table {str(path)!r} {why}; write it with `specter aggregate`")
    try:
        data = read_at_most(path, MAX_TABLE_BYTES)
        text = data.decode("utf-8")
    except (OSError, ValueError) as err:  # ValueError: past MAX_TABLE_BYTES, or not UTF-8
        raise SpecterError(f"{path} is not a CSV table ({str(err).strip().splitlines()[0]}); {FIX}") from None
    sidecar = path.with_name(path.name + ".sha256")
    problem = checksum_problem(path, data)
    if problem is not None:
        raise SpecterError(f"{problem}; {FIX}, or delete {sidecar.name} to read the table as it is")
    df = _checked(text, path, FIX)
    if not sidecar.is_file() and str(path.resolve()) not in _UNCHECKED:
        import logging

        _UNCHECKED.add(str(path.resolve()))
        logging.getLogger("specter").warning(
            "%s has no %s beside it: a table cut short at a line's end cannot be told from a whole one (tables "
            "the suite writes carry one)", path, sidecar.name)
    return df


def _checked(text: str, path: Path, fix: str) -> pd.DataFrame:
    """The table CSV `text` (of `path`) as a frame, or one SpecterError naming the line and `fix`: what `read_table`
    refuses besides the checksum."""
    import csv
    import io
    import math

    if "\x00" in text:
        raise SpecterError(f"{path} holds NUL bytes (a damaged file); {fix}")
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or not any(rows[0]):
        raise SpecterError(f"{path} is empty; {fix}")
    twice = next((name for i, name in enumerate(rows[0]) if name in rows[0][:i]), None)
    if twice is not None:
        raise SpecterError(f"{path}'s header names the column {twice!r} twice; {fix}")
    seen: dict[tuple, int] = {}
    for number, row in enumerate(rows[1:], 2):
        if len(row) != len(rows[0]):
            raise SpecterError(f"{path}:{number} has {len(row)} fields and the header {len(rows[0])} (a table cut "
                               f"short or edited); {fix}")
        cells = tuple(cell.strip() for cell in row)  # a line given twice, a space added or not
        if cells in seen:
            raise SpecterError(f"{path}:{number} repeats line {seen[cells]}; {fix}")
        seen[cells] = number
    try:
        df = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise SpecterError(f"{path} is not a CSV table ({str(err).strip().splitlines()[0]}); {fix}") from None
    from specter.record_checks import MAX_TIME_MS

    for column in df.columns:
        if not ("tpot" in column or column.endswith("_ms")):
            continue
        tpot = "tpot" in column
        for i, value in df[column].items():
            try:
                if isinstance(value, str) and not _NUMBER.fullmatch(value.strip()):
                    raise ValueError(value)  # float() also reads "5_439" and other scripts' digits
                number = float(value)
            except (TypeError, ValueError):
                raise SpecterError(f"{path}:{i + 2}: {column} is {str(value)!r:.40}, not a number; {fix}") from None
            if math.isnan(number) and not tpot:
                continue  # an empty cell: a part or time the row does not have
            if not (math.isfinite(number) and (number > 0 if tpot else number >= 0) and number <= MAX_TIME_MS):
                raise SpecterError(f"{path}:{i + 2}: {column} is {value}, which no run gives (a time is "
                                   f"{'positive' if tpot else 'never negative'}, finite and under a day); {fix}")
    for column in df.columns:
        rule = VALUE_RULES.get(column)
        for i, value in df[column].items() if rule is not None else ():
            number = _cell_number(value)
            if number is not None and math.isnan(number):
                continue  # an empty cell: a figure the row does not have
            if number is None or not rule[0](number):
                raise SpecterError(f"{path}:{i + 2}: {column} is {str(value)!r:.40}, which no run gives ({rule[1]}); "
                                   f"{fix}")
    for column in df.columns:  # a line break or control character in a cell breaks every table drawn from it
        for i, value in df[column].items() if not pd.api.types.is_numeric_dtype(df[column]) else ():
            if isinstance(value, str) and not value.isprintable():
                raise SpecterError(f"{path}:{i + 2}: {column} is {value!r:.60}, and a cell the suite writes is one "
                                   f"line of printable text; {fix}")
    texts = _text_rules()
    for column in set(texts) & set(df.columns) if "system" in df.columns else ():  # a run's table, not a profile's
        for i, value in df[column].items():
            if not pd.isna(value) and str(value) not in texts[column][0]:
                raise SpecterError(f"{path}:{i + 2}: {column} is {str(value)!r:.60}, which no run writes (one of "
                                   f"{texts[column][1]}); {fix}")
    _check_speedups(df, path, fix)
    claims = {"verdict", "rule", "paper", "suite", "low", "high"} <= set(df.columns)
    for i, row in df.iterrows():
        problem = _row_problem(row) or (_claims_row_problem(row) if claims else None)
        if problem is not None:
            raise SpecterError(f"{path}:{i + 2}: {problem}, which no run gives; {fix}")
    return df


def _check_speedups(df: pd.DataFrame, path: Path, fix: str) -> None:
    """Each `speedup_of_specter` is its row's TPOT over a Specter row's of the same scope (model, prompt set,
    hardware, pricing, dispatch: `experiments.SCOPE`), as `tables._speedups` computes it, and of the same protocol:
    as many prompts, and at the same slots where the comparison is at the same slots (`memory`; a system that keeps
    every expert excepted)."""
    from specter.experiments import SCOPE

    if not {"speedup_of_specter", "system", "tpot_ms"} <= set(df.columns):
        return
    scope = [c for c in SCOPE if c in df.columns]
    ours: dict[tuple, list] = {}
    for _, row in df[df["system"] == "specter"].iterrows():
        ours.setdefault(tuple(str(row[c]) for c in scope), []).append(row)
    for i, row in df.iterrows():
        ratio = _cell_number(row["speedup_of_specter"])
        if ratio is None or math.isnan(ratio):
            continue
        over = [r for r in ours.get(tuple(str(row[c]) for c in scope), [])
                if math.isclose(ratio, float(row["tpot_ms"]) / float(r["tpot_ms"]), rel_tol=1e-6)]
        if not over:
            raise SpecterError(f"{path}:{i + 2}: speedup_of_specter is {ratio:g}, and no Specter row of its model, "
                               f"prompt set and hardware has {float(row['tpot_ms']) / ratio:g} ms, its TPOT over it; "
                               f"{fix}")
        same = ["n"] if "n" in df.columns else []
        if row.get("memory") == "same slots" and "slots_per_layer" in df.columns and str(
                row["slots_per_layer"]) != str(row.get("experts_per_layer")):
            same.append("slots_per_layer")
        for column in same:
            if all(str(r[column]) != str(row[column]) for r in over):
                raise SpecterError(f"{path}:{i + 2}: {row['system']} ({row.get('memory', 'its comparison')}) has "
                                   f"{column} {row[column]}, and the Specter row its speedup divides by has "
                                   f"{over[0][column]}: a speedup compares runs of one protocol (give every system's "
                                   f"run at Specter's slots and prompts); {fix}")


def write_table(table: pd.DataFrame, out: str | Path) -> None:
    """The table as CSV at `out`, and its sha256 beside it (`<out>.sha256`, as `sha256sum` writes it), which
    `read_table` holds the table to; a table `read_table` would refuse is not written."""
    import hashlib
    import io

    buffer = io.StringIO()
    table.to_csv(buffer, index=False)
    # what `read_table` would refuse is never written: the inputs hold it, not the table
    _checked(buffer.getvalue(), Path(out), "not written: the records it was made from hold a value no run gives, or "
                                           "runs no one table compares; run the rules that write them again")
    data = buffer.getvalue().encode("utf-8")
    atomic_write(out, lambda f: f.write(data), binary=True)
    try:
        atomic_write_text(Path(str(out) + ".sha256"), f"{hashlib.sha256(data).hexdigest()}  {Path(out).name}\n")
    except OSError:  # a table without its checksum would be read with a warning only: none is left
        Path(out).unlink(missing_ok=True)
        raise


def its_own_table(name: str, spec, table: pd.DataFrame) -> None:
    """Refuse another experiment's table (it would be drawn as this one's): one without this table's keys, or, for a
    table of statistics, with a column such a table does not hold."""
    from specter.experiments import SCOPE
    from specter.report.frames import COUNTS, METRICS

    lacking = [c for c in (*spec.keys, *(spec.columns or ())) if c not in table.columns]
    extra = []
    if spec.kind == "stats":
        allowed = set(spec.columns) if spec.columns else {*SCOPE, *spec.keys, *METRICS, *COUNTS, "n", "tpot_ms_median",
                                                          "tpot_ms_p90", "tpot_ms_p99", "tpot_ms_min", "tpot_ms_max",
                                                          "speedup_of_specter"}
        extra = [c for c in table.columns if c not in allowed]
    keys = [c for c in (*SCOPE, *spec.keys) if c in table.columns]
    twice = table[keys].astype(str).duplicated(keep=False) if spec.kind == "stats" and not lacking else None
    if twice is not None and twice.any():
        lines = [i + 2 for i in table.index[twice]][:2]
        raise SpecterError(f"the table's lines {lines[0]} and {lines[1]} are two rows for one setting (the same "
                           f"{', '.join(keys)}), which no {name} table holds: the table was edited; give the table "
                           f"`specter aggregate {name}` wrote (results/tables/{name}.csv)")
    if lacking or extra:
        said = "; ".join(part for part in (f"it lacks {', '.join(lacking)}" if lacking else "",
                                           f"it holds {', '.join(extra)}" if extra else "") if part)
        raise SpecterError(f"the table is not a {name} table ({said}); give the table `specter aggregate {name}` "
                           f"wrote (results/tables/{name}.csv)")
