"""The one exception type for bad user input: the CLI prints its message on one line and exits with code 2."""


class SpecterError(Exception):
    """Bad input or an impossible request. The message names the bad value and says how to fix it."""

    exit_code = 2


class BudgetError(SpecterError):
    """A device budget that cannot hold what a system must keep resident (a sweep skips such a run and says so)."""
