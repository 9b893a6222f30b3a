"""Conformance to the wire protocol (docs/protocol.md section 11).

* :mod:`zmq_rl.conformance.vectors`: the golden vectors (valid frames of every message
  type and space kind, and invalid frames with the reject they must produce), their
  language-neutral JSON view, and the generator of ``docs/protocol/vectors/``;
* :mod:`zmq_rl.conformance.actor`: ``zmq-rl conformance actor -- CMD ...``, a scripted
  learner that drives an actor command through the page's clauses;
* :mod:`zmq_rl.conformance.learner`: ``zmq-rl conformance learner HOST:PORT``, a
  well-behaved and several misbehaving actors played against a running learner;
* :mod:`zmq_rl.conformance.report`: the clause lines and the JSON report they share.
"""
