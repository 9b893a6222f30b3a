"""Trained policies outside training: load one (:func:`load_policy`), act with it
(:meth:`DeployedPolicy.predict`), and export it (:func:`export_policy`) to a file
that runs without zmq_rl -- ONNX, TorchScript, or safetensors weights.

A run writes ``policy.pt`` (tensors, the policy config as JSON, the env id,
``gym.make`` kwargs and wrappers); its checkpoints hold the same. Both are read
with ``torch.load(weights_only=True)``: nothing but tensors and primitive values
is unpickled.

:class:`DeployedPolicy` is a plain :class:`torch.nn.Module` whose ``forward`` is
the deterministic action graph: observation batch ``[B, *obs_shape]`` (float32) ->
actions (int64 ``[B]`` for Discrete, float32 ``[B, act_dim]`` clipped to the Box
bounds), observation normalisation folded in. That graph is what the exports
hold, so an exported file acts exactly as ``predict(obs, deterministic=True)``.
"""

from __future__ import annotations

import copy
import json
import logging
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .config import PolicyConfig, parse_env_kwargs
from .learner.checkpoint import config_dict
from .rl.policy import OBS_CLIP, OBS_NORM_EPS, ActorCritic, build_policy

__all__ = [
    "EXPORT_FORMATS",
    "DeployedPolicy",
    "ExportUnavailable",
    "PolicyFileError",
    "SavedPolicy",
    "export_policy",
    "load_policy",
    "read_policy_file",
]

log = logging.getLogger(__name__)

POLICY_NAME = "policy.pt"
EXPORT_FORMATS = ("onnx", "torchscript", "safetensors")
"""The formats of :func:`export_policy` (and ``zmq-rl export --format``)."""
ONNX_OPSET = 17
NOT_OURS = (
    "not a policy.pt or checkpoint written by zmq_rl (a run dir's policy.pt, or its "
    "checkpoints/ckpt-N.pt)"
)


class ExportUnavailable(ImportError):
    """The package an export format needs is not installed (the message says which)."""


class PolicyFileError(ValueError):
    """A policy file is missing, unreadable, or was not written by zmq_rl; the
    message names the file and the reason."""


@dataclass
class SavedPolicy:
    """What a ``policy.pt`` or checkpoint holds: the weights and what rebuilds the network."""

    path: Path
    config: PolicyConfig
    env_id: str
    weights: dict[str, torch.Tensor]
    version: int = 0
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: list[str] = field(default_factory=list)


def policy_path(target: str | Path) -> Path:
    """``RUN_DIR`` -> ``RUN_DIR/policy.pt``; a file is returned as is. PolicyFileError
    when there is no such file."""
    path = Path(target)
    if path.is_dir():
        path = path / POLICY_NAME
    if not path.is_file():
        raise PolicyFileError(
            f"{path}: no such policy file (a run writes {POLICY_NAME} when it ends; "
            "a checkpoint, RUN_DIR/checkpoints/ckpt-N.pt, can be loaded too)"
        )
    return path


