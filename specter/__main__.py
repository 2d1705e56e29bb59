"""`python -m specter` is the `specter` console script."""

import sys

from specter.cli import main

sys.exit(main())
