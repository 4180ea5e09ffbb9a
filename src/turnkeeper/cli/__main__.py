"""`python -m turnkeeper.cli`: the `turnkeeper` command."""

import sys

from turnkeeper.cli._main import main

sys.exit(main())
