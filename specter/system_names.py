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
def system_names() -> frozenset[str]:
    """The names `registry` finds, read from the same modules' source without importing them (nor torch): each class
    that subclasses `System`, directly or through another such class, and sets `name` to a string. A table's reader
    checks its systems against these where importing every system would cost it seconds."""
    classes = []
    for _, source in sorted(system_modules().items()):
        classes += [node for node in ast.walk(ast.parse(source.read_text("utf-8"))) if isinstance(node, ast.ClassDef)]
    systems, names, grew = {"System"}, set(), True
    while grew:
        grew = False
        for node in classes:
            bases = {b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                     for b in node.bases}
            if node.name not in systems and bases & systems:
                systems.add(node.name)
                grew = True
    for node in classes:
        for statement in node.body if node.name in systems else ():
            if (isinstance(statement, ast.Assign) and [getattr(t, "id", None) for t in statement.targets] == ["name"]
                    and isinstance(statement.value, ast.Constant) and statement.value.value):
                names.add(statement.value.value)
    return frozenset(names)