def _load_error(exc: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in one line."""
    text = str(exc)
    if isinstance(exc, pickle.UnpicklingError) and "Unsupported global" in text:
        return "it holds Python objects besides tensors"
    if "zip archive" in text or "central directory" in text:
        return "the file is truncated or corrupt"
    if isinstance(exc, EOFError):
        return "the file is empty or truncated"
    return "not a torch file"


def read_policy_file(target: str | Path) -> SavedPolicy:
    """Read a run dir's ``policy.pt``, a ``policy.pt`` or a checkpoint
    (``checkpoints/ckpt-N.pt``) without building anything; PolicyFileError naming
    the file when it is none of those."""
    path = policy_path(target)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated file or not a torch file at all
        raise PolicyFileError(f"{path}: {NOT_OURS}: {_load_error(exc)}") from None
    if not isinstance(state, dict):
        raise PolicyFileError(f"{path}: {NOT_OURS}; it holds a {type(state).__name__}")
    try:
        if "trainer" in state and "learner_config" in state:  # Learner.checkpoint()
            learner = json.loads(state["learner_config"])
            env_id = str(learner["env_id"])
            env_kwargs = parse_env_kwargs(str(learner.get("env_kwargs", "")))
            wrappers = list(learner.get("wrappers", []))
            weights = state["trainer"]["policy"]
        else:  # Learner.save_policy()
            env_id = str(state["env_id"])
            env_kwargs = json.loads(state.get("env_kwargs", "{}"))
            wrappers = json.loads(state.get("wrappers", "[]"))
            weights = state["policy"]
        raw = json.loads(state["policy_config"])
        raw["hidden_sizes"] = tuple(raw["hidden_sizes"])
        config = PolicyConfig(**raw).validate()
        version = int(state.get("version", 0))
    except (KeyError, TypeError, ValueError) as exc:
        missing = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise PolicyFileError(f"{path}: {NOT_OURS} ({missing})") from None
    return SavedPolicy(path, config, env_id, weights, version, dict(env_kwargs), list(wrappers))


class DeployedPolicy(nn.Module):
    """A trained policy as a plain :class:`torch.nn.Module`.

    ``forward(obs)`` maps a float32 observation batch ``[B, *obs_shape]`` to
    deterministic actions: int64 ``[B]`` (Discrete: the argmax) or float32
    ``[B, act_dim]`` (Box: the Gaussian mean clipped to the bounds). Observation
    normalisation (``--normalize-obs``) is part of the graph, as float32 constants.
    :meth:`predict` is the numpy convenience around it (one observation or a
    batch; ``deterministic=False`` samples as the actors do).

    Attributes: ``network`` (the trained actor-critic), ``env_id``, ``env_kwargs``,
    ``wrappers`` (what :meth:`make_env` builds), ``observation_space``,
    ``action_space``, ``version``.
    """

    def __init__(
        self,
        network: nn.Module,
        observation_space: gym.Space,
        action_space: gym.Space,
        env_id: str = "",
        env_kwargs: dict[str, Any] | None = None,
        wrappers: list[str] | None = None,
        version: int = 0,
    ) -> None:
        super().__init__()
        self.network = network.eval()
        self.observation_space = observation_space
        self.action_space = action_space
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.wrappers = list(wrappers or [])
        self.version = version
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        self._mlp = isinstance(network, ActorCritic)
        if self._mlp and network.normalize_obs:
            std = torch.sqrt(network.obs_var + OBS_NORM_EPS).to(torch.float32)
            self.register_buffer("obs_mean", network.obs_mean.to(torch.float32).clone())
            self.register_buffer("obs_std", std.clone())
        if not self.discrete:
            low = np.asarray(action_space.low, np.float32).reshape(-1)
            high = np.asarray(action_space.high, np.float32).reshape(-1)
            self.register_buffer("action_low", torch.from_numpy(low.copy()))
            self.register_buffer("action_high", torch.from_numpy(high.copy()))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Deterministic actions for a float32 observation batch (see the class doc)."""
        net = self.network
        if self._mlp:
            x = obs.reshape(obs.shape[0], -1).to(net.policy_head.weight.dtype)
            if hasattr(self, "obs_mean"):
                x = ((x - self.obs_mean) / self.obs_std).clamp(-OBS_CLIP, OBS_CLIP)
            trunk = net.trunk if net.shared_trunk else net.actor_trunk
            params = F.linear(net._run(trunk, x), net.policy_head.weight, net.policy_head.bias)
            if self.discrete:
                return params.argmax(dim=-1)
            action = params
        else:  # a custom factory's network: its own deterministic act()
            action = net.act(obs, deterministic=True)[0]
            if self.discrete:
                return action
        return torch.maximum(torch.minimum(action, self.action_high), self.action_low)

    @torch.no_grad()
    def predict(self, obs: Any, deterministic: bool = True) -> np.ndarray:
        """The action for one observation (shaped as the observation space) or a batch
        of them, as numpy: an int64 scalar / ``[B]`` (Discrete) or float32
        ``[act_dim]`` / ``[B, act_dim]`` (Box, clipped to its bounds).

        ``deterministic=False`` samples from the policy (as an actor does). Unlike
        Stable-Baselines3's ``predict``, this returns the action alone, not
        ``(action, state)``.
        """
        array = np.asarray(obs, dtype=np.float32)
        shape = tuple(self.observation_space.shape or ())
        single = array.shape == shape
        batch = torch.from_numpy(array[None] if single else array)
        if deterministic:
            action = self(batch)
        else:
            action = self.network.act(batch)[0]
            if not self.discrete:
                action = torch.maximum(torch.minimum(action, self.action_high), self.action_low)
        out = action.numpy()
        return out[0] if single else out

    def make_env(self, **make_kwargs: Any) -> gym.Env:
        """The env this policy was trained on (same kwargs and wrappers);
        ``make_kwargs`` such as ``render_mode="human"`` are added."""
        from .envs import make_env

        return make_env(self.env_id, self.env_kwargs, self.wrappers, **make_kwargs)


def load_policy(target: str | Path, env_id: str = "") -> DeployedPolicy:
    """Load a trained policy: ``target`` is a run directory, its ``policy.pt``, or a
    checkpoint (``RUN_DIR/checkpoints/ckpt-N.pt``).

    The env is made once (with the run's ``env_kwargs`` and wrappers) for its
    spaces; ``env_id`` overrides the saved id (a variant with the same spaces).
    Returns a :class:`DeployedPolicy`, a ``torch.nn.Module`` in eval mode with
    :meth:`~DeployedPolicy.predict`. Raises :class:`PolicyFileError` for a missing
    or foreign file or weights that do not fit the env, and
    :class:`~zmq_rl.envs.EnvBuildError` when the env cannot be made.
    """
    from .envs import make_env

    saved = read_policy_file(target)
    env_id = env_id or saved.env_id
    env = make_env(env_id, saved.env_kwargs, saved.wrappers)
    try:
        spaces = (env.observation_space, env.action_space)
    finally:
        env.close()
    network = build_policy(*spaces, saved.config)
    try:
        network.load_state_dict(saved.weights)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PolicyFileError(
            f"{saved.path}: the weights do not fit env {env_id}: {first}"
        ) from None
    network.eval()
    deployed = DeployedPolicy(
        network, *spaces, env_id, saved.env_kwargs, saved.wrappers, saved.version
    )
    deployed.eval()
    deployed.source = saved  # type: ignore[attr-defined]  (path and config, for callers)
    return deployed


# -- export -----------------------------------------------------------------------------


def _example_batch(policy: DeployedPolicy, batch: int = 2) -> torch.Tensor:
    space = policy.observation_space
    sample = np.stack([space.sample() for _ in range(batch)]).astype(np.float32)
    return torch.from_numpy(sample)


def _metadata(policy: DeployedPolicy, fmt: str) -> dict[str, str]:
    """What a deployment needs to know besides the graph, as strings."""
    space = policy.action_space
    action = (
        {"type": "discrete", "n": int(space.n)}
        if policy.discrete
        else {
            "type": "box",
            "shape": list(space.shape),
            "low": np.asarray(space.low).tolist(),
            "high": np.asarray(space.high).tolist(),
        }
    )
    source = getattr(policy, "source", None)
    return {
        "format": f"zmq_rl-policy-{fmt}",
        "env_id": policy.env_id,
        "env_kwargs": json.dumps(policy.env_kwargs),
        "wrappers": json.dumps(policy.wrappers),
        "observation_shape": json.dumps(list(policy.observation_space.shape or ())),
        "action": json.dumps(action),
        "version": str(policy.version),
        "policy_config": json.dumps({} if source is None else config_dict(source.config)),
        "input": "obs: float32 [batch, *observation_shape]",
        "output": "action: int64 [batch] (discrete) or float32 [batch, act_dim] (box)",
    }


def export_onnx(policy: DeployedPolicy, out: Path) -> None:
    """Write the deterministic action graph as ONNX (input ``obs``, output ``action``,
    dynamic batch size, opset :data:`ONNX_OPSET`), with the metadata as
    ``metadata_props``. Uses torch's TorchScript-based exporter, which needs the
    ``onnx`` package (``pip install 'zmq_rl[export]'``) but not onnxscript."""
    import importlib.util
    import warnings

    if importlib.util.find_spec("onnx") is None:
        raise ExportUnavailable(
            "ONNX export needs the onnx package: pip install 'zmq_rl[export]' (or pip "
            "install onnx); --format torchscript and safetensors need nothing more"
        )
    example = _example_batch(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            policy,
            (example,),
            str(out),
            dynamo=False,
            input_names=["obs"],
            output_names=["action"],
            dynamic_axes={"obs": {0: "batch"}, "action": {0: "batch"}},
            opset_version=ONNX_OPSET,
        )
    import onnx

    model = onnx.load(str(out))
    for key, value in _metadata(policy, "onnx").items():
        model.metadata_props.add(key=key, value=value)
    onnx.save(model, str(out))


def export_torchscript(policy: DeployedPolicy, out: Path) -> None:
    """Write the deterministic action graph as a traced TorchScript module
    (``torch.jit.load(path)(obs)``; C++: ``torch::jit::load``), metadata in its
    ``extra_files["zmq_rl.json"]``."""
    import warnings

    example = _example_batch(policy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings on shape checks, deprecations
        frozen = copy.deepcopy(policy).requires_grad_(False)  # outputs need no .detach()
        traced = torch.jit.trace(frozen, (example,), check_trace=False)
        extra = {"zmq_rl.json": json.dumps(_metadata(policy, "torchscript"))}
        torch.jit.save(traced, str(out), _extra_files=extra)


def _safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors format (a little-endian u64 header size, a JSON header, raw
    little-endian data), written directly so no extra package is needed."""
    dtypes = {
        torch.float32: "F32",
        torch.float64: "F64",
        torch.int64: "I64",
        torch.int32: "I32",
        torch.float16: "F16",
    }
    header: dict[str, Any] = {"__metadata__": metadata}
    chunks, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        data = tensor.numpy().astype(tensor.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": dtypes[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def export_safetensors(policy: DeployedPolicy, out: Path) -> None:
    """Write the deploy graph's tensors (actor trunk, policy head, normalisation
    constants, action bounds; no critic, no optimiser) as safetensors, with the
    architecture in the header's ``__metadata__`` so another framework can rebuild it."""
    tensors = {
        name: value
        for name, value in policy.state_dict().items()
        if "critic_trunk" not in name
        and "value_head" not in name
        and not name.startswith("network.obs_")
    }
    metadata = _metadata(policy, "safetensors")
    if policy._mlp:
        net = policy.network
        cfg = getattr(policy, "source", None)
        metadata["architecture"] = (
            f"x = obs.reshape(B, -1); x = clamp((x - obs_mean) / obs_std, -{OBS_CLIP:g}, "
            f"{OBS_CLIP:g}) if obs_mean present; for each Linear in "
            f"network.{'trunk' if net.shared_trunk else 'actor_trunk'}: x = "
            f"{cfg.config.activation if cfg else 'activation'}(x @ W.T + b); "
            "out = x @ network.policy_head.weight.T + bias; discrete: argmax(out); "
            "box: clip(out, action_low, action_high)"
        )
    Path(out).write_bytes(_safetensors_bytes(tensors, metadata))


def export_policy(
    target: str | Path | DeployedPolicy, fmt: str, out: str | Path, env_id: str = ""
) -> Path:
    """Export a trained policy (a run dir, ``policy.pt``, checkpoint, or a loaded
    :class:`DeployedPolicy`) as ``fmt`` (one of :data:`EXPORT_FORMATS`) to ``out``;
    return the path. The file needs no zmq_rl: ONNX runs in onnxruntime (C, C++,
    C#, Java, JS, ...), TorchScript in torch / libtorch; safetensors holds the
    weights and the architecture as metadata."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format={fmt!r}: must be one of {', '.join(EXPORT_FORMATS)}")
    policy = target if isinstance(target, DeployedPolicy) else load_policy(target, env_id)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    {"onnx": export_onnx, "torchscript": export_torchscript, "safetensors": export_safetensors}[
        fmt
    ](policy, path)
    log.info("exported %s policy to %s", fmt, path)
    return path
