"""The layers the built-in networks are made of (:mod:`zmq_rl.rl.policy`'s MLP and
:mod:`zmq_rl.rl.networks`' structured and recurrent ones): an initialised linear layer
and the MLP trunk. Both network modules import this one, neither imports the other
for it."""

from __future__ import annotations

import math

from torch import nn

from ..config import PolicyConfig

__all__ = ["ACTIVATIONS", "layer", "trunk"]

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}
"""``PolicyConfig.activation`` -> the activation module after each trunk layer."""


def layer(in_features: int, out_features: int, gain: float, ortho: bool) -> nn.Linear:
    """A linear layer, orthogonally initialised with ``gain`` and zero bias if ``ortho``."""
    linear = nn.Linear(in_features, out_features)
    if ortho:
        nn.init.orthogonal_(linear.weight, gain=gain)
        nn.init.zeros_(linear.bias)
    return linear


def trunk(in_features: int, cfg: PolicyConfig) -> nn.Sequential:
    """An MLP ``in_features -> hidden_sizes`` with the configured activation after each layer."""
    layers: list[nn.Module] = []
    width = in_features
    for hidden in cfg.hidden_sizes:
        layers.append(layer(width, hidden, math.sqrt(2.0), cfg.ortho_init))
        layers.append(ACTIVATIONS[cfg.activation]())
        width = hidden
    return nn.Sequential(*layers)
