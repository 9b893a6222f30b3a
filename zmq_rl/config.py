"""Validated run configuration: the learner, the actor, PPO and the policy network.

Every field carries its help text in ``metadata["help"]`` so that the command-line
flags (:mod:`zmq_rl.cli.flags`) and TOML files are generated from the dataclasses:
a field cannot exist in one place and not the other. Derived sizes come from
methods (``num_updates()``, ``effective_max_lead_steps()``, ``steps_per_broadcast()``),
never by writing back into the config.

``validate()`` on each dataclass is the one place where values are checked. It
raises :class:`ConfigError`, whose message names the field and the offending value.

The learner's rules: counts are >= 1, the budget covers at least one update,
``gamma``, ``gae_lambda`` and ``vtrace_lambda`` lie in (0, 1], the V-trace clips are
positive even when V-trace is off (a config must not become invalid by switching it
on), a lead budget is 0 (derived) or at least one broadcast cycle, and ``device``
names a device this machine has (``cuda`` on a machine without CUDA is an error here,
not a crash mid-run).
"""

from __future__ import annotations

import dataclasses
import json as _json
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import InitVar, asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ._moved import moved_attribute

if TYPE_CHECKING:
    import torch

__all__ = [
    "ActorConfig",
    "ConfigError",
    "LearnerConfig",
    "PPOConfig",
    "PolicyConfig",
    "ServeConfig",
    "check_device_name",
    "parse_env_kwargs",
    "parse_wrapper",
    "resolve_device",
    "toml_env_value",
    "wrapper_spec",
]


def __getattr__(name: str) -> Any:
    """``zmq_rl.config.ActorThrottle``, now :class:`zmq_rl.wire.valve.ActorThrottle`, with
    a DeprecationWarning (:func:`zmq_rl._moved.moved_attribute`)."""
    return moved_attribute(__name__, name)


OBJECTIVES = ("ppo", "decoupled", "impact")
"""The policy surrogates of ``PPOConfig.objective`` (:mod:`zmq_rl.rl.ppo`)."""

DEFAULT_PORT = 5555
"""The learner's control (ROUTER) port; experience is on +1 and weights on +2."""


class ConfigError(ValueError):
    """A configuration value is invalid. ``field`` names it, ``value`` holds it."""

    def __init__(self, field_name: str, value: Any, reason: str) -> None:
        super().__init__(f"{field_name}={value!r}: {reason}")
        self.field = field_name
        self.value = value
        self.reason = reason


def parse_env_kwargs(text: str, field_name: str = "env_kwargs") -> dict[str, Any]:
    """The keyword arguments of ``gym.make`` from their text form (``--env-kwargs``).

    Either a JSON object (``'{"gravity": -5.0, "enable_wind": true}'``) or
    ``key=value,key=value`` (``xs=[1,2]`` keeps its list) where each value is read
    as JSON when it parses (``5``, ``-1.5``, ``true``, ``null``, ``[1,2]``) and kept
    as a string otherwise (``render_mode=rgb_array``). Values must be JSON scalars
    or lists (they travel to remote actors in the welcome). ``""`` is no arguments.
    A malformed text is a :class:`ConfigError` naming ``field_name`` and the text.
    """
    import json

    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(field_name, text, f"not a JSON object: {exc}") from None
        if not isinstance(value, dict):
            raise ConfigError(field_name, text, "must be a JSON object")
        out = value
    else:
        out = {}
        for part in _split_top_level(text):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or not key.isidentifier():
                raise ConfigError(
                    field_name,
                    text,
                    f"{part.strip()!r} is not key=value (use a JSON object for values with commas)",
                )
            raw = raw.strip()
            try:
                out[key] = json.loads(raw)
            except json.JSONDecodeError:
                out[key] = raw
    for key, value in out.items():
        _require(
            isinstance(key, str) and key.isidentifier(),
            field_name,
            text,
            f"key {key!r} is not a Python identifier",
        )
        _require(
            _json_plain(value),
            field_name,
            text,
            f"value of {key!r} must be a number, string, bool, null or a list of them",
        )
    return out


STATEFUL_WRAPPERS = {
    "NormalizeObservation": "--normalize-obs (PolicyConfig.normalize_obs)",
    "NormalizeReward": "--normalize-reward (PPOConfig.normalize_reward)",
}
"""gymnasium wrappers that keep running statistics in each process: every actor and the
evaluator would normalise with its own (training and evaluation returns diverge,
issue 29); the learner's own normalisation keeps one set and ships it with the weights."""


def wrapper_spec(path: str, kwargs: Mapping[str, Any] | None = None) -> str:
    """The text form of a wrapper: ``"module:Name"``, with keyword arguments
    ``"module:Name(key=value,...)"`` (values as JSON). A dotted ``"module.Name"`` (rl-zoo's
    form) becomes ``"module:Name"``. The form travels in the welcome's ``wrappers``."""
    head, paren, tail = path.partition("(")
    if ":" not in head and "." in head:
        module, _, name = head.rpartition(".")
        path = f"{module}:{name}{paren}{tail}"
    if not kwargs:
        return path
    args = ",".join(
        f"{key}={_json.dumps(value, separators=(',', ':'))}" for key, value in kwargs.items()
    )
    return f"{path}({args})"


