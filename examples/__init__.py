"""Examples of embedding zmq_rl (run them from the repository root with ``python -m``)."""
