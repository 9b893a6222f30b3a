"""The learning maths: advantages, targets, PPO, the trainer, policies and networks,
and where torch runs (device).

No sockets: it imports only the wire wing and the ground below it (config).
"""
