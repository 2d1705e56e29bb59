"""`python -m specter` is the `specter` console script."""

from specter.interrupt import install

install()  # the first instruction: a Ctrl-C from here on exits 130 with one line (see specter/interrupt.py)

import sys  # noqa: E402

from specter.cli import main  # noqa: E402

sys.exit(main())
