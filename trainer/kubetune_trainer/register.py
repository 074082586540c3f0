"""The registration step (a batch/v1 Job after training, no GPU): the command line; the step itself is :mod:`kubetune_trainer.registration.register`.

    python -m kubetune_trainer.register --config /etc/kubetune/config.yaml

The operator builds this command (``kubetune_operator.builders``); the module's name is part of
that contract, so the command stays here while the code lives in its room.
"""

import sys

from kubetune_trainer.registration.register import main

if __name__ == "__main__":
    sys.exit(main())
