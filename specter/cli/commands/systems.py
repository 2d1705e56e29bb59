"""`specter systems`: the systems `run --system` takes: what each does and its options."""

from __future__ import annotations

import argparse

NAME = "systems"
HELP = "the systems `run --system` takes: what each does and its options"
EXAMPLE = "specter systems"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass  # no flags of its own


def main(args: argparse.Namespace) -> int:
    import inspect

    from specter.systems import registry

    for name, cls in sorted(registry().items()):
        own = cls.__dict__.get("__doc__")  # the class's own docstring (not System's), else its module's
        doc = inspect.cleandoc(own) if own else inspect.getdoc(inspect.getmodule(cls)) or ""
        summary = " ".join(doc.split("\n\n")[0].split()).removeprefix(f"`{name}`: ")  # a module docstring names it
        kind = ("speculative" + (", own draft and KV" if cls.separate_draft else "")) if cls.speculative else \
            "one token a pass"
        print(f"{name}: {summary} [{kind}]")
        for option, (_kind, default, text, *_bounds) in cls.options.items():
            print(f"  --system-option {option}=...  {text} (default {default})")
    return 0
