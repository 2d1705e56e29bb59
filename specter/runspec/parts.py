"""The parts of a run's specification that are values of their own: its device budget (`Budget`) and its draft window
(`Window`, a K or a governor)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specter.errors import SpecterError

GOVERNORS = ("auto", "profile", "online")
#: the windows the `profile` governor tries (`specter.speculation.governor`); the largest bounds a governed run's window
PROFILE_KS = (2, 4, 6, 8, 12, 16, 20, 24, 32)


# Budgets ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """A run's device budget: `slots` per MoE layer, a `fraction` of each layer's experts (rounded, at least one
    slot), `gb` of device memory (1e9 bytes) from which the resident part is paid first, or `same_memory` as Specter
    needs with that many slots per layer (see `specter.offload.memory`)."""

    kind: str
    value: float

    KINDS = {"gb": "device_memory_gb", "slots": "resident_per_layer", "fraction": "resident_fraction",
             "same_memory": "same_memory_as"}
    FLAGS = {"gb": "--device-memory-gb", "slots": "--resident-per-layer", "fraction": "--resident-fraction",
             "same_memory": "--same-memory-as"}
    WHOLE = ("slots", "same_memory")  # kinds counted in whole slots

    @classmethod
    def of(cls, device_memory_gb=None, resident_per_layer=None, resident_fraction=None,
           same_memory_as=None) -> Budget:
        """The one budget given, from the flags' values (None where not given)."""
        given = [(k, v) for k, v in (("gb", device_memory_gb), ("slots", resident_per_layer),
                                     ("fraction", resident_fraction), ("same_memory", same_memory_as))
                 if v is not None]
        if len(given) != 1:
            raise SpecterError("give exactly one budget: --device-memory-gb X, --resident-per-layer N, "
                               "--resident-fraction F or --same-memory-as N")
        return cls(*given[0])

    def check(self) -> None:
        flag, v = self.FLAGS[self.kind], self.value
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SpecterError(f"{flag} must be a finite number, got {v!r}")
        if self.kind == "fraction" and not 0 < v <= 1:
            raise SpecterError(f"--resident-fraction {v} must be in (0, 1] (a share of each layer's experts)")
        if self.kind in self.WHOLE and (v != int(v) or v < 1):
            raise SpecterError(f"{flag} {v} must be a whole number of slots, at least 1")
        if self.kind == "gb" and v <= 0:
            raise SpecterError(f"--device-memory-gb {v} must be positive")

    def as_fields(self) -> dict[str, float | int | None]:
        """The budget flags' values, this budget's set and the others None (the records' flat form)."""
        value = int(self.value) if self.kind in self.WHOLE else self.value
        return {name: (value if kind == self.kind else None) for kind, name in self.KINDS.items()}

    def describe(self) -> str:
        return {"fraction": f"{self.value:g} of experts", "slots": f"{int(self.value)} slots/layer",
                "gb": f"{self.value} GB",
                "same_memory": f"Specter's memory at {int(self.value)} slots/layer"}[self.kind]


# Sweep arms ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """The draft window K of a speculative run: an integer, a governor's name (`auto`, `profile`), or None (not
    given)."""

    value: int | str | None = None

    @classmethod
    def parse(cls, text: str | int | None) -> Window:
        if text is None or isinstance(text, Window):
            return text if isinstance(text, Window) else cls()
        if isinstance(text, int) or str(text) in GOVERNORS:
            return cls(text if isinstance(text, int) else str(text))
        try:
            return cls(int(text))
        except ValueError:
            raise SpecterError(f"--k must be an integer >= 1, auto or profile, got {text!r}") from None

    @property
    def fixed(self) -> int | None:
        return self.value if isinstance(self.value, int) else None

    @property
    def governor(self) -> str | None:
        return self.value if isinstance(self.value, str) else None

    @property
    def longest(self) -> int:
        """The most proposals one window may hold: the fixed K, a governor's largest (of `PROFILE_KS`), or 0."""
        return self.fixed or (max(PROFILE_KS) if self.governor else 0)

    def check(self, system: str) -> None:
        if isinstance(self.value, int) and self.value < 1:
            raise SpecterError(f"--k must be at least 1 for {system!r}, got {self.value}")
        if isinstance(self.value, str) and self.value not in GOVERNORS:
            raise SpecterError(f"--k must be an integer >= 1 or one of {', '.join(GOVERNORS)}, got {self.value!r}")

    def __str__(self) -> str:
        return "" if self.value is None else str(self.value)


def budget_value(kind: str, text: str):
    """A budget flag's value as its kind's number."""
    whole = kind in Budget.WHOLE
    try:
        return int(text) if whole else float(text)
    except ValueError:
        raise SpecterError(f"{Budget.FLAGS[kind]} {text!r} must be a {'whole number' if whole else 'number'}") from None


def parse_option(key: str, kind: type, value, bounds: tuple | None = None):
    """A system option's value from its command-line text (`bool` takes true/false, yes/no, 1/0), finite and within
    the option's `bounds` where it has them (`System.options`; a record's settings are held to its options' text)."""
    if kind is bool:
        words = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
        if str(value).lower() not in words:
            raise ValueError(f"option {key}={value!r} is not a boolean; give true or false")
        return words[str(value).lower()]
    try:
        parsed = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"option {key}={value!r} is not {'an' if kind is int else 'a'} {kind.__name__}") from None
    if kind is str:
        if bounds is not None and parsed not in bounds:
            raise ValueError(f"option {key}={value!r} is not one of {', '.join(bounds)}")
        return parsed
    if kind is float and not math.isfinite(parsed):
        raise ValueError(f"option {key}={value!r} must be finite")
    if bounds is not None and not bounds[0] <= parsed <= bounds[1]:
        raise ValueError(f"option {key}={parsed} must be between {bounds[0]} and {bounds[1]}")
    return parsed
