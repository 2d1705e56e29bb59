"""`specter hardware`: show hardware profiles: the presets, or the given preset names or YAML files."""

from __future__ import annotations

import argparse

NAME = "hardware"
HELP = "show hardware profiles: the presets, or the given preset names or YAML files"
EXAMPLE = "specter hardware a100-40gb-pcie4 my-profile.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("profiles", nargs="*", metavar="PRESET|FILE",
                   help="what every --hardware option takes: a preset name or a profile YAML (default: all presets)")


def main(args: argparse.Namespace) -> int:
    from specter.timing.hardware import load_profile, preset_names, profile_summary

    for name in args.profiles or preset_names():
        print(profile_summary(load_profile(name)))
    return 0
