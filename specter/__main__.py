"""`python -m specter` is the `specter` console script."""

from specter.interrupt import exit_process, install

install()  # the first instruction: a Ctrl-C from here on exits 130 with one line (see specter/interrupt.py)

from specter.cli import main  # noqa: E402

exit_process(main())  # not sys.exit: see exit_process
