"""The preparation step (a CPU Job before any GPU pod): the command line; the step itself is :mod:`kubetune_trainer.preparation.prepare`.

    python -m kubetune_trainer.prepare --config /etc/kubetune/config.yaml

The operator builds this command (``kubetune_operator.builders``); the module's name is part of
that contract, so the command stays here while the code lives in its room.
"""

import sys

from kubetune_trainer.preparation.prepare import main

if __name__ == "__main__":
    sys.exit(main())
