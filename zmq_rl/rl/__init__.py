"""The learning maths: advantages, targets, PPO, the trainer, policies and networks.

No sockets: it imports only the wire wing and the top-level helpers below it.
"""
