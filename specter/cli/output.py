"""What the commands print and how they word it: byte counts, ranges of layers, a row's timing, and a field of the
wrong shape met past the files' checks as one line."""

from __future__ import annotations

import contextlib

from specter.errors import SpecterError


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def ranges(xs: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def timing(row: dict) -> str:
    return f"{'simulated' if row['simulated'] else 'measured'} on {row['hardware']}"


@contextlib.contextmanager
def of_another_shape(what: str, fix: str):
    """A field or cell of a type or shape the suite never writes, met past the files' checks: one line, no traceback."""
    try:
        yield
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError, ArithmeticError) as err:
        raise SpecterError(f"{what} of another type or shape than this suite writes ({type(err).__name__}: "
                           f"{str(err)[:120]}); {fix}") from None