def parse_wrapper(spec: str, field_name: str = "wrappers") -> tuple[str, dict[str, Any]]:
    """``"module.path:Name"`` or ``"module.path:Name(key=value,...)"`` -> (the import path,
    the keyword arguments the wrapper is called with besides the env).

    The arguments read as ``--env-kwargs`` does (:func:`parse_env_kwargs`, without its
    JSON-object form: a spec holds exactly one ``:``, the protocol's ``module:Name``).
    Refuses gymnasium's stateful normalisation wrappers (:data:`STATEFUL_WRAPPERS`) in
    favour of the learner's. :class:`ConfigError` naming ``field_name`` and the spec.
    """
    if not isinstance(spec, str):
        raise ConfigError(field_name, spec, "must be 'module.path:WrapperName' text")
    path, paren, rest = spec.partition("(")
    path = path.strip()
    if paren and not rest.rstrip().endswith(")"):
        raise ConfigError(field_name, spec, "arguments must end with ')': module:Name(key=value)")
    if spec.count(":") != 1 or not all(part.strip() for part in path.split(":")) or ":" not in path:
        raise ConfigError(
            field_name,
            spec,
            "must be 'module.path:WrapperName' or 'module.path:WrapperName(key=value,...)' "
            "(one ':'; argument values may not contain one)",
        )
    kwargs = parse_env_kwargs(rest.rstrip()[:-1], field_name) if paren else {}
    module, _, name = path.partition(":")
    if name in STATEFUL_WRAPPERS and module.split(".")[0] == "gymnasium":
        raise ConfigError(
            field_name,
            spec,
            "keeps running statistics in each actor and evaluator process, which then "
            "normalise differently from each other (training and evaluation returns diverge); "
            f"use the learner's {STATEFUL_WRAPPERS[name]}, one set of statistics for the run",
        )
    return path, kwargs


def toml_env_value(key: str, value: Any) -> Any:
    """A TOML value of ``env_kwargs`` or ``wrappers`` in the form the config holds:
    a table of env kwargs becomes its JSON text; a wrapper given as a table
    ``{"module:Name" = {key = value}}`` becomes :func:`wrapper_spec`'s text. Other
    keys and values are returned as they are (checked by the caller)."""
    if key in ("policy_map", "policy_hidden_sizes"):
        return policy_map_text(value)
    if key == "env_kwargs" and isinstance(value, dict):
        text = _json.dumps(value)
        parse_env_kwargs(text)  # values the welcome can carry: scalars and lists
        return text
    if key == "wrappers":
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, dict) for item in items):
            out = []
            for item in items:
                if isinstance(item, dict):
                    for path, kwargs in item.items():
                        if not isinstance(kwargs, dict):
                            raise ConfigError(
                                "wrappers",
                                item,
                                "a wrapper table maps 'module:Name' to a table "
                                "of its keyword arguments",
                            )
                        out.append(wrapper_spec(path, kwargs))
                else:
                    out.append(item)
            return out
    return value


POLICY_ID_PATTERN = r"[A-Za-z0-9_.-]{1,64}"
"""What a policy id may be (``policy_map``'s values; the wire's ``check_policy_id``)."""


