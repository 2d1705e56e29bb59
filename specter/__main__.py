"""`python -m specter` is the `specter` console script."""

import sys

try:
    from specter.cli import main
except KeyboardInterrupt:  # interrupted while Python imports the suite: nothing has started
    print("specter: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
