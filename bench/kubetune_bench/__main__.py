"""``python -m kubetune_bench``: what ``kubetune bench`` runs, and each case's own process."""

import sys

from .cli import main

sys.exit(main())