def parse_policy_map(text: str, field_name: str = "policy_map") -> list[tuple[str, str]]:
    """``policy_map``'s entries ``[(agent pattern, policy id), ...]`` from its text
    ``AGENT=POLICY,AGENT=POLICY`` (``--policy-map player_0=first,player_1=second``).
    An agent pattern is an agent name or an ``fnmatch`` pattern (``pursuer_*=team``);
    the first entry that matches an agent gives its policy. ``""`` is no map (one
    shared policy). A malformed entry or policy id is a :class:`ConfigError` naming
    ``field_name`` and the entry."""
    entries: list[tuple[str, str]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part and not text.strip():
            continue
        agent, sep, policy = (x.strip() for x in part.partition("="))
        _require(
            bool(sep) and bool(agent),
            field_name,
            text,
            f"{part!r} is not AGENT=POLICY (an agent name or pattern, '=', a policy id)",
        )
        _require(
            re.fullmatch(POLICY_ID_PATTERN, policy) is not None,
            field_name,
            text,
            f"policy id {policy!r} of agent {agent!r} must be 1-64 of A-Z a-z 0-9 _ . -",
        )
        _require(
            agent not in (a for a, _ in entries),
            field_name,
            text,
            f"agent {agent!r} is mapped twice",
        )
        entries.append((agent, policy))
    return entries


def parse_policy_hidden_sizes(
    text: str, field_name: str = "policy_hidden_sizes"
) -> dict[str, tuple[int, ...]]:
    """Per-policy hidden layer widths from ``POLICY=64,64;POLICY=256,256`` (policies
    not named keep ``hidden_sizes``). A malformed entry is a :class:`ConfigError`
    naming ``field_name`` and the entry."""
    out: dict[str, tuple[int, ...]] = {}
    for part in (p.strip() for p in text.split(";") if p.strip()):
        policy, sep, sizes = (x.strip() for x in part.partition("="))
        try:
            widths = tuple(int(w) for w in sizes.split(","))
        except ValueError:
            widths = ()
        _require(
            bool(sep) and bool(policy) and bool(widths) and all(w >= 1 for w in widths),
            field_name,
            text,
            f"{part!r} is not POLICY=WIDTH,WIDTH,... (entries separated by ';')",
        )
        _require(policy not in out, field_name, text, f"policy {policy!r} is named twice")
        out[policy] = widths
    return out


def resolve_policy_map(entries: list[tuple[str, str]], agents: list[str], env_id: str) -> list[str]:
    """The policy id of each of ``agents`` (an env's possible agents, in order) under
    ``policy_map``'s ``entries`` (first matching pattern wins). A
    :class:`ConfigError` names the agent that no entry maps, or the entry that maps
    no agent of ``env_id``, so a mapping error is one line before any process
    starts."""
    import fnmatch

    policies = []
    for agent in agents:
        policy = next((p for pat, p in entries if fnmatch.fnmatchcase(agent, pat)), None)
        _require(
            policy is not None,
            "policy_map",
            ",".join(f"{a}={p}" for a, p in entries),
            f"agent {agent!r} of {env_id} has no policy (its agents: {', '.join(agents)})",
        )
        policies.append(policy)
    for pattern, policy in entries:
        _require(
            any(fnmatch.fnmatchcase(a, pattern) for a in agents),
            "policy_map",
            ",".join(f"{a}={p}" for a, p in entries),
            f"entry {pattern}={policy} matches no agent of {env_id} "
            f"(its agents: {', '.join(agents)})",
        )
    return policies


def policy_map_text(value: Any) -> Any:
    """A TOML table ``{agent = "policy"}`` of ``policy_map`` (or of
    ``policy_hidden_sizes``: ``{policy = [64, 64]}``) as the config's text; other
    values unchanged."""
    if not isinstance(value, Mapping):
        return value
    if all(isinstance(v, list) for v in value.values()):
        return ";".join(f"{k}={','.join(str(w) for w in v)}" for k, v in value.items())
    return ",".join(f"{k}={v}" for k, v in value.items())


def _split_top_level(text: str) -> list[str]:
    """Split ``key=value`` pairs at commas outside brackets and quotes (``xs=[1,2]``)."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch == '"':
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _json_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return not isinstance(value, float) or math.isfinite(value)
    if isinstance(value, list):
        return all(_json_plain(v) for v in value)
    return False


def _f(default: Any, help: str, **kwargs: Any) -> Any:
    """A dataclass field with help text (used for --help and docs)."""
    return field(default=default, metadata={"help": help, **kwargs})


def _require(ok: bool, name: str, value: Any, reason: str) -> None:
    if not ok:
        raise ConfigError(name, value, reason)


def _positive_int(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 1,
            name,
            value,
            "must be an integer >= 1",
        )


def _non_negative_int(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        _require(
            isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            name,
            value,
            "must be an integer >= 0",
        )


def _finite(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        _require(
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value),
            name,
            value,
            "must be a finite number",
        )


def _unit_interval(cfg: Any, *names: str) -> None:
    """Check that each named field lies in the half-open interval (0, 1]."""
    _finite(cfg, *names)
    for name in names:
        value = getattr(cfg, name)
        _require(0.0 < value <= 1.0, name, value, "must be in (0, 1]")


def _positive(cfg: Any, *names: str) -> None:
    _finite(cfg, *names)
    for name in names:
        value = getattr(cfg, name)
        _require(value > 0.0, name, value, "must be positive")


def _non_negative(cfg: Any, *names: str) -> None:
    _finite(cfg, *names)
    for name in names:
        value = getattr(cfg, name)
        _require(value >= 0.0, name, value, "must be >= 0")


_CUDA_DEVICE = re.compile(r"cuda(?::(\d+))?")


def check_device_name(name: Any) -> str:
    """Why ``name`` is not a ``device`` setting (``""`` when it is one: auto, cpu,
    cuda or cuda:N with N >= 0). Pure text: the driver is not asked."""
    if not isinstance(name, str):
        return "must be text: auto, cpu, cuda or cuda:N"
    if name in ("auto", "cpu") or _CUDA_DEVICE.fullmatch(name):
        return ""
    return "must be auto, cpu, cuda or cuda:N with N >= 0"


def resolve_device(name: str) -> torch.device:
    """The ``torch.device`` a ``device`` setting names on this machine.

    ``auto`` is ``cuda:0`` when ``torch.cuda.is_available()``, else ``cpu``; ``cuda``
    is ``cuda:0``. :class:`~zmq_rl.config.ConfigError` naming ``device`` and the value
    when the text is not a device setting, when CUDA is asked for and not available,
    or when ``cuda:N`` names a GPU that is not visible.
    """
    import torch  # here, not at the top: configs are read where torch is not needed

    problem = check_device_name(name)
    if problem:
        raise ConfigError("device", name, problem)
    if name == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if name == "auto":
        return torch.device("cuda", 0) if available else torch.device("cpu")
    if not available:
        raise ConfigError(
            "device",
            name,
            "CUDA is not available on this machine (torch "
            f"{torch.__version__}, built with CUDA {torch.version.cuda or 'none'}); "
            "use --device cpu or auto",
        )
    _, _, number = name.partition(":")
    index = int(number) if number else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError("device", name, f"only {count} CUDA device(s) are visible")
    return torch.device("cuda", index)


def _check_device(name: Any) -> None:
    """``device`` is a device setting, and a CUDA one names a GPU this machine has
    (:func:`resolve_device`): a run cannot start on a GPU it lacks.
    Only a CUDA setting imports torch and asks the driver."""
    problem = check_device_name(name)
    _require(not problem, "device", name, problem)
    if name not in ("auto", "cpu"):
        resolve_device(name)


@dataclass(frozen=True)
class PolicyConfig:
    """The actor-critic network: the built-in MLP (zmq_rl/rl/policy.py) or a custom factory."""

    hidden_sizes: tuple[int, ...] = _f((64, 64), "hidden layer widths of the MLP trunks")
    activation: str = _f("tanh", "hidden activation: tanh or relu", choices=("tanh", "relu"))
    shared_trunk: bool = _f(False, "one trunk for actor and critic instead of two")
    ortho_init: bool = _f(True, "orthogonal initialisation (gains sqrt(2), 0.01, 1)")
    log_std_init: float = _f(0.0, "initial log standard deviation of Gaussian actions")
    normalize_obs: bool = _f(
        False,
        "normalise observations by running mean/var (kept by the learner, shipped "
        "inside the weights so actors apply exactly the same transform)",
    )
    policy_type: str = _f(
        "mlp",
        "network of the built-in policy: mlp (feed-forward), lstm or gru (recurrent: "
        "a cell of the last hidden width after the MLP trunk, trained by truncated BPTT "
        "on sequences within fragments; see docs/embedding.md)",
        choices=("mlp", "lstm", "gru"),
    )
    factory: str = _f(
        "", "custom policy 'package.module:callable' (see docs/embedding.md); empty = built-in MLP"
    )

    def validate(self) -> PolicyConfig:
        """Check every field; return self so calls chain."""
        _require(
            isinstance(self.hidden_sizes, tuple)
            and len(self.hidden_sizes) >= 1
            and all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.hidden_sizes
            ),
            "hidden_sizes",
            self.hidden_sizes,
            "must be a non-empty list of integers >= 1",
        )
        _require(
            self.activation in ("tanh", "relu"),
            "activation",
            self.activation,
            "must be 'tanh' or 'relu'",
        )
        _finite(self, "log_std_init")
        _require(
            self.policy_type in ("mlp", "lstm", "gru"),
            "policy_type",
            self.policy_type,
            "must be 'mlp', 'lstm' or 'gru'",
        )
        _require(
            not self.factory or (":" in self.factory and all(self.factory.split(":", 1))),
            "factory",
            self.factory,
            "must be 'package.module:callable'",
        )
        return self


@dataclass(frozen=True)
class PPOConfig:
    """The PPO update (Schulman et al. 2017) run by the learner on each rollout."""

    learning_rate: float = _f(1e-3, "Adam learning rate")
    anneal_lr: bool = _f(True, "anneal the learning rate linearly to 0 over the budget")
    num_epochs: int = _f(20, "passes over each rollout")
    minibatch_size: int = _f(256, "transitions per gradient step (capped at the rollout)")
    num_minibatches: int = _f(
        0,
        "gradient steps per epoch, whatever the rollout's size: each minibatch is "
        "rollout rows / num_minibatches, so more actors mean larger minibatches, not "
        "more steps (CleanRL's and SB3's rule); 0 = use minibatch_size",
    )
    clip_range: float = _f(0.2, "PPO ratio clip epsilon")
    anneal_clip_range: bool = _f(False, "anneal clip_range linearly to 0 over the budget")
    clip_value_loss: bool = _f(False, "clip the value loss around the behaviour values")
    vf_coef: float = _f(0.5, "value loss coefficient")
    ent_coef: float = _f(0.0, "entropy bonus coefficient")
    max_grad_norm: float = _f(0.5, "global gradient-norm clip")
    target_kl: float = _f(0.0, "stop the epochs of an update once approx KL exceeds this; 0 = off")
    normalize_advantages: bool = _f(True, "normalise advantages per minibatch")
    adam_eps: float = _f(1e-5, "Adam epsilon")
    cuda_graphs: bool = _f(
        True,
        "on a CUDA device, run each minibatch step as one captured CUDA graph "
        "(feed-forward policies, target_kl 0, one learner); eager steps elsewhere or "
        "if capture fails (one log line)",
    )
    analytic_gradients: bool = _f(
        True,
        "compute the PPO gradients of the MLP actor-critic in closed form instead of "
        "through autograd (the same numbers; a 64-row CPU step ~1.7x cheaper); the "
        "plain MLP under objective ppo only, autograd elsewhere",
    )
    objective: str = _f(
        "ppo",
        "policy surrogate: ppo (clip pi/mu around the behaviour policy mu), decoupled "
        "(Hilton et al. 2021: clip around the policy at the start of the update, "
        "weight by min(objective_rho_bar, pi_prox/mu)) or impact (Luo et al. 2020: "
        "clip pi/mu around rho = min(objective_rho_bar, pi_target/mu) of a target "
        "network); see docs/design.md",
        choices=OBJECTIVES,
    )
    objective_rho_bar: float = _f(
        1.0,
        "truncation of the behaviour importance weight of the decoupled and impact "
        "objectives (as V-trace's rho_bar); unused by ppo",
    )
    impact_target_update_every: int = _f(
        2, "impact: refresh the target network from the policy every N updates"
    )

    def validate(self) -> PPOConfig:
        """Check every field; return self so calls chain."""
        _positive(self, "learning_rate", "clip_range", "adam_eps", "max_grad_norm")
        _positive(self, "objective_rho_bar")
        _positive_int(self, "num_epochs", "minibatch_size", "impact_target_update_every")
        _non_negative(self, "vf_coef", "ent_coef", "target_kl")
        _non_negative_int(self, "num_minibatches")
        _require(
            self.objective in OBJECTIVES,
            "objective",
            self.objective,
            "must be " + ", ".join(f"'{o}'" for o in OBJECTIVES[:-1]) + f" or '{OBJECTIVES[-1]}'",
        )
        return self


def config_dict(cfg: Any) -> dict[str, Any]:
    """A config dataclass as a JSON-able dict (tuples become lists)."""
    raw = asdict(cfg)
    return {k: list(v) if isinstance(v, tuple) else v for k, v in raw.items()}


@dataclass(frozen=True)
class LearnerConfig:
    """The learner's run: budget, rollout shape, advantages, staleness and sockets.

    A *slot* is one environment instance of one actor; a rollout is
    ``[num_steps, slots]`` where ``slots = sum of every member actor's num_envs``.
    """

    num_actors: int = _f(2, "actors that must register before the first update")
    num_steps: int = _f(
        32,
        "steps per slot in each rollout: every slot's rows (batch_mode slots), or the longest "
        "column of one slot's rows (rows batches)",
    )
    total_env_steps: int = _f(
        100_000,
        "env-step budget (agent steps in a multi-agent env: valid rows); the run ends when it "
        "is consumed: exactly with rows batches (the last one ends at its last env step); "
        "batch_mode slots keeps rollouts whole and ends before the first that would overrun "
        "it, short by less than that rollout's env steps",
    )
    broadcast_every: int = _f(1, "publish new weights after every N updates")
    max_lead_steps: int = _f(
        0,
        "steps per slot an actor may run ahead of proven consumption; 0 = 2 * broadcast_every "
        "* num_steps (rows batches: a grant's lead beyond the rows used of its slots, 0 = "
        "(broadcast_every + 1) * batch_rows over the live slots, never less)",
    )
    batch_mode: str = _f(
        "auto",
        "what one update trains on: rows = batch_rows rows in segments of num_steps from "
        "whichever slots delivered (more actors: more updates per second, same update); "
        "slots = num_steps rows of every member slot (the batch grows with the fleet; "
        "bit-for-bit repeatable with --max-lead-steps at one cycle); auto = rows, or slots "
        "for recurrent policies and num_learners > 1",
        choices=("auto", "rows", "slots"),
    )
    batch_rows: int = _f(
        0,
        "rows per update in rows batches, in whole segments of num_steps; 0 = this config's "
        "num_actors * num_envs * num_steps (per agent of the env), fixed for the run: actors "
        "beyond it add updates, not rows per update. Set it (the presets do) to keep the "
        "batch when you change --actors or --num-envs",
    )
    max_policy_lag: int = _f(
        0,
        "rows batches: rows acted by weights more than this many versions older than the "
        "learner's are dropped (counted discarded/steps/stale); 0 = what the valve "
        "already bounds (docs/design.md section 5.6)",
    )
    gamma: float = _f(0.98, "discount factor")
    gae_lambda: float = _f(0.8, "GAE lambda (validated even when V-trace is on)")
    use_vtrace: bool = _f(False, "V-trace (Espeholt et al. 2018) instead of GAE")
    recompute_values: bool = _f(
        False,
        "GAE on V(s) re-evaluated by the learner's current critic instead of the actors' "
        "behaviour values (V-trace always re-evaluates); see docs/benchmarks.md section 22",
    )
    normalize_reward: bool = _f(
        False, "scale rewards by a running estimate of the discounted return's std"
    )
    vtrace_rho_bar: float = _f(1.0, "V-trace rho clip (eq. 1); checked even when V-trace is off")
    vtrace_c_bar: float = _f(1.0, "V-trace c clip (eq. 1); checked even when V-trace is off")
    vtrace_weight_advantages: bool = _f(
        True,
        "multiply PPO's V-trace advantages by min(rho_bar, rho_s) as IMPALA's policy gradient "
        "does (off: only PPO's ratio pi/mu weights them; see docs/learning-quality.md)",
    )
    vtrace_lambda: float = _f(
        1.0,
        "V-trace trace lambda, c_t = lambda*min(c_bar, rho_t) (IMPALA sec. 4.1); 1 = eq. 1; "
        "with it equal to gae_lambda, V-trace on fresh data gives exactly GAE's targets",
    )
    seed: int = _f(0, "base seed: learner uses seed, actor i samples with seed + 1 + i")

    env_id: str = _f(
        "CartPole-v1",
        "environment: a gymnasium id, 'module:Id' (importing module registers Id), or your "
        "own 'module.path:EnvClass' / 'module.path:make_fn' (see docs/api.md)",
    )
    env_kwargs: str = _f(
        "",
        "keyword arguments of gym.make (or of your env class/function) on the learner, "
        "every actor and the evaluator: a JSON object or key=value,... (values read as JSON)",
    )
    wrappers: tuple[str, ...] = _f(
        (),
        "gymnasium wrapper 'module:Wrapper', or 'module:Wrapper(key=value,...)' with keyword "
        "arguments, applied to the env on actors and evaluator alike; repeat the flag to "
        "stack them (applied in order). Stateful NormalizeReward/NormalizeObservation are "
        "refused: use --normalize-reward / --normalize-obs",
        metavar="MODULE:NAME",
    )
    num_envs: int = _f(
        4,
        "env slots per actor (the default actors are told to run)",
        deprecated_names=("envs_per_actor",),
    )
    fragment_length: int = _f(32, "steps per experience fragment an actor sends")
    host: str = _f("127.0.0.1", "address to bind (use 0.0.0.0 for other hosts)")
    port: int = _f(DEFAULT_PORT, "control port; experience binds port + 1, weights port + 2")
    starvation_timeout: float = _f(
        60.0, "seconds without any rollout progress before the learner gives up"
    )
    eval_every: int = _f(0, "evaluate the policy every N updates; 0 = only at the end")
    eval_episodes: int = _f(20, "deterministic episodes per evaluation")
    opponent_pool: int = _f(
        0,
        "turn-based games: frozen snapshots of the policy the actors keep as opponents "
        "(0 = the latest policy plays itself in every seat)",
    )
    opponent_every: int = _f(10, "policy versions between two snapshots of the opponent pool")
    opponent_choice: str = _f(
        "uniform",
        "which snapshot a game against the pool draws: uniform (over the pool), latest (the "
        "newest), win_rate (prioritised: the snapshots the policy beats least, (1 - win rate)^2)",
        choices=("uniform", "latest", "win_rate"),
    )
    opponent_share: float = _f(
        0.5, "share of games in which one seat is played by a snapshot from the pool"
    )
    opening_moves: int = _f(
        0,
        "turn-based games: each game starts with 0..N uniformly random legal moves (whole "
        "rounds, not recorded), so self-play meets positions its own games never reach "
        "(0 = games start from the empty board)",
    )
    policy_map: str = _f(
        "",
        "multi-agent envs: train several policies, AGENT=POLICY,... (an agent name or an "
        "fnmatch pattern such as 'pursuer_*'; the first match wins; every agent needs one); "
        "empty = one policy shared by every agent",
        metavar="AGENT=POLICY,...",
    )
    policy_hidden_sizes: str = _f(
        "",
        "hidden layer widths per policy of policy_map, POLICY=W,W;POLICY=W,... "
        "(policies not named take hidden_sizes)",
        metavar="POLICY=W,W;...",
    )
    eval_deterministic: bool = _f(
        True,
        "evaluate with the policy's mode (argmax / mean); off: sample actions from the "
        "policy, seeded (for envs where the mode gets stuck, e.g. pettingzoo pursuit)",
    )
    eval_opponent: str = _f(
        "random",
        "turn-based games: who plays the other seats in evaluations: random (legal moves), "
        "policy:PATH (a saved policy.pt / policy-best.pt: a chosen snapshot) or a scripted "
        "player module.path:name, e.g. zmq_rl.envs.baselines:one_ply_move for connect four",
        metavar="random|policy:PATH|MODULE:NAME",
    )
    eval_in_background: bool = _f(
        True,
        "run periodic evaluations in a separate low-priority process on a snapshot of the "
        "weights, so training never waits for them (each is reported when it finishes); "
        "off: evaluate inside the learner's loop",
    )
    target_return: float = _f(math.inf, "stop early once an evaluation's mean return reaches this")
    run_dir: str = _f("", "directory for metrics, report and checkpoints; empty = none")
    max_message_bytes: int = _f(
        0,
        "largest message the learner accepts (ZMQ_MAXMSGSIZE); 0 = derived from the env: "
        "twice the largest legitimate fragment plus 64 KB",
    )
    torch_threads: int = _f(
        1, "torch intra-op and numpy BLAS threads for the update (small nets: 1 is fastest)"
    )
    ingest_thread: bool = _f(
        False,
        "receive, validate and queue fragments and serve control and heartbeats on a "
        "thread of their own while the PPO update (and an in-loop evaluation) runs (off, "
        "the default: the sockets wait until the update is done; on a 2-core machine the "
        "thread cost 14%% of throughput, see docs/benchmarks.md section 17)",
    )
    num_learners: int = _f(
        1,
        "learner ranks that train one policy with data-parallel gradient all-reduce "
        "(torch.distributed, gloo): rank 0 owns control and weights, rank r > 0 binds "
        "its own experience port (PORT + 2 + r) and actors are spread over the ranks; "
        "torch.distributed meets at PORT + 2 + N unless torchrun's RANK/WORLD_SIZE/"
        "MASTER_ADDR/MASTER_PORT are set (docs/api.md, Learner ranks)",
        metavar="N",
    )
    device: str = _f(
        "auto",
        "where the learner's policy and PPO update run: auto (CUDA when available, else "
        "cpu), cpu, cuda (= cuda:0) or cuda:N; actors stay on the CPU and get CPU weights",
        metavar="auto|cpu|cuda|cuda:N",
    )
    actor_timeout: float = _f(
        10.0, "seconds of silence after which an actor is declared dead and its slots leave"
    )
    checkpoint_every: int = _f(
        25, "write a checkpoint every N updates (and at the end); 0 = end only"
    )
    keep_checkpoint_every: int = _f(
        0,
        "keep for good every checkpoint whose update is a multiple of N (besides the "
        "newest 3, which are always kept), so that a self-play run's strength can be "
        "followed afterwards (zmq-rl ladder RUN_DIR); 0 = only the newest 3",
    )
    max_actors: int = _f(
        256, "most actors registered at once; a hello beyond it is refused ('full')"
    )
    max_envs_per_actor: int = _f(
        256, "most env slots one actor may run; a hello asking more is refused ('too_many_envs')"
    )
    max_total_envs: int = _f(
        4096, "most env slots of all registered actors together; beyond it hellos are 'full'"
    )
    curve_secret_key: str = _f(
        "", "CURVE: the learner's secret certificate file (zmq-rl keys); empty = plain tcp"
    )
    curve_authorized_keys: str = _f(
        "", "CURVE: folder of authorised actors' public certificates (required with a key)"
    )
    envs_per_actor: InitVar[int | None] = None
    """Deprecated name of ``num_envs`` (before 0.2): still accepted, with a warning."""

    def __post_init__(self, envs_per_actor: int | None) -> None:
        for name in ("policy_map", "policy_hidden_sizes"):  # the Python API passes a dict
            object.__setattr__(self, name, policy_map_text(getattr(self, name)))
        if isinstance(self.env_kwargs, Mapping):  # the Python API passes a dict
            object.__setattr__(self, "env_kwargs", _json.dumps(dict(self.env_kwargs)))
        if isinstance(self.wrappers, (list, str, Mapping)):
            wrappers = self.wrappers if isinstance(self.wrappers, list) else [self.wrappers]
            object.__setattr__(self, "wrappers", tuple(toml_env_value("wrappers", wrappers)))
        if isinstance(self.wrappers, tuple):  # rl-zoo's dotted "module.Name" -> "module:Name"
            object.__setattr__(
                self,
                "wrappers",
                tuple(
                    wrapper_spec(w) if isinstance(w, str) and ":" not in w else w
                    for w in self.wrappers
                ),
            )
        if envs_per_actor is not None:
            warnings.warn(
                "LearnerConfig(envs_per_actor=...) is deprecated; use num_envs",
                DeprecationWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "num_envs", envs_per_actor)

    def validate(self) -> LearnerConfig:
        """Check every field; return self so calls chain."""
        _positive_int(self, "num_actors", "num_steps", "broadcast_every")
        _non_negative_int(self, "total_env_steps", "max_lead_steps", "seed")
        _non_negative_int(self, "batch_rows", "max_policy_lag")
        _positive_int(self, "num_envs", "fragment_length", "eval_episodes")
        _require(
            self.batch_mode in ("auto", "rows", "slots"),
            "batch_mode",
            self.batch_mode,
            "must be auto, rows or slots",
        )
        _require(
            self.batch_rows == 0 or self.batch_rows >= self.num_steps,
            "batch_rows",
            self.batch_rows,
            f"must be 0 or >= num_steps ({self.num_steps}): a batch holds whole segments "
            "of num_steps rows",
        )
        _require(
            self.batch_mode != "rows" or self.num_learners == 1,
            "batch_mode",
            self.batch_mode,
            f"rows batches train on one learner rank (num_learners={self.num_learners}): "
            "use slots or auto",
        )
        if self.batch_mode == "slots":
            per_update = self.num_steps * self.nominal_slots()
            why = f"{per_update} = num_steps * num_actors * num_envs"
        else:
            per_update = self.batch_rows_for(1)
            why = f"{per_update} = " + (
                "batch_rows" if self.batch_rows else "num_steps * num_actors * num_envs"
            )
        _require(
            self.total_env_steps >= per_update,
            "total_env_steps",
            self.total_env_steps,
            f"must cover at least one update ({why})",
        )
        _unit_interval(self, "gamma", "gae_lambda", "vtrace_lambda")
        _positive(self, "vtrace_rho_bar", "vtrace_c_bar")
        cycle = self.broadcast_every * self.num_steps
        _require(
            self.max_lead_steps == 0 or self.max_lead_steps >= cycle,
            "max_lead_steps",
            self.max_lead_steps,
            f"must be 0 or >= broadcast_every * num_steps ({cycle}), "
            "or the learner's fill loop deadlocks",
        )
        _non_negative_int(self, "eval_every", "opponent_pool", "opening_moves")
        _positive_int(self, "opponent_every")
        _require(
            self.opponent_choice in ("uniform", "latest", "win_rate"),
            "opponent_choice",
            self.opponent_choice,
            "must be uniform, latest or win_rate",
        )
        _require(
            type(self.opponent_share) in (int, float) and 0.0 <= self.opponent_share <= 1.0,
            "opponent_share",
            self.opponent_share,
            "must be a number in [0, 1]",
        )
        _positive_int(self, "torch_threads", "num_learners")
        _require(
            self.eval_opponent == "random"
            or (self.eval_opponent.startswith("policy:") and len(self.eval_opponent) > 7)
            or (":" in self.eval_opponent and all(self.eval_opponent.split(":", 1))),
            "eval_opponent",
            self.eval_opponent,
            "must be random, policy:PATH or module.path:name",
        )
        _require(isinstance(self.policy_map, str), "policy_map", self.policy_map, "must be text")
        mapped = {p for _, p in parse_policy_map(self.policy_map)}
        for policy in parse_policy_hidden_sizes(self.policy_hidden_sizes):
            _require(
                policy in mapped,
                "policy_hidden_sizes",
                self.policy_hidden_sizes,
                f"unknown policy id {policy!r}: policy_map's policies are "
                f"{', '.join(sorted(mapped)) or 'none (set policy_map)'}",
            )
        _check_device(self.device)
        _require(
            isinstance(self.env_id, str) and bool(self.env_id),
            "env_id",
            self.env_id,
            "must be a non-empty env id: text, a gymnasium id, 'module:Id' or "
            "'module.path:EnvClass' (every process builds the env from it; zmq_rl.train "
            "names a class or function of a module itself)",
        )
        _require(isinstance(self.env_kwargs, str), "env_kwargs", self.env_kwargs, "must be text")
        parse_env_kwargs(self.env_kwargs)
        _require(
            isinstance(self.wrappers, tuple),
            "wrappers",
            self.wrappers,
            "must be a list of 'module.path:WrapperName'",
        )
        for spec in self.wrappers:
            parse_wrapper(spec)
        _require(
            type(self.port) is int and 1 <= self.port <= 65533,
            "port",
            self.port,
            "must be in 1..65533 (the learner binds port, port + 1 and port + 2)",
        )
        _positive(self, "starvation_timeout", "actor_timeout")
        _require(
            bool(self.curve_secret_key) == bool(self.curve_authorized_keys),
            "curve_authorized_keys" if self.curve_secret_key else "curve_secret_key",
            self.curve_authorized_keys if self.curve_secret_key else self.curve_secret_key,
            "curve_secret_key and curve_authorized_keys go together",
        )
        _non_negative_int(self, "checkpoint_every", "keep_checkpoint_every")
        _positive_int(self, "max_actors", "max_envs_per_actor", "max_total_envs")
        for name, needed in (
            ("max_actors", self.num_actors),
            ("max_envs_per_actor", self.num_envs),
            ("max_total_envs", self.nominal_slots()),
        ):
            _require(
                getattr(self, name) >= needed,
                name,
                getattr(self, name),
                f"must be >= {needed} (num_actors, num_envs): the run's own actors must fit",
            )
        _require(
            type(self.target_return) in (int, float) and not math.isnan(self.target_return),
            "target_return",
            self.target_return,
            "must be a number (inf = never stop early)",
        )
        _require(
            type(self.max_message_bytes) is int
            and (self.max_message_bytes == 0 or self.max_message_bytes >= 1024),
            "max_message_bytes",
            self.max_message_bytes,
            "must be 0 (derived from the env) or an integer >= 1024",
        )
        return self

    def env_kwargs_map(self) -> dict[str, Any]:
        """``env_kwargs`` parsed (:func:`parse_env_kwargs`): the keyword arguments of
        ``gym.make``."""
        return parse_env_kwargs(self.env_kwargs)

    def num_updates(self, agents_per_env: int = 1) -> int:
        """PPO updates the budget buys at the nominal membership:
        ``total_env_steps // (num_steps * nominal_slots() * agents_per_env)``, at least 1
        (``agents_per_env``: slots per env copy of a multi-agent env, whose agents'
        steps are its env steps; an estimate there, since agents come and go)."""
        slots = self.nominal_slots() * agents_per_env
        return max(1, self.total_env_steps // (self.num_steps * slots))

    def batch_rows_for(self, agents_per_env: int = 1) -> int:
        """Rows per update of a rows batch: ``batch_rows``, or when it is 0 the rollout of
        the fleet this config names (``num_steps`` rows of each of ``nominal_slots()``
        slots, times ``agents_per_env``): a number of the config, never of the actors
        that actually connect."""
        return self.batch_rows or self.num_steps * self.nominal_slots() * agents_per_env

    def nominal_slots(self) -> int:
        """Slots when every one of ``num_actors`` actors runs ``num_envs`` envs."""
        return self.num_actors * self.num_envs

    def steps_per_broadcast(self) -> int:
        """Steps per slot the learner consumes between two broadcasts."""
        return self.broadcast_every * self.num_steps

    def effective_max_lead_steps(self) -> int:
        """``max_lead_steps`` when nonzero, else ``2 * broadcast_every * num_steps``:
        one broadcast cycle of lead for overlap plus one cycle in flight."""
        return self.max_lead_steps or 2 * self.steps_per_broadcast()

    def experience_port(self, rank: int = 0) -> int:
        """The PULL port for experience fragments of learner rank ``rank``: ``port + 1``
        for rank 0, ``port + 2 + rank`` for the others (``num_learners``)."""
        return self.port + 1 if rank == 0 else self.port + 2 + rank

    def rendezvous_port(self) -> int:
        """Where the ranks of ``num_learners > 1`` meet (torch.distributed's TCP
        store) when torchrun did not launch them: ``port + 2 + num_learners``, the
        first port after the ranks' experience ports."""
        return self.port + 2 + self.num_learners

    def weights_port(self) -> int:
        """The PUB port for weights."""
        return self.port + 2


@dataclass(frozen=True)
class ActorConfig:
    """One actor process: where the learner is and what it runs."""

    learner: str = _f(
        f"127.0.0.1:{DEFAULT_PORT}", "learner control endpoint HOST[:PORT] or tcp://HOST:PORT"
    )
    env_id: str = _f("", "gymnasium env id; empty = the learner's env")
    num_envs: int = _f(0, "env slots in this actor; 0 = the learner's num_envs")
    seed: int = _f(-1, "sampling seed; -1 = the run's seed + 1 + actor id")
    actor_id: int = _f(-1, "requested actor id; -1 = the learner assigns the lowest free one")
    register_timeout: float = _f(30.0, "seconds to wait for the learner's welcome")
    learner_timeout: float = _f(
        60.0, "exit with an error after hearing nothing from the learner for this long"
    )
    curve_secret_key: str = _f("", "CURVE: this actor's secret certificate file; empty = plain tcp")
    curve_server_key: str = _f(
        "", "CURVE: the learner's public certificate file (required with a key)"
    )
    torch_threads: int = _f(
        1,
        "threads for inference: numpy's BLAS and, where the network needs torch, torch's "
        "intra-op threads (the built-in MLP runs in numpy, without torch)",
    )
    step_envs: str = _f(
        "auto",
        "how the actor steps its envs: threads (each env's step in a thread of its own: envs "
        "whose steps wait, a simulator's tick or a socket, wait together), sequential, or "
        "auto (times the first steps and takes threads when a step waits more than it "
        "computes, 1 ms or more per env: a busy CPU is not a simulator that waits)",
        choices=("auto", "sequential", "threads"),
    )

    def validate(self) -> ActorConfig:
        """Check every field; return self so calls chain."""
        _require(
            isinstance(self.learner, str) and bool(self.learner.strip()),
            "learner",
            self.learner,
            "must be HOST[:PORT]",
        )
        _non_negative_int(self, "num_envs")
        _require(
            self.step_envs in ("auto", "sequential", "threads"),
            "step_envs",
            self.step_envs,
            "must be auto, sequential or threads",
        )
        for name in ("seed", "actor_id"):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and not isinstance(value, bool) and value >= -1,
                name,
                value,
                "must be an integer >= -1",
            )
        _positive(self, "register_timeout", "learner_timeout")
        _require(
            bool(self.curve_secret_key) == bool(self.curve_server_key),
            "curve_server_key" if self.curve_secret_key else "curve_secret_key",
            self.curve_server_key if self.curve_secret_key else self.curve_secret_key,
            "curve_secret_key and curve_server_key go together",
        )
        _positive_int(self, "torch_threads")
        return self


