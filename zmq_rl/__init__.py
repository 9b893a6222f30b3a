"""zmq_rl: a distributed reinforcement-learning toolkit over ZeroMQ."""
