"""A run's specification on the command line: the flags of `specter run`, `compare` and `sweep`, built from the
fields' metadata (`add_cli_args`, as vLLM's `EngineArgs.add_cli_args` does), and the specs read back from them
(`from_args`; `sweep_from_args`, where the sweepable fields take comma-separated lists: the grid's axes)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any

from specter.errors import SpecterError
from specter.runspec import MODES, SWEEP_AXES, Budget, RunSpec, Window, _flag_fields
from specter.runspec.parts import budget_value


def split_list(text: str | None, kind: Callable[[str], Any], flag: str) -> list | None:
    """A comma-separated option value as a list of `kind` (None when the option was not given)."""
    if text is None:
        return None
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    try:
        values = [kind(t) for t in items]
    except ValueError:
        name = getattr(kind, "__name__", "value")
        raise SpecterError(f"{flag} {text!r}: every comma-separated value must be a {name}") from None
    if not values:
        raise SpecterError(f"{flag} is empty; give one or more comma-separated values")
    return values


def same_value(values: list) -> tuple | None:
    """The first two of `values` that name one value (equal as numbers where both read as one: 0 and 0.0), or None;
    a system option given both ways would run twice and its rows merge."""
    seen: dict = {}
    for value in values:
        text = str(value).strip().lower() if isinstance(value, bool) else str(value).strip()
        try:
            key = float(text)
        except ValueError:
            key = text
        if key in seen:
            return seen[key], value
        seen[key] = value
    return None


def key_values(items: list[str] | None, flag: str = "--system-option") -> list[tuple[str, str]]:
    """`--system-option NAME=VALUE` (or another flag's) items as (name, value) pairs."""
    out = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SpecterError(f"{flag} {item!r} must look like NAME=VALUE")
        given = next((v for k, v in out if k == key), None)
        if given is not None:
            raise SpecterError(f"{flag} {key} is given twice ({key}={given} and {item}); give it once")
        out.append((key, value))
    return out


def add_cli_args(p: argparse.ArgumentParser, mode: str) -> None:
    """The run settings' flags on `p`, for `mode` run, compare or sweep (in sweep, sweepable flags take lists)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {MODES}")
    listed = mode == "sweep"
    for f in _flag_fields():
        m = f.metadata
        is_list = listed and m["sweep"]
        default = None if f.default is MISSING else f.default
        shown = "" if default in (None, "") or default == Window() else f" (default {default})"
        # the default stays None here: an absent flag leaves the RunSpec's own default in place
        p.add_argument(m["flag"], dest=f.name, required=m["required"], metavar=m["metavar"],
                       choices=None if is_list else m["choices"], type=_offering(m["choices"], m["instead"]),
                       help=m["help"] + (" (list)" if is_list else "") + shown)
    # one budget for a run; a sweep may give several kinds, which make one axis together
    group = p.add_argument_group("budget") if listed else p.add_mutually_exclusive_group(required=True)
    helps = {"gb": "device memory for the run, GB (1e9 bytes)",
             "slots": "expert slots per MoE layer, whatever else a system keeps (the paper's same cache)",
             "fraction": "expert slots per MoE layer as a share of its experts (rounded, at least 1)",
             "same_memory": "the device memory Specter needs with N slots per layer (its draft charged), for every "
                            "system (the paper's same memory; needs --draft)"}
    for kind, flag in Budget.FLAGS.items():
        group.add_argument(flag, dest=Budget.KINDS[kind], metavar={"gb": "GB", "fraction": "F"}.get(kind, "N"),
                           help=helps[kind] + (" (list)" if listed else ""))
    p.add_argument("--system-option", action="append", metavar="NAME=V1,V2" if listed else "NAME=VALUE",
                   help="a system's own setting (e.g. depth=2 for mixtral-offloading)"
                        + ("; a list of values, for the systems that have it" if listed else "") + "; repeatable")
    p.add_argument("--memo", action="append", metavar="FILE",
                   help="recorded numerics to replay (from `specter sweep --memo-out`); repeatable")


def _offering(choices: tuple | None, instead: dict[str, str]) -> Callable[[str], str]:
    """An argparse type that passes text through, but for a value `instead` names: that is refused with what to give
    (before argparse's check of the choices, which would only list them)."""
    def check(text: str) -> str:
        if text in instead:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of its choices ({', '.join(choices or ())}): "
                                             f"{instead[text]}")
        return text
    return check


def _value(f, text):
    """One flag's value as its field's type (None stays None: the field's default applies)."""
    if text is None:
        return None
    parse = f.metadata["parse"]
    try:
        return parse(text)
    except ValueError:
        raise SpecterError(f"{f.metadata['flag']} {text!r} must be a {getattr(parse, '__name__', 'value')}") from None


def from_args(args: argparse.Namespace, system: str, out: str = "") -> RunSpec:
    """One run's spec from the parsed flags of `run` or `compare`."""
    values = {f.name: _value(f, getattr(args, f.name)) for f in _flag_fields()}
    values = {k: v for k, v in values.items() if v is not None}
    budget = Budget.of(**{name: (None if getattr(args, name) is None else budget_value(kind, getattr(args, name)))
                          for kind, name in Budget.KINDS.items()})
    return RunSpec(system=system, out=out, budget=budget, system_options=tuple(key_values(args.system_option)),
                   memo=tuple(args.memo or ()), **values)


def sweep_from_args(args: argparse.Namespace, systems: list[str], out: str = ""):
    """`sweep`'s flags as (base spec, axes {field: values}, system options {name: values})."""
    axes: dict[str, list] = {"system": systems}
    single = {}
    for f in _flag_fields():
        text = getattr(args, f.name)
        if f.metadata["sweep"] and text is not None:
            axes[f.name] = split_list(text, f.metadata["parse"], f.metadata["flag"])
            choices = f.metadata["choices"]
            bad = [v for v in axes[f.name] if choices and v not in choices]
            if bad:
                raise SpecterError(f"{f.metadata['flag']} {bad[0]!r} is not one of {', '.join(choices)}")
        elif text is not None:
            single[f.name] = _value(f, text)
    budgets = [(kind, name) for kind, name in Budget.KINDS.items() if getattr(args, name) is not None]
    if not budgets:
        raise SpecterError("give a budget: --device-memory-gb, --resident-per-layer, --resident-fraction or "
                           "--same-memory-as (each takes a comma-separated list; several make one axis)")
    axes["budget"] = [Budget(kind, v) for kind, name in budgets
                      for v in split_list(getattr(args, name), lambda t, kind=kind: budget_value(kind, t),
                                          Budget.FLAGS[kind])]
    options = {key: split_list(value, str, f"--system-option {key}") for key, value in key_values(args.system_option)}
    for key, values in options.items():
        if (twice := same_value(values)) is not None:
            raise SpecterError(f"--system-option {key}={','.join(values)}: {twice[0]!r} and {twice[1]!r} are one "
                               "value; give each value once")
    axes = {name: axes[name] for name in SWEEP_AXES if name in axes}
    base = RunSpec(system=systems[0], out=out, memo=tuple(args.memo or ()),
                   **{**single, **{n: v[0] for n, v in axes.items() if n != "system"}})
    return base, axes, options
