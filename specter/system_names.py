"""The systems' modules and names, without importing them: `specter.systems.registry` imports the modules
`system_modules` lists, and `system_names` reads the same modules' source for the names it would find, where importing
every system (and torch) would cost a table's reader seconds.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import pkgutil
from pathlib import Path

BASELINE_PACKAGE = "baselines"
_OWN_MODULES = ("specter.systems.reference", "specter.systems.specter")


def system_modules() -> dict[str, Path]:
    """{module name: its source file} of the suite's own systems and of every module in `baselines/` (one file per
    reimplemented system)."""
    own = Path(__file__).resolve().parent / "systems"
    modules = {name: own / f"{name.rsplit('.', 1)[1]}.py" for name in _OWN_MODULES}
    spec = importlib.util.find_spec(BASELINE_PACKAGE)
    for m in pkgutil.iter_modules(spec.submodule_search_locations):
        modules[f"{BASELINE_PACKAGE}.{m.name}"] = Path(m.module_finder.path) / f"{m.name}.py"
    return modules


@functools.cache
def _declared() -> dict[str, dict]:
    """{system name: the constants its class body and the bodies of the System classes it subclasses set, the
    nearest first}, read from `system_modules`' source: each class that subclasses `System`, directly or through
    another such class, and sets `name` to a string."""
    classes = {}
    for _, source in sorted(system_modules().items()):
        for node in ast.walk(ast.parse(source.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                         for b in node.bases]
                own = {t.id: s.value.value for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                       and isinstance(s.value, ast.Constant)
                       for t in (s.targets if isinstance(s, ast.Assign) else [s.target]) if isinstance(t, ast.Name)}
                classes[node.name] = (bases, own)

    def constants(name: str, seen: frozenset = frozenset()) -> dict | None:  # None: not a System
        if name == "System":
            return {}
        if name not in classes or name in seen:
            return None
        bases, own = classes[name]
        inherited = [c for c in (constants(b, seen | {name}) for b in reversed(bases) if b) if c is not None]
        return None if not inherited else {k: v for c in inherited for k, v in c.items()} | own

    out = {}
    for name in classes:
        facts = constants(name)
        if facts is not None and isinstance(facts.get("name"), str) and facts["name"]:
            out[facts["name"]] = facts
    return out


def system_names() -> frozenset[str]:
    """The names `registry` finds, read from the same modules' source without importing them (nor torch). A table's
    reader checks its systems against these where importing every system would cost it seconds."""
    return frozenset(_declared())


def speculative_names() -> frozenset[str]:
    """The systems among `system_names` whose class (or a System class it subclasses) sets `speculative = True`: the
    ones whose runs draft a window, and so have a K."""
    return frozenset(name for name, facts in _declared().items() if facts.get("speculative") is True)
