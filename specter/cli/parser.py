"""The `specter` command line's parser: one subcommand for each module of `specter.cli.commands` (its flags, its
example, what it does), the flags every command shares, and the suite's one-line argparse errors."""

from __future__ import annotations

import argparse
import sys

from specter import __version__
from specter.cli.commands import modules

#: one worked example per subcommand, shown at the end of its --help (paths as the workflow lays them out)
EXAMPLES = {command.NAME: command.EXAMPLE for command in modules()}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="specter", description="Offloaded mixture-of-experts inference benchmark suite.",
                     epilog="`specter COMMAND --help` shows a command's options and an example.")
    parser.add_argument("--version", action="version", version=f"specter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in modules():
        p = sub.add_parser(command.NAME, help=command.HELP)
        command.add_arguments(p)
        p.set_defaults(func=command.main)
        noise = p.add_mutually_exclusive_group()
        noise.add_argument("-q", "--quiet", action="store_const", dest="verbosity", const=-1, default=0,
                           help="warnings and errors only: no phases or progress")
        noise.add_argument("-v", "--verbose", action="store_const", dest="verbosity", const=1,
                           help="debug lines too")
        p.formatter_class = _HelpFormatter  # keeps the example's lines as written
        p.epilog = "example:\n" + "\n".join(f"  {line}" for line in command.EXAMPLE.split("\n"))
    return parser


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The example's lines as written, and option help wrapped between words only (a name such as moe-infinity is
    never split at its hyphen)."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _Parser(argparse.ArgumentParser):
    """argparse with the suite's one-line errors: `specter: error: ...` and exit code 2 (no usage block)."""

    def error(self, message: str):
        sub = self.prog.removeprefix("specter").strip()
        print(f"specter: error: {sub + ': ' if sub else ''}{message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)
