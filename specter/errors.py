"""The one exception type for bad user input: the CLI prints its message on one line and exits with code 2."""


class SpecterError(Exception):
    """Bad input or an impossible request. The message names the bad value and says how to fix it."""

    exit_code = 2
