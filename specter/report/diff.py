"""`specter diff A B`: whether two results trees hold the same results, and where they differ.

Compares every run-record file (`*.jsonl` under `runs/` and `experiments/`) record by record (paired by run, prompt
and repeat; the same records in another order are one difference, saying so) and field by field, and
every table (`tables/*.csv`) and its checksum file byte for byte. Fields that legitimately differ between identical
runs are left out: wall-clock time, package versions and the git commit by default (`--ignore` names more, as dotted
paths such as `config.memo`). The answer names each differing file and field, so "identical" is something one can
check, not assume. Records of this version that no run writes (a NaN TPOT, say), and tables their checksum files do
not vouch for, are named too, on either side: two trees can be identical and both damaged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from specter.errors import SpecterError
from specter.records import read_jsonl, value_problem
from specter.report.tablefile import checksum_problem

DEFAULT_IGNORED = ("wall_s", "versions", "git_commit")
RECORD_DIRS = ("runs", "experiments")


@dataclass
class Diff:
    record_files: int = 0
    records: int = 0
    tables: int = 0
    differences: list[str] = field(default_factory=list)
    impossible: list[str] = field(default_factory=list)  # records of this version no run writes, on either side

    @property
    def identical(self) -> bool:
        return not self.differences


def _fields(a, b, prefix: str, ignored: set[str], out: list[str]) -> None:
    """Dotted paths where `a` and `b` differ (dicts compared key by key, a key in one only a difference even where the
    other's is null; anything else as JSON writes it: `true` is not `1`, `1` not `1.0`, and NaN is NaN)."""
    if prefix in ignored:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            path = f"{prefix}.{key}" if prefix else key
            if (key in a) != (key in b):  # a field missing is not a field that is null
                out.extend([path] if path not in ignored else [])
            else:
                _fields(a[key], b[key], path, ignored, out)
    elif json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
        out.append(prefix)


def _one_side(name: str, pa: Path, pb: Path, a: Path, b: Path) -> str:
    """How `name` differs where it is not a file on both sides: a file on one side only, or a file on neither."""
    if pa.is_file() != pb.is_file():
        return f"{name}: a file only in {a if pa.is_file() else b}"
    return f"{name}: not a file in either"


def _identity(record: dict, ignored: set[str]) -> str:
    """What tells a record apart from the others of its file, without the fields the diff leaves out: its run's
    config, system, model, prompt set, engine and hardware, its prompt and its repeat."""
    config = json.loads(json.dumps(record.get("config") or {}, default=str))
    for path in ignored:
        if path.startswith("config."):
            config.pop(path.removeprefix("config."), None)
    return json.dumps([config, record.get("system"), record.get("model"), record.get("dataset"), record.get("engine"),
                       record.get("hardware"), record.get("prompt_index"), (record.get("extra") or {}).get("repeat")],
                      sort_keys=True, default=str)


def _paired(ra: list[dict], rb: list[dict], ignored: set[str]) -> tuple[list[dict], int]:
    """`rb` in `ra`'s order where both hold the same records by identity (each once), and how many moved; else `rb`
    as it is (compared place by place)."""
    ka, kb = [_identity(r, ignored) for r in ra], [_identity(r, ignored) for r in rb]
    if len(set(ka)) != len(ka) or sorted(ka) != sorted(kb):
        return rb, 0
    place = {k: i for i, k in enumerate(kb)}
    return [rb[place[k]] for k in ka], sum(place[k] != i for i, k in enumerate(ka))


def diff_results(a: str | Path, b: str | Path, ignore: tuple[str, ...] = DEFAULT_IGNORED) -> Diff:
    a, b = Path(a), Path(b)
    for root in (a, b):
        if not root.is_dir():
            raise SpecterError(f"{str(root)!r} is not a directory; give two results directories")
    ignored = set(ignore)
    out = Diff()
    for sub in RECORD_DIRS:
        names = sorted({p.relative_to(r).as_posix() for r in (a, b) for p in (r / sub).rglob("*.jsonl")})
        for name in names:
            pa, pb = a / name, b / name
            if not (pa.is_file() and pb.is_file()):
                out.differences.append(_one_side(name, pa, pb, a, b))
                continue
            ra, rb = read_jsonl(pa, strict=False), read_jsonl(pb, strict=False)
            out.record_files += 1
            out.records += len(ra)
            if len(ra) != len(rb):
                out.differences.append(f"{name}: {len(ra)} records against {len(rb)}")
                continue
            rb, moved = _paired(ra, rb, ignored)
            if moved:
                out.differences.append(f"{name}: the same runs' records in another order ({moved} of {len(ra)} "
                                       "moved); compared run by run and prompt by prompt")
            paths: dict[str, int] = {}
            for i, (x, y) in enumerate(zip(ra, rb), 1):
                out.impossible += [f"{root / name} record {i}: {problem}" for root, record in ((a, x), (b, y))
                                   if (problem := value_problem(record)) is not None]
                found: list[str] = []
                _fields(x, y, "", ignored, found)
                for p in found:
                    paths[p] = paths.get(p, 0) + 1
            out.differences += [f"{name}: {p} differs in {n} of {len(ra)} records" for p, n in sorted(paths.items())]
    names = sorted({p.relative_to(r).as_posix() for r in (a, b) for pattern in ("*.csv", "*.csv.sha256")
                    for p in (r / "tables").glob(pattern)})  # a table with its checksum: what its readers hold it to
    for name in names:
        pa, pb = a / name, b / name
        if not (pa.is_file() and pb.is_file()):
            out.differences.append(_one_side(name, pa, pb, a, b))
            continue
        table = not name.endswith(".sha256")
        out.tables += table
        try:
            da, db = pa.read_bytes(), pb.read_bytes()
        except OSError as err:
            raise SpecterError(f"cannot read a table to compare: {err.strerror}: {err.filename}; make it readable "
                               "(or compare other directories)") from None
        if da != db:
            out.differences.append(f"{name}: the {'tables' if table else 'checksum files'} differ")
        if table:  # a table its own checksum file does not vouch for is damaged, on whichever side
            out.impossible += [problem for path, data in ((pa, da), (pb, db))
                               if (problem := checksum_problem(path, data)) is not None]
    return out
