"""The command-line programs: ``zmq-learner``, ``zmq-actor`` and ``zmq-rl``.

* :mod:`zmq_rl.cli.learner` -- ``zmq-learner``: the learner alone (actors elsewhere);
* :mod:`zmq_rl.cli.actor` -- ``zmq-actor``: one actor for a learner at ``--learner``;
* :mod:`zmq_rl.cli.main` -- ``zmq-rl``: ``run`` (learner + local actors), ``eval``,
  ``plot``;
* :mod:`zmq_rl.cli.flags` -- flags and TOML files generated from :mod:`zmq_rl.config`.

Exit codes: 0 done, 1 run-time failure, 2 bad configuration, 130 interrupted.
"""
