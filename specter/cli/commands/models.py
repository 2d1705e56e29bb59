"""`specter models`: list the supported MoE architectures."""

from __future__ import annotations

import argparse

NAME = "models"
HELP = "list the supported MoE architectures"
EXAMPLE = "specter models"


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass  # no flags of its own


def main(args: argparse.Namespace) -> int:
    from specter.models.adapter import ARCHITECTURES

    width = max(len(k) for k in ARCHITECTURES)
    for model_type, spec in sorted(ARCHITECTURES.items()):
        print(f"{model_type:<{width}}  {spec.name}")
    return 0
