"""The `specter` command line's argument types (each checks a flag's text before any work, the message naming the
bound or name it breaks) and the flags several commands share."""

from __future__ import annotations

import argparse


def _count(low: int, high: int):
    """An argparse type: a whole number in [low, high] (the message names the bound it breaks)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is out of range: give {low} to {high}")
        return value
    parse.__name__ = "count"
    return parse


def _out(suffixes: str = "", directory: bool = False):
    """An argparse type for an output path: a file ending in one of `suffixes` (space-separated), or a directory, that
    can be written; checked before any work so a bad path costs nothing."""
    from specter.io import writable_problem

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError("the path is empty")
        if suffixes and not text.endswith(tuple(suffixes.split())):
            raise argparse.ArgumentTypeError(f"{text!r} must end in {' or '.join(suffixes.split())}")
        problem = writable_problem(text, directory)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return text
    parse.__name__ = "output directory" if directory else "output file"
    return parse


def _model_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR", help="the target checkpoint")


def _prompt_flags(p: argparse.ArgumentParser) -> None:
    """The held-out prompts of a fidelity report (the artifact's protocol: 5 prompts of 16 tokens)."""
    from specter.data.prompts import DATASETS

    p.add_argument("--dataset", default="code", help=f"a shipped prompt set: {', '.join(DATASETS)} (default: code)")
    p.add_argument("--num-prompts", type=_count(1, 100_000), default=5,
                   help="prompts (default 5, the artifact's protocol)")
    p.add_argument("--prefix-tokens", type=_count(1, 1 << 20), default=16, help="prompt length in tokens (default 16)")


def _cores() -> int:
    """The cores this process may run on (its CPU affinity, which a batch scheduler sets), not the machine's."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_count(1, 1024), default=_cores(), metavar="N",
                   help="torch threads for the numerics (default: the cores available, here %(default)s); part of "
                        "the numerics, so records and model cards state it and the workflow fixes it")


class _SystemNames:
    """The registered systems' names as argparse `choices`, looked up when first needed: the registry imports torch,
    which `specter --help` and the torch-free commands should not wait for."""

    def _names(self) -> list[str]:
        from specter.systems import registry

        return sorted(registry())

    def __contains__(self, name) -> bool:
        return name in self._names()

    def __iter__(self):
        return iter(self._names())


def _system_list(text: str) -> str:
    """An argparse type for --systems: comma-separated registered names (the message names the first unknown one)."""
    names = _SystemNames()._names()
    for name in (n.strip() for n in text.split(",")):
        if name not in names:
            raise argparse.ArgumentTypeError(f"unknown system {name!r}: give comma-separated names from "
                                             f"{', '.join(names)}")
    return text


def set_threads(args: argparse.Namespace) -> None:
    """Pin the thread count a command computes with (`--threads`) before it computes."""
    from specter import determinism

    determinism.use(args.threads)
