"""Trained and training policies outside the learner: loading, exporting and
evaluating a trained policy (:mod:`zmq_rl.serving.deploy`), and remote inference for
simulators that cannot run torch (:mod:`zmq_rl.serving.serve`, ``zmq-rl serve``).

Built on the actor and learner wings (a served simulator is an actor; a policy file is
what the learner writes); nothing below imports it.
"""
