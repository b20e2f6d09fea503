"""``python -m benchmarks``: see :mod:`benchmarks` (``scripts/bench`` runs it)."""

import sys

from benchmarks import main

sys.exit(main())
