"""The systems' modules, names, order and colours, without importing them: `specter.systems.registry` imports the
modules `system_modules` lists, and `system_names` reads the same modules' source for the names it would find, where
importing every system (and torch) would cost a table's reader seconds.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import pkgutil
from pathlib import Path

BASELINE_PACKAGE = "baselines"
_OWN_MODULES = ("specter.systems.reference", "specter.systems.specter")
DEFAULT_ORDER = 100  # `System.order`: a test holds the two equal
OWN_ONLY = ("order", "colour")  # a class's own, never inherited (`System.__init_subclass__`)


def system_modules() -> dict[str, Path]:
    """{module name: its source file} of the suite's own systems and of every module in `baselines/` (one file per
    reimplemented system)."""
    own = Path(__file__).resolve().parent / "systems"
    modules = {name: own / f"{name.rsplit('.', 1)[1]}.py" for name in _OWN_MODULES}
    spec = importlib.util.find_spec(BASELINE_PACKAGE)
    for m in pkgutil.iter_modules(spec.submodule_search_locations):
        modules[f"{BASELINE_PACKAGE}.{m.name}"] = Path(m.module_finder.path) / f"{m.name}.py"
    return modules


def _constants(statement: ast.stmt) -> list[tuple[str, object]]:
    """(name, value) for each name a class body's statement sets to a constant: `name = "x"`, `speculative: bool =
    True`, `order, colour = 10, "#4c72b0"`."""
    if isinstance(statement, ast.AnnAssign):
        targets, value = [statement.target], statement.value
    elif isinstance(statement, ast.Assign):
        targets, value = statement.targets, statement.value
    else:
        return []
    out = []
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
            out += [(t.id, v.value) for t, v in zip(target.elts, value.elts)
                    if isinstance(t, ast.Name) and isinstance(v, ast.Constant)]
        elif isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            out.append((target.id, value.value))
    return out


@functools.cache
def _declared() -> dict[str, dict]:
    """{system name: the constants its class body and the bodies of the System classes it subclasses set, the
    nearest first; `OWN_ONLY` from its own body only}, read from `system_modules`' source: each class that subclasses
    `System`, directly or through another such class, and sets `name` to a string."""
    classes = {}
    for _, source in sorted(system_modules().items()):
        for node in ast.walk(ast.parse(source.read_text("utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                         for b in node.bases]
                classes[node.name] = (bases, dict(pair for s in node.body for pair in _constants(s)))

    def constants(name: str, seen: frozenset = frozenset()) -> dict | None:  # None: not a System
        if name == "System":
            return {}
        if name not in classes or name in seen:
            return None
        bases, own = classes[name]
        inherited = [c for c in (constants(b, seen | {name}) for b in reversed(bases) if b) if c is not None]
        merged = {k: v for c in inherited for k, v in c.items() if k not in OWN_ONLY}
        return None if not inherited else merged | own

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


def system_order() -> tuple[str, ...]:
    """Every system in its place in tables and figures: by its class's `order` (`System.order` where it sets none),
    then by name."""
    return tuple(sorted(_declared(), key=lambda name: (_declared()[name].get("order", DEFAULT_ORDER), name)))


def system_colours() -> dict[str, str]:
    """{system: its figures' colour} for the systems that set one (`System.colour`)."""
    return {name: facts["colour"] for name, facts in _declared().items() if facts.get("colour")}


def host_compute_names() -> frozenset[str]:
    """The systems among `system_names` that compute missed experts on the host (`host_compute = True`): a miss of
    theirs copies nothing."""
    return frozenset(name for name, facts in _declared().items() if facts.get("host_compute") is True)


def host_layers_rule(name: str) -> str | None:
    """Which MoE layers system `name` keeps on the host for a whole run (`System.host_layers_rule`), or None."""
    return (_declared().get(name) or {}).get("host_layers_rule")


def speculative_names() -> frozenset[str]:
    """The systems among `system_names` whose class (or a System class it subclasses) sets `speculative = True`: the
    ones whose runs draft a window, and so have a K."""
    return frozenset(name for name, facts in _declared().items() if facts.get("speculative") is True)
