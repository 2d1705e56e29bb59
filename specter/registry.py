"""One registry class for every set of named choices: systems, engines, experiments, table kinds, figure kinds and the
label columns a table derives.

A `Registry` maps a name to its entry, filled from a dict or, lazily, by a loader called on first use (the systems' is
a scan of modules that imports torch, which a table's reader should not pay for); `registry[name] = entry` adds one.
An unknown name is one `UnknownName` error that names the kind, the name and every choice, whoever asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Generic, TypeVar

from specter.errors import SpecterError

T = TypeVar("T")


class UnknownName(SpecterError, KeyError):
    """A name no entry of a registry has: a `SpecterError` (one line to the user) and a `KeyError` (a mapping's)."""

    __str__ = Exception.__str__  # the message, not KeyError's quoted repr of it


class Registry(MutableMapping[str, T], Generic[T]):
    """Named entries of one `kind` ("system", "figure kind"): from `entries`, or from `load()` on first use; `fix`
    ends an unknown name's error (what to do about it)."""

    def __init__(self, kind: str, entries: Mapping[str, T] | None = None,
                 load: Callable[[], Mapping[str, T]] | None = None, fix: str = "") -> None:
        if (entries is None) == (load is None):
            raise ValueError("a registry takes its entries or a loader of them, one of the two")
        self.kind, self.fix = kind, fix
        self._entries, self._load = (dict(entries) if entries is not None else None), load

    def _all(self) -> dict[str, T]:
        if self._entries is None:
            self._entries = dict(self._load())
        return self._entries

    def __getitem__(self, name: str) -> T:
        entries = self._all()
        if name not in entries:
            fix = f"; {self.fix}" if self.fix else ""
            raise UnknownName(f"unknown {self.kind} {name!r}; {self.kind}s: {', '.join(entries) or 'none'}{fix}")
        return entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        self._all()[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._all())})"
