"""One module per `specter` command, as `specter --help` lists them: each holds its name (`NAME`), its one-line help
(`HELP`), a worked example (`EXAMPLE`), its flags (`add_arguments`) and what it does (`main`: call one library
function with the parsed flags and print its outcome). A command's heavy imports (torch, the runs, the report) sit
inside its `main`, so the parser starts without them."""

from __future__ import annotations

import importlib
from types import ModuleType

#: the commands' modules, in the order `specter --help` lists them
COMMANDS = ("models", "systems", "architectures", "plan_memory", "inspect_model", "routing_stats", "build_model",
            "quantize", "fidelity", "run", "compare", "sweep", "aggregate", "plot", "summary", "diff", "hardware",
            "profile_bandwidth")


def modules() -> list[ModuleType]:
    """The commands' modules, in `COMMANDS`' order."""
    return [importlib.import_module(f"{__name__}.{name}") for name in COMMANDS]
