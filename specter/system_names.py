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
    nearest first; `OWN_ONLY` from its own body only; `options`: {option: its type's name}, or None where the source
    does not say them plainly}, read from `system_modules`' source: each class that subclasses `System`, directly or
    through another such class, and sets `name` to a string."""
    classes, option_exprs = {}, {}
    for module, source in sorted(system_modules().items()):
        tree = ast.parse(source.read_text("utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else None
                         for b in node.bases]
                classes[node.name] = (bases, dict(pair for s in node.body for pair in _constants(s)))
                option_exprs[node.name] = next(((st.value, module, tree) for st in node.body
                                                if isinstance(st, ast.Assign) and any(
                                                    isinstance(t, ast.Name) and t.id == "options" for t in st.targets)),
                                               None)

    def constants(name: str, seen: frozenset = frozenset()) -> dict | None:  # None: not a System
        if name == "System":
            return {"options": {}}
        if name not in classes or name in seen:
            return None
        bases, own = classes[name]
        inherited = [c for c in (constants(b, seen | {name}) for b in reversed(bases) if b) if c is not None]
        merged = {k: v for c in inherited for k, v in c.items() if k not in OWN_ONLY}
        if not inherited:
            return None
        if option_exprs.get(name) is not None:
            expr, module, tree = option_exprs[name]
            own = {**own, "options": _options(expr, module, tree, lambda c: (constants(c) or {}).get("options"))}
        return merged | own

    out = {}
    for name in classes:
        facts = constants(name)
        if facts is not None and isinstance(facts.get("name"), str) and facts["name"]:
            out[facts["name"]] = facts
    return out


_KINDS = ("bool", "int", "float", "str")


def _options(expr: ast.expr, module: str, tree: ast.Module, of_class, depth: int = 0) -> dict[str, tuple] | None:
    """{option: (its type's name, its default)} of a class's `options = ...`, as its source writes it: a dict of
    `name: (type, default, ...)`
    entries and `**` spreads of another class's options or of a module-level dict (this module's, or one imported
    from another module of the suite); None where it is written otherwise."""
    if depth > 4:
        return None
    if isinstance(expr, ast.Dict):
        out: dict[str, tuple] = {}
        for key, value in zip(expr.keys, expr.values):
            if key is None:
                spread = _options(value, module, tree, of_class, depth + 1)
                if spread is None:
                    return None
                out.update(spread)
            elif isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Tuple) \
                    and len(value.elts) > 1 and isinstance(value.elts[0], ast.Name) and value.elts[0].id in _KINDS:
                default = value.elts[1]  # a negative number is a unary minus on a constant
                if isinstance(default, ast.UnaryOp) and isinstance(default.op, ast.USub) \
                        and isinstance(default.operand, ast.Constant):
                    default = ast.Constant(-default.operand.value)
                if not isinstance(default, ast.Constant):
                    return None
                out[key.value] = (value.elts[0].id, default.value)
            else:
                return None
        return out
    if isinstance(expr, ast.Attribute) and expr.attr == "options" and isinstance(expr.value, ast.Name):
        return of_class(expr.value.id)
    if isinstance(expr, ast.Name):
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                return _options(node.value, module, tree, of_class, depth + 1)
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == expr.id:
                        source = _module_source(node.module)
                        if source is None:
                            return None
                        other = ast.parse(source.read_text("utf-8"))
                        return _options(ast.Name(id=alias.name), node.module, other, of_class, depth + 1)
    return None


def _module_source(module: str) -> Path | None:
    """The source file of one of the suite's own modules (`specter.x.y`), found without importing it."""
    if not module.startswith("specter."):
        return None
    base = Path(__file__).resolve().parent.joinpath(*module.split(".")[1:])
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def option_kinds(name: str) -> dict[str, tuple] | None:
    """{option: (its type's name, its default)} of system `name` (`System.options`), read from its source, or None
    where the source does not say them plainly (a record's settings are then not held to them)."""
    return (_declared().get(name) or {}).get("options")


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


def whole_layer_copier_names() -> frozenset[str]:
    """The systems among `system_names` that copy every expert of a layer when it runs (`copies_whole_layers`)."""
    return frozenset(name for name, facts in _declared().items() if facts.get("copies_whole_layers") is True)


def stall_free_names() -> frozenset[str]:
    """The systems among `system_names` whose simulated runs book no stall (`System.stall_free`)."""
    return frozenset(name for name, facts in _declared().items() if facts.get("stall_free") is True)


def prefetch_in_window_names() -> frozenset[str]:
    """The systems among `system_names` whose prefetches are all among their windows' placed experts
    (`System.prefetch_in_window`)."""
    return frozenset(name for name, facts in _declared().items() if facts.get("prefetch_in_window") is True)


def window_plans(name: str) -> int | None:
    """The prefetch plans a window of system `name` makes at most (`System.window_plans`), or None."""
    plans = (_declared().get(name) or {}).get("window_plans")
    return plans if isinstance(plans, int) and not isinstance(plans, bool) else None


def host_layers_rule(name: str) -> str | None:
    """Which MoE layers system `name` keeps on the host for a whole run (`System.host_layers_rule`), or None."""
    return (_declared().get(name) or {}).get("host_layers_rule")


def speculative_names() -> frozenset[str]:
    """The systems among `system_names` whose class (or a System class it subclasses) sets `speculative = True`: the
    ones whose runs draft a window, and so have a K."""
    return frozenset(name for name, facts in _declared().items() if facts.get("speculative") is True)
