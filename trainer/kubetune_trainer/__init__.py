"""kubetune's trainer: what runs in the job's pods, in rooms by what happens.

The steps, each a room, none importing another:

- :mod:`.preparation`: the CPU step before any GPU pod (download once, check, tokenize, estimate, refuse);
- :mod:`.training`: one training process (build the model, data and TRL trainer; train; checkpoints,
  failures, progress);
- :mod:`.registration`: the step after training (the model into MLflow, under the evaluation gate).

What they share, below them (a shared room never imports a step):

- :mod:`.process`: the process's rank, logging and trainer config;
- :mod:`.sources`: where the model and the data come from (chained jobs' starting model, the data
  check, what preparation left on the volume);
- :mod:`.plan`: the run plan and the preflight estimate;
- :mod:`.volume`: the checkpoints on the job's volume, their catalog, the resume decision;
- :mod:`.mlflow`: the job's MLflow run, the retrying client, training's tracker;
- :mod:`.settings`: every environment variable the trainer reads.

The command lines the operator builds stay at the top (``python -m kubetune_trainer.prepare``,
``.train``, ``.launch``, ``.register``; ``.tiny`` and ``.tiny_data`` build the project's tiny model
and data), each a few lines calling into its room.
"""
