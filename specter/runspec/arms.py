"""A sweep's arms: named sets of run settings every point of its grid also runs in (`specter sweep --arm`), parsed
and checked against the RunSpec fields an arm may set (`ARM_SETTINGS`), a budget and the systems' options."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from specter.errors import SpecterError
from specter.runspec import ARM_SETTINGS, EXPERT_BITS, RunSpec
from specter.runspec.parts import Budget, budget_value


@dataclass(frozen=True)
class Arm:
    """A named set of settings a sweep runs at every point of its grid (`specter sweep --arm`), for comparisons that
    are not a grid, such as an ablation's cumulative arms or a peer paper's configurations: run settings of
    `ARM_SETTINGS`, a budget (one of `Budget.KINDS`' names, e.g. resident_per_layer=4) and system options (applied to
    the systems that have them). Its name goes into every record (`config.arm`)."""

    name: str = ""
    settings: tuple[tuple[str, Any], ...] = ()
    options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Arm:
        """`NAME` or `NAME:SETTING=VALUE,SETTING=VALUE` (a setting of ARM_SETTINGS, or a system option)."""
        name, _, rest = str(text).partition(":")
        name = name.strip()
        if not name or "=" in name:
            raise SpecterError(f"--arm {text!r} has no name; give NAME:SETTING=VALUE,... (e.g. 'no prefetch:"
                               "prefetch=none')")
        if not (name.isprintable() and str(text).isprintable()):  # a name is a table's cell: one line of text
            raise SpecterError(f"--arm {text!r} holds a control character (a newline, a tab); give its name and "
                               "settings as one line of printable text")
        settings, options = {}, {}
        for item in (i.strip() for i in rest.split(",")):
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key or not value:
                raise SpecterError(f"--arm {text!r}: {item!r} must look like SETTING=VALUE")
            if key.replace("-", "_") in (*ARM_SETTINGS, *Budget.KINDS.values()):  # draft-kernel and draft_kernel
                key = key.replace("-", "_")
            if key in settings or key in options or (key in Budget.KINDS.values() and "budget" in settings):
                raise SpecterError(f"--arm {text!r} sets {key} twice (or two budgets)")
            if key in Budget.KINDS.values():
                kind = next(k for k, name in Budget.KINDS.items() if name == key)
                settings["budget"] = Budget(kind, budget_value(kind, value))
                settings["budget"].check()
            elif key in ARM_SETTINGS:
                f = next(f for f in fields(RunSpec) if f.name == key)
                choices = f.metadata["choices"]
                if choices and value not in choices:
                    raise SpecterError(f"--arm {text!r}: {key}={value!r} is not one of {', '.join(choices)}")
                settings[key] = f.metadata["parse"](value)
                if key == "expert_bits" and (isinstance(settings[key], bool) or settings[key] not in EXPERT_BITS):
                    raise SpecterError(f"--arm {text!r}: expert_bits={value!r} is not one of "
                                       f"{', '.join(map(str, EXPERT_BITS))}")
            elif key.replace("-", "_") in {f.name for f in fields(RunSpec)}:
                raise SpecterError(f"--arm {text!r}: an arm cannot set {key} (arms set {', '.join(ARM_SETTINGS)}, "
                                   "a budget and system options; sweep the others as axes)")
            else:
                options[key] = value
        return cls(name, tuple(settings.items()), tuple(options.items()))

    def check(self, systems) -> None:
        """Every option of this arm is one that some of `systems` (System classes or instances) has, with a value
        each of those takes; the one check of an arm's options, for `specter sweep` and the workflow's config."""
        for option, value in self.options:
            having = [s for s in systems if option in s.options]
            if not having:
                known = sorted({o for s in systems for o in s.options})
                raise SpecterError(f"--arm {self.flag()!r}: no listed system has option {option!r}; their options: "
                                   f"{', '.join(known) or 'none'}")
            for s in having:
                try:
                    (s if isinstance(s, type) else type(s))(**{option: value})
                except (SpecterError, ValueError) as err:
                    raise SpecterError(f"--arm {self.flag()!r}: {err}") from None

    def flag(self) -> str:
        """This arm as `--arm` takes it."""
        items = [f"{Budget.KINDS[v.kind]}={v.value:g}" if k == "budget" else f"{k}={v}"
                 for k, v in (*self.settings, *self.options)]
        return f"{self.name}:{','.join(items)}" if items else self.name
