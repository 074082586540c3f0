"""``python -m kubetune_bench``: what ``kubetune bench`` runs, and each case's own process."""

import sys

from .bench import main

sys.exit(main())
