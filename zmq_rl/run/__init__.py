"""The engine of one training run, between the faces (``zmq_rl.api``, ``zmq_rl.cli``)
and the learner and actor wings: how a fleet of actors and the learner meet
(:mod:`zmq_rl.run.fleet`). Imports the learner and actor wings, never the faces."""
