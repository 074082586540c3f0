"""One training process (one per GPU under torchrun): the command line; the step itself is :mod:`kubetune_trainer.training.train`.

    python -m kubetune_trainer.train --config /etc/kubetune/config.yaml

The operator builds this command (``kubetune_operator.builders``); the module's name is part of
that contract, so the command stays here while the code lives in its room.
"""

import sys

from kubetune_trainer.training.train import main

if __name__ == "__main__":
    # Leave through the normal path on success; a preempted run must not look like one.
    sys.exit(main())
