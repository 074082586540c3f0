"""torchrun for preemptible pods (the PyTorchJob container's command): the command line; the step itself is :mod:`kubetune_trainer.training.launch`.

    python -m kubetune_trainer.launch --nproc_per_node 8 -m kubetune_trainer.train --config /etc/kubetune/config.yaml

The operator builds this command (``kubetune_operator.builders``); the module's name is part of
that contract, so the command stays here while the code lives in its room.
"""

import sys

from kubetune_trainer.training.launch import main

if __name__ == "__main__":
    sys.exit(main())
