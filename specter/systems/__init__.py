"""Systems: the `System` base and its declared extension points (`base`), the shared decode loops (`decode`), the
reference systems `resident` and `on-demand` (`reference`), Specter (`specter`), and the registry of names.

The registry finds every `System` subclass with a name in this package's modules and in `baselines/` (one file per
reimplemented system): a new baseline is one file there, and nothing in the core names it.
"""

from __future__ import annotations

import importlib

from specter.errors import SpecterError
from specter.registry import Registry
from specter.system_names import system_modules
from specter.systems.base import DecodeConfig, PassHooks, PredictionCounts, PromptContext, PromptResult, System

__all__ = ["DecodeConfig", "PassHooks", "PredictionCounts", "PromptContext", "PromptResult", "System", "get_system",
           "registry", "schedule"]


def _scan() -> dict[str, type[System]]:
    """{name: System class} of every system in the modules `specter.system_names.system_modules` names, by name."""
    modules = system_modules()
    found: dict[str, type[System]] = {}
    for module_name in sorted(modules):
        for obj in vars(importlib.import_module(module_name)).values():
            if isinstance(obj, type) and issubclass(obj, System) and obj is not System and obj.name:
                found[obj.name] = obj
    return dict(sorted(found.items()))


#: every system the suite knows, by name (its modules imported on first use)
SYSTEMS: Registry[type[System]] = Registry("system", load=_scan, fix="`specter systems` lists them")


def registry() -> Registry[type[System]]:
    """{name: System class} of every system the suite knows (`SYSTEMS`)."""
    return SYSTEMS


def get_system(name: str, options: dict[str, str] | None = None) -> System:
    cls = SYSTEMS[name]
    try:
        return cls(**(options or {}))
    except ValueError as err:
        raise SpecterError(f"bad --system-option for {name!r}: {err}") from None


def schedule(system: System, engine, work, service, trace, config, cost, warmup=None, device=None, online=None):
    """One prompt's run of `system` on `engine` (with `device`'s kernels behind the ops, if given; K re-chosen every
    cycle by `online`, if given); returns (PromptResult, Timeline)."""
    ctx = PromptContext.fresh(system, engine, work, service, trace, config, cost, warmup, device)
    ctx.online = online.fresh() if online is not None else None
    result = system.run(ctx)
    result.extra.update(ctx.extra)
    return result, engine.finish()
