"""``python -m tools.bench``: ``make bench`` (see ``tools.bench.protocol``)."""

import sys

from tools.bench.protocol import main

sys.exit(main())