def replace(cfg: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` that validates the result."""
    return dataclasses.replace(cfg, **changes).validate()


@dataclass(frozen=True)
class ServeConfig:
    """The inference server: where its learner is, where simulators connect, batching.

    ``zmq-rl serve`` (:mod:`zmq_rl.serving.serve`, docs/inference.md): simulators that cannot
    run the policy send observations and get actions."""

    learner: str = _f(
        f"127.0.0.1:{DEFAULT_PORT}", "learner control endpoint HOST[:PORT] or tcp://HOST:PORT"
    )
    bind: str = _f("tcp://*:5600", "ROUTER endpoint the simulators connect to")
    max_batch: int = _f(0, "most simulators' requests in one policy forward; 0 = all waiting")
    sim_timeout: float = _f(
        60.0, "detach a simulator (bye to the learner) after this long without a request"
    )
    seed: int = _f(-1, "sampling seed; -1 = the run's seed + 1 + the first actor id")
    register_timeout: float = _f(30.0, "seconds to wait for the learner's welcome per attach")
    learner_timeout: float = _f(
        60.0, "give up on a simulator's registration after hearing nothing from the learner"
    )
    torch_threads: int = _f(
        1,
        "threads for inference: numpy's BLAS and, where the network needs torch, torch's "
        "intra-op threads (the built-in MLP runs in numpy, without torch)",
    )
    keep_serving: bool = _f(
        False,
        "keep serving after the learner's shutdown (default: exit once every "
        "simulator of the finished run is gone)",
    )

    def validate(self) -> ServeConfig:
        """Check every field; return self so calls chain."""
        for name in ("learner", "bind"):
            value = getattr(self, name)
            _require(isinstance(value, str) and bool(value.strip()), name, value, "is empty")
        _require(
            self.bind.startswith(("tcp://", "ipc://", "inproc://")),
            "bind",
            self.bind,
            "must be a ZeroMQ endpoint such as tcp://*:5600",
        )
        _non_negative_int(self, "max_batch")
        _positive_int(self, "torch_threads")
        _require(
            isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= -1,
            "seed",
            self.seed,
            "must be an integer >= -1",
        )
        _positive(self, "sim_timeout", "register_timeout", "learner_timeout")
        return self
