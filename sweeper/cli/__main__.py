"""``python -m sweeper.cli``: the ``sweep`` command."""

import sys

from sweeper.cli import main

sys.exit(main())
