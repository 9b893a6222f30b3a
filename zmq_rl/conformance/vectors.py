"""The golden vectors of the wire protocol (docs/protocol.md section 11.1).

Every valid vector is one frame written by :func:`zmq_rl.wire.protocol.encode` (or, for a
space spec, the msgpack map of :func:`zmq_rl.wire.spaces.space_spec`) and its *view*: JSON
that keeps msgpack's types apart (:func:`to_view`, :func:`from_view`). Every invalid
vector is a frame a receiver must reject, with the reason and the counter. The
invalid fragments are *mutations* of a valid one (:data:`FRAGMENT_MUTATIONS`), so the
learner conformance check can apply the same defects to a fragment of a live run.

``python -m zmq_rl.conformance.vectors --out docs/protocol/vectors`` writes them; the
output is byte-for-byte deterministic (fixed seeds, fixed ids and clocks).
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from ..wire.codec import ARRAY_DTYPES, PROTOCOL_VERSION, ProtocolVersionMismatch, encode_array
from ..wire.protocol import (
    FEATURE_GRANTS,
    FEATURE_POLICIES,
    Bye,
    Fragment,
    Heartbeat,
    Hello,
    Refuse,
    RunSettings,
    Shutdown,
    Weights,
    Welcome,
    encode,
    weights_topic,
)
from ..wire.spaces import space_spec

__all__ = [
    "FRAGMENT_MUTATIONS",
    "Context",
    "Mutation",
    "from_view",
    "generate",
    "invalid_vectors",
    "to_view",
    "valid_vectors",
    "worked_example_markdown",
]

RUN_ID = "3f2a9c1e8b7d"
TOKEN = bytes.fromhex("5b0e8f1c2d3a4e6f708192a3b4c5d6e7")
SENT_AT = 1733140000.25
WORKED_SEQ = 249
WORKED_VERSION = 15
ARRAY_KEYS = ["dtype", "shape", "data"]


# --------------------------------------------------------------------------- the view


def _number(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _values(array: np.ndarray) -> Any:
    if array.dtype.kind == "f":
        flat = [_number(float(x)) for x in array.reshape(-1)]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]
    return array.tolist()


def to_view(obj: Any) -> Any:
    """The JSON view of a decoded msgpack value (docs/protocol.md section 11.1): floats as
    ``{"$float": x}``, bin as ``{"$bin": hex}``, array maps as ``{"$array": {dtype,
    shape, base64, values}}``; maps keep their key order."""
    if isinstance(obj, dict):
        if list(obj) == ARRAY_KEYS and isinstance(obj["data"], bytes):
            array = _decodable(obj)
            view: dict[str, Any] = {
                "dtype": obj["dtype"],
                "shape": obj["shape"],
                "base64": base64.b64encode(obj["data"]).decode(),
            }
            if array is not None:
                view["values"] = _values(array)
            return {"$array": view}
        if not all(isinstance(k, str) for k in obj):  # (JSON keys are strings)
            raise ValueError("a map key that is not a str has no view")
        return {k: to_view(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_view(v) for v in obj]
    if isinstance(obj, bytes):
        return {"$bin": obj.hex()}
    if isinstance(obj, float):
        return {"$float": _number(obj)}
    return obj  # str, int, bool, None


def _decodable(obj: dict[str, Any]) -> np.ndarray | None:
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if dtype not in ARRAY_DTYPES or not isinstance(shape, list):
        return None
    if not all(type(d) is int and d >= 0 for d in shape):
        return None
    np_dtype = np.dtype(dtype).newbyteorder("<") if dtype not in ("bool",) else np.dtype(bool)
    if int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize != len(data):
        return None
    if dtype == "bool" and data.translate(None, b"\x00\x01"):
        return None
    return np.frombuffer(data, np_dtype).reshape(shape)


def from_view(view: Any) -> Any:
    """The msgpack value of a view (the inverse of :func:`to_view`)."""
    if isinstance(view, dict):
        if list(view) == ["$array"]:
            a = view["$array"]
            return {"dtype": a["dtype"], "shape": a["shape"], "data": base64.b64decode(a["base64"])}
        if list(view) == ["$bin"]:
            return bytes.fromhex(view["$bin"])
        if list(view) == ["$float"]:
            x = view["$float"]
            return float(x)  # "nan", "inf", "-inf" parse too
        return {k: from_view(v) for k, v in view.items()}
    if isinstance(view, list):
        return [from_view(v) for v in view]
    return view


def pack(obj: Any) -> bytes:
    """msgpack bytes as the Python encoder writes them (bin type for bytes)."""
    return msgpack.packb(obj, use_bin_type=True)


def unpack(frame: bytes) -> Any:
    """The msgpack value of ``frame`` (strict: trailing bytes raise)."""
    return msgpack.unpackb(frame, raw=False, strict_map_key=False)


# --------------------------------------------------------------------------- spaces


def _spaces() -> dict[str, Any]:
    from gymnasium import spaces

    inf = np.inf
    return {
        "box": spaces.Box(
            low=np.array([-4.8, -inf, -0.41887903, -inf], np.float32),
            high=np.array([4.8, inf, 0.41887903, inf], np.float32),
            dtype=np.float32,
        ),
        "discrete": spaces.Discrete(5, start=1),
        "multi_binary": spaces.MultiBinary(3),
        "multi_discrete": spaces.MultiDiscrete(np.array([4, 3]), start=np.array([0, 1])),
        "dict": spaces.Dict(
            {
                "position": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "gear": spaces.Discrete(3),
            }
        ),
        "tuple": spaces.Tuple(
            (spaces.Box(0, 255, (3,), np.uint8), spaces.MultiBinary(2)),
        ),
    }


def _actions_for(kind: str) -> Any:
    """The action space each observation kind's fragment vector pairs with (so that
    every action kind appears too)."""
    from gymnasium import spaces

    return {
        "box": spaces.Discrete(2),
        "discrete": spaces.Box(-2.0, 2.0, (2,), np.float32),
        "multi_binary": spaces.MultiDiscrete(np.array([3, 2])),
        "multi_discrete": spaces.MultiBinary(2),
        "dict": spaces.Discrete(3),
        "tuple": spaces.Box(-1.0, 1.0, (1,), np.float32),
    }[kind]


def _leaf_sample(space: Any, lead: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A deterministic value of a leaf space (numpy's generator, not gymnasium's)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        if space.dtype.kind == "f":
            return rng.uniform(-1, 1, (*lead, *space.shape)).astype(space.dtype)
        return rng.integers(0, 256, (*lead, *space.shape)).astype(space.dtype)
    if isinstance(space, spaces.Discrete):
        return (int(space.start) + rng.integers(0, int(space.n), lead)).astype(np.int64)
    if isinstance(space, spaces.MultiBinary):
        return rng.integers(0, 2, (*lead, *space.shape)).astype(np.int8)
    return (space.start + rng.integers(0, space.nvec, (*lead, *space.shape))).astype(np.int64)


def _sample(space: Any, lead: tuple[int, ...], rng: np.random.Generator) -> Any:
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return {k: _sample(s, lead, rng) for k, s in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_sample(s, lead, rng) for s in space.spaces)
    return _leaf_sample(space, lead, rng)


def _policy_actions(space: Any, lead: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Actions as they travel (docs/protocol.md section 3.6): 0-based indices."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        return rng.integers(0, int(space.n), lead).astype(np.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return rng.integers(0, space.nvec, (*lead, *space.shape)).astype(np.int64)
    return _leaf_sample(space, lead, rng)


def _allow(observation_space: Any, action_space: Any, obs: Any, actions: np.ndarray) -> None:
    """Set each row's ``action_mask`` entries of the actions it took to 1 (allowed), in
    a run whose actions are masked (docs/protocol.md section 7.2, ``masked_action``)."""
    from ..rl.masking import mask_entries, mask_key, mask_nvec

    key = mask_key(observation_space, action_space)
    if key is None:
        return
    nvec = mask_nvec(action_space)
    chosen = mask_entries(nvec, actions)
    mask = obs[key].reshape(len(chosen), int(nvec.sum()))
    mask[np.arange(len(chosen))[:, None], chosen] = 1


def _take(value: Any, index: Any) -> Any:
    if isinstance(value, dict):
        return {k: _take(v, index) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_take(v, index) for v in value)
    return value[index]


def _stack(values: list[Any], like: Any) -> Any:
    if isinstance(like, dict):
        return {k: _stack([v[k] for v in values], like[k]) for k in like}
    if isinstance(like, tuple):
        return tuple(_stack([v[i] for v in values], x) for i, x in enumerate(like))
    if not values:
        return np.zeros((0, *like.shape), like.dtype)
    return np.stack(values)


def synthetic_fragment(
    observation_space: Any,
    action_space: Any,
    *,
    seed: int,
    length: int = 2,
    width: int = 2,
    truncated_cells: tuple[tuple[int, int], ...] = ((1, 1),),
    state_size: int = 0,
    **header: Any,
) -> Fragment:
    """A valid fragment of random (seeded) values of the two spaces: ``[length, width]``
    cells, the given cells truncated (not terminated), each with a final observation.
    With an ``action_mask`` in the observations, every row's mask allows its action."""
    rng = np.random.default_rng(seed)
    lead = (length, width)
    obs = _sample(observation_space, lead, rng)
    truncated = np.zeros(lead, bool)
    for t, b in truncated_cells:
        truncated[t, b] = True
    cells = sorted(truncated_cells)
    final = _stack([_sample(observation_space, (), rng) for _ in cells], _take(obs, (0, 0)))
    actions = _policy_actions(action_space, lead, rng)  # (the draws in the vectors' order)
    _allow(observation_space, action_space, obs, actions)
    return Fragment(
        obs=obs,
        actions=actions,
        rewards=rng.normal(0, 1, lead).astype(np.float32),
        terminated=np.zeros(lead, bool),
        truncated=truncated,
        values=rng.normal(0, 1, lead).astype(np.float32),
        log_probs=-rng.uniform(0, 2, lead).astype(np.float32),
        slots=np.arange(width, dtype=np.int32),
        next_obs=_sample(observation_space, (width,), rng),
        final_obs_index=np.array([t * width + b for t, b in cells], np.int32),
        final_obs=final,
        state=(rng.normal(0, 1, (width, state_size)).astype(np.float32) if state_size else None),
        **header,
    )


# --------------------------------------------------------------------------- CartPole


def _controller(obs: np.ndarray) -> int:
    return int(3 * obs[2] + obs[3] + 0.05 * obs[0] + 0.1 * obs[1] > 0)


def cartpole_fragment() -> Fragment:
    """The worked example (docs/protocol.md section 10), from real CartPole-v1 steps.

    Two slots step in lockstep under a balancing controller: slot 0 (env seed 7) is
    at steps 10 and 11 of an episode, slot 1 (env seed 1) at steps 498 and 499 of
    its first episode, which CartPole-v1's 500-step time limit truncates at the
    second row: cell (1, 1), flat index 3, whose ``final_obs`` is what ``env.step``
    returned for it. ``next_obs`` of slot 1 is the reset observation of its next
    episode. ``values`` and ``log_probs`` are illustrative numbers, not a network's.
    """
    import gymnasium as gym

    envs, obs = [], []
    for seed, skip in ((7, 10), (1, 498)):
        env = gym.make("CartPole-v1")
        o, _ = env.reset(seed=seed)
        for _ in range(skip):
            o, _, term, trunc, _ = env.step(_controller(o))
            assert not (term or trunc)
        envs.append(env)
        obs.append(o)
    rows_obs, rows_act, rows_rew, rows_term, rows_trunc, finals = [], [], [], [], [], {}
    for t in range(2):
        rows_obs.append(np.stack(obs))
        actions = [_controller(o) for o in obs]
        rows_act.append(actions)
        rew, term_, trunc_ = [], [], []
        for b, env in enumerate(envs):
            o, r, term, trunc, _ = env.step(actions[b])
            rew.append(r)
            term_.append(term)
            trunc_.append(trunc)
            if term or trunc:
                if trunc and not term:
                    finals[t * 2 + b] = o
                o, _ = env.reset(seed=100 + b)
            obs[b] = o
        rows_rew.append(rew)
        rows_term.append(term_)
        rows_trunc.append(trunc_)
    for env in envs:
        env.close()
    index = sorted(finals)
    return Fragment(
        obs=np.array(rows_obs, np.float32),
        actions=np.array(rows_act, np.int64),
        rewards=np.array(rows_rew, np.float32),
        terminated=np.array(rows_term, bool),
        truncated=np.array(rows_trunc, bool),
        values=np.array([[9.5, 12.5], [9.25, 12.25]], np.float32),
        log_probs=np.array([[-0.125, -0.6875], [-0.25, -0.75]], np.float32),
        actor_id=0,
        version=WORKED_VERSION,
        seq=WORKED_SEQ,
        run_id=RUN_ID,
        token=TOKEN,
        slots=np.array([0, 1], np.int32),
        next_obs=np.stack(obs).astype(np.float32),
        final_obs_index=np.array(index, np.int32),
        final_obs=np.array([finals[i] for i in index], np.float32).reshape(len(index), 4),
        sent_at=SENT_AT,
    )


# --------------------------------------------------------------------------- valid vectors


def _tiny_weights(version: int, policy: str = "", seed: int = 5) -> Weights:
    """The weights of the welcome's network (``hidden_sizes = [2]``, separate trunks,
    CartPole's 4 observations, 2 actions): every tensor §6.1 names, by its name; of
    policy ``policy`` in a run of several policies (§4.9)."""
    rng = np.random.default_rng(seed)

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(0, 0.1, shape).astype(np.float32)

    return Weights(
        version=version,
        run_id=RUN_ID,
        tensors=[
            ("actor_trunk.0.weight", normal(2, 4)),
            ("actor_trunk.0.bias", np.zeros(2, np.float32)),
            ("critic_trunk.0.weight", normal(2, 4)),
            ("critic_trunk.0.bias", np.zeros(2, np.float32)),
            ("policy_head.weight", normal(2, 2)),
            ("policy_head.bias", np.zeros(2, np.float32)),
            ("value_head.weight", normal(1, 2)),
            ("value_head.bias", np.zeros(1, np.float32)),
        ],
        policy=policy,
    )


def _settings() -> RunSettings:
    from gymnasium import spaces

    return RunSettings(
        env_id="CartPole-v1",
        observation_space=_spaces()["box"],
        action_space=spaces.Discrete(2),
        policy={
            "hidden_sizes": [2],
            "activation": "tanh",
            "shared_trunk": False,
            "ortho_init": True,
            "log_std_init": 0.0,
            "normalize_obs": False,
            "factory": "",
            "policy_type": "mlp",
        },
        num_steps=32,
        broadcast_every=1,
        steps_per_broadcast=32,
        max_lead_steps=64,
        fragment_length=32,
        num_envs=2,
        seed=1,
        heartbeat_interval=1.0,
        state_size=0,
        max_weights_bytes=65536 + 2 * 400,
        max_fragment_bytes=1 << 20,
    )


POLICY_MAP = ["first", "second"]
"""The policy of each agent index of the two-policy welcome vector (§4.9)."""


def _policies_settings() -> RunSettings:
    """The settings of a run of two policies: one env copy of two agents, agent 0 on
    policy ``first`` (the single-policy vector's network), agent 1 on ``second`` (the
    same layers with ReLU)."""
    import dataclasses

    base = _settings()
    second = {**base.policy, "activation": "relu"}
    return dataclasses.replace(
        base,
        env_id="my_sim.pairs:two_carts",
        agents_per_env=2,
        policy_map=list(POLICY_MAP),
        policies={"first": dict(base.policy), "second": second},
    )


def _welcome(settings: RunSettings, weights: list[Weights]) -> Welcome:
    """Actor 0's welcome into the vectors' run with ``settings``: ``weights`` are the
    run's one policy's, or (several policies) each policy's."""
    return Welcome(
        actor_id=0,
        run_id=RUN_ID,
        token=TOKEN,
        base_version=0,
        experience_port=5556,
        weights_port=5557,
        settings=settings,
        weights=weights[0],
        policy_weights=weights if len(weights) > 1 else [],
    )


def _policies_welcome() -> Welcome:
    """The welcome of the two-policy run: both policies' weights at version 0."""
    each = [_tiny_weights(0, pid, seed) for pid, seed in zip(POLICY_MAP, (5, 6), strict=True)]
    return _welcome(_policies_settings(), each)


def _turn_based_welcome() -> Welcome:
    """The welcome of a turn-based self-play run (§4.4): one env copy of two seats, a
    pool of 10 snapshots drawn by win rate in half the games, random openings of up to
    6 moves."""
    import dataclasses

    settings = dataclasses.replace(
        _settings(),
        env_id="my_sim.boards:two_seats",
        agents_per_env=2,
        opponent_pool=10,
        opponent_every=10,
        opponent_share=0.5,
        opponent_choice="win_rate",
        opening_moves=6,
    )
    return _welcome(settings, [_tiny_weights(0)])


def _hello(env_id: str = "CartPole-v1", **changes: Any) -> Hello:
    """The vectors' hello: any id, the CartPole spaces, 2 slots, from sim-host-01."""
    from gymnasium import spaces

    fields: dict[str, Any] = dict(
        actor_id=-1,
        env_id=env_id,
        observation_space=space_spec(_spaces()["box"]),
        action_space=space_spec(spaces.Discrete(2)),
        num_envs=2,
        host="sim-host-01",
        pid=4242,
    )
    return Hello(**{**fields, **changes})


def _learner_heartbeat(**changes: Any) -> Heartbeat:
    """The vectors' learner heartbeat (version 16, every link field, base version 0)."""
    fields: dict[str, Any] = dict(
        actor_id=-1,
        run_id=RUN_ID,
        version=16,
        sent_at=2172.25,
        echo=1042.5,
        held=0.001953125,
        base_version=0,
    )
    return Heartbeat(**{**fields, **changes})


GRANT = 128
"""The grant of the welcome vector of a learner of rows batches (section 5.4.1)."""


def _rows_welcome(grant: int | None = GRANT) -> Welcome:
    """Actor 0's welcome from a learner of rows batches (section 5.3: 128 rows per
    update, 4 segments of 32, for 2 actors of 2 slots) to an actor whose hello announced
    ``grants``: ``grant`` steps per slot; S and L for actors without grants, a whole
    broadcast cycle's rows and twice that."""
    import dataclasses

    settings = dataclasses.replace(
        _settings(), steps_per_broadcast=128, max_lead_steps=256, batch_rows=128
    )
    return dataclasses.replace(_welcome(settings, [_tiny_weights(0)]), grant=grant)


def _grants_messages() -> list[tuple[str, str, Any]]:
    """The valid vectors of grants (sections 4.3, 4.4, 4.6, 5.4.1)."""
    return [
        (
            "hello-grants",
            "an actor whose staleness valve follows a learner's grants says so: features "
            "['grants'] (section 5.4.1)",
            _hello(features=[FEATURE_GRANTS]),
        ),
        (
            "welcome-grant",
            "the answer of a learner of rows batches (config.batch_rows 128: 4 segments of "
            "32 rows from whichever slots delivered) to 'hello-grants': grant 128, the "
            "steps per slot the actor may record until it hears a larger grant (section "
            "5.4.1); steps_per_broadcast 128 and max_lead_steps 256 pace actors without "
            "grants",
            _rows_welcome(),
        ),
        (
            "heartbeat-learner-grant",
            "a learner's heartbeat to an actor welcomed with a grant: its current grant "
            "(544: the most rows the learner had used of one of its slots when it "
            "published version 16, 416, plus the lead 128)",
            _learner_heartbeat(grant=544),
        ),
    ]


def _messages() -> list[tuple[str, str, Any]]:
    """(name, description, message) of every valid message vector."""
    out: list[tuple[str, str, Any]] = [
        (
            "hello",
            "an actor asks for any id with its spaces (CartPole-v1) and 2 slots",
            _hello(),
        ),
        (
            "hello-rejoin",
            "an actor registers again after a learner restart (section 4.3): its id, the "
            "old run id, the num_envs of its previous welcome (never 0) and the spaces it "
            "acts on (those of the previous welcome when its first hello sent {})",
            _hello("", actor_id=3, rejoin_run_id="0123456789ab"),
        ),
        (
            "welcome",
            "the answer to 'hello': id, run id, session token, base version, ports, every "
            "run setting, and the current weights (a tiny network: one hidden layer of 2)",
            _welcome(_settings(), [_tiny_weights(0)]),
        ),
        (
            "weights",
            "a broadcast of version 16 (the tensors of the welcome's tiny network)",
            _tiny_weights(16),
        ),
        (
            "refuse-version_mismatch",
            "a v2 learner's answer to a v1 hello; the reason names both versions",
            Refuse("version_mismatch", str(ProtocolVersionMismatch(1))),
        ),
        (
            "refuse-reregister",
            "the answer to a heartbeat or bye that is not a live registration",
            Refuse("reregister", f"actor 0 is not registered in run {RUN_ID}; say hello again"),
        ),
        (
            "heartbeat-actor",
            "an actor's heartbeat with its token and every link field",
            Heartbeat(
                actor_id=0,
                token=TOKEN,
                run_id=RUN_ID,
                version=15,
                sent_at=1042.5,
                echo=2171.25,
                held=0.0078125,
                paused=0.25,
            ),
        ),
        (
            "heartbeat-learner",
            "a learner's heartbeat: actor_id -1, no token, the recipient's base_version",
            _learner_heartbeat(),
        ),
        (
            "heartbeat-minimal",
            "an actor heartbeat without the optional fields",
            Heartbeat(actor_id=0, token=TOKEN, run_id=RUN_ID, version=15),
        ),
        ("shutdown", "the end of the run", Shutdown(reason="budget spent", run_id=RUN_ID)),
        (
            "bye",
            "an actor leaves: its counters and the seq of its last fragment",
            Bye(
                actor_id=0,
                token=TOKEN,
                stats={
                    "steps_sent": 500.0,
                    "fragments_sent": 250.0,
                    "episodes_completed": 1.0,
                    "policy_updates_received": 15.0,
                },
                last_seq=249,
            ),
        ),
        (
            "bye-nothing-sent",
            "a bye before any fragment: last_seq -1, stats may be empty",
            Bye(actor_id=0, token=TOKEN, stats={}, last_seq=-1),
        ),
        (
            "fragment-cartpole-worked",
            "docs/protocol.md section 10: two CartPole-v1 slots, two rows, slot 1 "
            "truncated by the time limit at row 1 (flat index 1*2+1 = 3)",
            cartpole_fragment(),
        ),
    ]
    header = {"actor_id": 0, "version": 3, "run_id": RUN_ID, "token": TOKEN, "sent_at": SENT_AT}
    for seed, (kind, space) in enumerate(_spaces().items()):
        out.append(
            (
                f"fragment-obs-{kind}",
                f"a [2, 2] fragment with a {kind} observation space and a "
                f"{type(_actions_for(kind)).__name__} action space; cell (1, 1) truncated",
                synthetic_fragment(space, _actions_for(kind), seed=10 + seed, seq=seed, **header),
            )
        )

    def box_fragment(seed: int, seq: int, **shape: Any) -> Fragment:
        """A fragment of the ``box`` spaces, no truncated cell."""
        box = _spaces()["box"], _actions_for("box")
        return synthetic_fragment(*box, seed=seed, truncated_cells=(), seq=seq, **shape, **header)

    out.append(
        (
            "fragment-recurrent",
            "a recurrent run (state_size 3): 'state' [B, 3] float32, no truncated cell",
            box_fragment(30, 0, state_size=3),
        )
    )
    out.append(
        (
            "fragment-one-slot",
            "one slot (slots [2]) of a 4-slot actor, three rows, no truncated cell",
            box_fragment(31, 7, length=3, width=1),
        )
    )
    out[-1][2].slots = np.array([2], np.int32)
    agents = box_fragment(37, 8, length=3, width=2)
    agents.terminated[0, 1] = True  # agent of slot 1 leaves after row 0 ...
    agents.valid = np.ones((3, 2), bool)
    agents.valid[1:, 1] = False  # ... and its slot is empty for rows 1 and 2
    agents.rewards[1:, 1] = 0.0
    out.append(
        (
            "fragment-valid-rows",
            "two agent slots of a multi-agent env (welcome agents_per_env 2): the agent of "
            "slot 1 terminates at row 0, rows 1-2 of that slot are not valid (section 4.1.4)",
            agents,
        )
    )
    out.extend(_multi_agent_fragments(header))
    out.extend(_policies_messages())
    out.extend(_grants_messages())
    return out


def masked_spaces() -> tuple[Any, Any]:
    """A masked run's spaces (PettingZoo's convention, docs/protocol.md 3.5): a Dict of
    an ``action_mask`` (MultiBinary(3), 1 = allowed) and a Box(3), Discrete(3) actions."""
    from gymnasium import spaces

    obs = spaces.Dict(
        [("action_mask", spaces.MultiBinary(3)), ("board", spaces.Box(0.0, 1.0, (3,), np.float32))]
    )
    return obs, spaces.Discrete(3)


def _masked_fragment(seq: int, header: dict[str, Any]) -> Fragment:
    """Two slots, two rows of the masked run; each row's mask allows its action."""
    return synthetic_fragment(*masked_spaces(), seed=41, truncated_cells=(), seq=seq, **header)


def _turn_based_fragment(header: dict[str, Any]) -> Fragment:
    """A game of two seats (slots 0 and 1 of one env copy), as the Python actor records
    it (docs/multi_agent.md "Turn-based games"): row 0 one move of each seat; at row 1
    seat 0's move wins (+1), seat 1's reply lost (-1), both terminated; row 2 seat 0's
    first move of the next game, and seat 1 has no move whose outcome is known yet:
    not valid."""
    fragment = synthetic_fragment(
        *masked_spaces(), seed=43, length=3, truncated_cells=(), seq=12, **header
    )
    fragment.rewards[:] = np.array([[0.0, 0.0], [1.0, -1.0], [0.0, 0.0]], np.float32)
    fragment.terminated[1] = True
    fragment.valid = np.array([[True, True], [True, True], [True, False]])
    return fragment


def _multi_agent_fragments(header: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """The valid fragments of masked and turn-based runs (sections 3.5, 4.1.4)."""
    return [
        (
            "fragment-masked",
            "a masked run (section 3.5: a Dict observation with an action_mask, "
            "MultiBinary(3), 1 = allowed; Discrete(3) actions): every row's action is one "
            "its own mask allows (section 7.2, masked_action)",
            _masked_fragment(11, header),
        ),
        (
            "fragment-turn-based",
            "a turn-based game of two seats (welcome agents_per_env 2, masked moves): row "
            "1 ends the game (seat 0 +1, seat 1 -1, both terminated); at row 2 seat 0 "
            "opens the next game and seat 1's row is not valid (section 4.1.4)",
            _turn_based_fragment(header),
        ),
    ]


def _policies_messages() -> list[tuple[str, str, Any]]:
    """The valid vectors of a run of several policies (section 4.9)."""
    return [
        (
            "hello-features",
            "an actor that can run several policies says so: features ['policies']",
            _hello("my_sim.pairs:two_carts", features=[FEATURE_POLICIES]),
        ),
        (
            "welcome-policies",
            "the welcome of a run of two policies (section 4.9): one env copy of two "
            "agents (agents_per_env 2), policy_map ['first', 'second'], each policy's "
            "network in policies, each policy's weights in policy_weights (weights is "
            "the first's)",
            _policies_welcome(),
        ),
        (
            "welcome-turn-based",
            "the welcome of a turn-based self-play run (section 4.4): agents_per_env 2, "
            "opponent_pool 10, opponent_every 10, opponent_share 0.5, opponent_choice "
            "'win_rate', opening_moves 6",
            _turn_based_welcome(),
        ),
        (
            "weights-policy",
            "a broadcast of version 16 of policy 'second' of a two-policy run: the "
            "weights frame, published as the two frames [topic, weights] with topic "
            "'policy/second' + NUL (section 4.9)",
            _tiny_weights(16, "second", 6),
        ),
    ]


def receiving_socket(message: Any) -> str:
    """The socket a valid message vector travels to, named as the invalid vectors name
    theirs (section 11.1): the learner's ``control`` (hello, an actor's heartbeat, bye)
    and ``experience``; the actor's ``actor-control`` (welcome, refuse, a learner's
    heartbeat, shutdown) and ``weights``. A heartbeat's direction is its ``actor_id``:
    -1 from the learner."""
    if isinstance(message, Fragment):
        return "experience"
    if isinstance(message, Weights):
        return "weights"
    if isinstance(message, (Hello, Bye)) or (
        isinstance(message, Heartbeat) and message.actor_id >= 0
    ):
        return "control"
    return "actor-control"


def valid_vectors() -> list[dict[str, Any]]:
    """Every valid vector: name, description, type, size, hex, view."""
    vectors = []
    for name, description, message in _messages():
        frame = encode(message)
        vector = {
            "name": name,
            "description": description,
            "type": message.TYPE,
            "socket": receiving_socket(message),
            "size": len(frame),
            "hex": frame.hex(),
        }
        if isinstance(message, Weights) and message.policy:  # a per-policy publication
            vector["topic"] = weights_topic(message.policy).hex()
        vector["view"] = to_view(unpack(frame))
        vectors.append(vector)
    for kind, space in _spaces().items():
        frame = pack(space_spec(space))
        vectors.append(
            {
                "name": f"space-{kind}",
                "description": f"a {kind} space spec (docs/protocol.md section 3.4), as it "
                "appears in hello and in the welcome's config",
                "type": "space",
                "size": len(frame),
                "hex": frame.hex(),
                "view": to_view(unpack(frame)),
            }
        )
    return vectors


# --------------------------------------------------------------------------- invalid vectors


@dataclass(frozen=True)
class Context:
    """The learner state an ``admit`` vector is checked against (and, in the learner
    conformance check, the live run's): run id, newest published version, the
    registration's id, token, slots and expected ``seq``, the run's state size, its
    spaces (gymnasium spaces) and its ``agents_per_env`` (docs/protocol.md 11.1)."""

    run_id: str
    version: int
    actor_id: int
    token: bytes
    num_envs: int
    next_seq: int
    state_size: int
    observation_space: Any
    action_space: Any
    agents_per_env: int = 1

    @property
    def masked(self) -> bool:
        """Whether the run's actions are masked by an ``action_mask`` observation entry."""
        from ..rl.masking import mask_key

        return mask_key(self.observation_space, self.action_space) is not None

    def to_json(self) -> dict[str, Any]:
        """The context as the vector files hold it (the spaces as views of their specs)."""
        return {
            "run_id": self.run_id,
            "published_version": self.version,
            "actor_id": self.actor_id,
            "token": self.token.hex(),
            "num_envs": self.num_envs,
            "next_seq": self.next_seq,
            "state_size": self.state_size,
            "observation_space": to_view(space_spec(self.observation_space)),
            "action_space": to_view(space_spec(self.action_space)),
            "agents_per_env": self.agents_per_env,
        }


def worked_context() -> Context:
    """The context of the worked fragment (section 10): CartPole, 2 slots, version 15,
    ``seq`` 249 expected."""
    from gymnasium import spaces

    return Context(
        RUN_ID, WORKED_VERSION, 0, TOKEN, 2, WORKED_SEQ, 0, _spaces()["box"], spaces.Discrete(2)
    )


def _leaf_arrays(value: Any) -> list[dict[str, Any]]:
    """The array maps of a wire value (maps and lists of array maps)."""
    if isinstance(value, dict) and list(value) != ARRAY_KEYS:
        return [a for v in value.values() for a in _leaf_arrays(v)]
    if isinstance(value, list):
        return [a for v in value for a in _leaf_arrays(v)]
    return [value]


def _set_cell(array: dict[str, Any], flat: int, packed: bytes) -> None:
    data = bytearray(array["data"])
    size = len(packed)
    data[flat * size : (flat + 1) * size] = packed
    array["data"] = bytes(data)


def _float_bytes(array: dict[str, Any], x: float) -> bytes:
    return struct.pack("<f" if array["dtype"] == "float32" else "<d", x)


def _extra_dim(value: Any) -> None:
    for leaf in _leaf_arrays(value):
        leaf["shape"] = [*leaf["shape"], 1]


@dataclass(frozen=True)
class Mutation:
    """One defect applied to a valid fragment map (``apply(body, context)`` edits it in
    place): the vector's name, what is wrong, where it is caught and the reason."""

    name: str
    description: str
    stage: str  # "decode" or "admit"
    reason: str
    apply: Callable[[dict[str, Any], Context], None]
    applies: Callable[[Context], bool] = lambda ctx: True
    """Whether the defect is one in a run of this context (a masked action needs a
    masked run; a row that is not valid is a defect only in a single-agent run)."""


def _del(key: str) -> Callable[[dict[str, Any], Context], None]:
    return lambda body, ctx: body.pop(key)


def _set(key: str, value: Any) -> Callable[[dict[str, Any], Context], None]:
    return lambda body, ctx: body.__setitem__(key, value)


def _truncate_first_cell(body: dict[str, Any], ctx: Context) -> None:
    _set_cell(body["truncated"], 0, b"\x01")


def _bool_two(body: dict[str, Any], ctx: Context) -> None:
    _set_cell(body["terminated"], 0, b"\x02")


def _nan_reward(body: dict[str, Any], ctx: Context) -> None:
    _set_cell(body["rewards"], 0, _float_bytes(body["rewards"], math.nan))


def _huge_reward(body: dict[str, Any], ctx: Context) -> None:
    _set_cell(body["rewards"], 0, _float_bytes(body["rewards"], 1e10))


def _short_data(body: dict[str, Any], ctx: Context) -> None:
    body["rewards"]["data"] = body["rewards"]["data"][:-1]


def _flat_rewards(body: dict[str, Any], ctx: Context) -> None:
    t, b = body["rewards"]["shape"]
    body["rewards"]["shape"] = [t * b]


def _dtype(key: str, dtype: str) -> Callable[[dict[str, Any], Context], None]:
    return lambda body, ctx: body[key].__setitem__("dtype", dtype)


def _rewards_as_int(body: dict[str, Any], ctx: Context) -> None:
    rewards = body["rewards"]
    count = int(np.prod(rewards["shape"]))
    body["rewards"] = {"dtype": "int32", "shape": rewards["shape"], "data": b"\x01\0\0\0" * count}


def _repeat_slot(body: dict[str, Any], ctx: Context) -> None:
    slots = body["slots"]
    width = slots["shape"][0]
    size = len(slots["data"]) // width
    slots["data"] = slots["data"][:size] * width


def _bad_slot(body: dict[str, Any], ctx: Context) -> None:
    slots = body["slots"]
    width = slots["shape"][0]
    fmt = "<i" if slots["dtype"] == "int32" else "<q"
    _set_cell(slots, width - 1, struct.pack(fmt, ctx.num_envs))


def _bad_obs(body: dict[str, Any], ctx: Context) -> None:
    for key in ("obs", "next_obs", "final_obs"):
        _extra_dim(body[key])


def _bad_actions(body: dict[str, Any], ctx: Context) -> None:
    _extra_dim(body["actions"])


def _next_obs_width(body: dict[str, Any], ctx: Context) -> None:
    for leaf in _leaf_arrays(body["next_obs"]):
        width = leaf["shape"][0]
        row = leaf["data"][: len(leaf["data"]) // width]
        leaf["shape"] = [width + 1, *leaf["shape"][1:]]
        leaf["data"] = leaf["data"] + row


def _valid_row_with_reward(body: dict[str, Any], ctx: Context) -> None:
    """The last row of column 0 not valid (section 4.1.4), with reward 1 (the row
    before it, if any, terminated, so only the reward is wrong)."""
    t, b = body["rewards"]["shape"]
    valid = np.ones((t, b), bool)
    valid[t - 1, 0] = False
    body["valid"] = encode_array(valid)
    _set_cell(body["rewards"], (t - 1) * b, _float_bytes(body["rewards"], 1.0))
    if t > 1:
        _set_cell(body["terminated"], (t - 2) * b, b"\x01")


def _valid_row_open_before(body: dict[str, Any], ctx: Context) -> None:
    """Row 1 of column 0 not valid, with reward 0, after a row that did not end (a
    one-row fragment: its only row, not valid, terminated)."""
    t, b = body["rewards"]["shape"]
    valid = np.ones((t, b), bool)
    row = min(1, t - 1)
    valid[row, 0] = False
    body["valid"] = encode_array(valid)
    _set_cell(body["rewards"], row * b, _float_bytes(body["rewards"], 0.0))
    if t == 1:
        _set_cell(body["terminated"], 0, b"\x01")
        return
    for name in ("terminated", "truncated"):
        _set_cell(body[name], 0, b"\x00")
        _set_cell(body[name], b, b"\x00")


def _valid_shape(body: dict[str, Any], ctx: Context) -> None:
    t, b = body["rewards"]["shape"]
    body["valid"] = encode_array(np.ones((t, b + 1), bool))


def _slots_float(body: dict[str, Any], ctx: Context) -> None:
    width = body["slots"]["shape"][0]
    body["slots"] = encode_array(np.arange(width, dtype=np.float32))


def _slots_2d(body: dict[str, Any], ctx: Context) -> None:
    body["slots"]["shape"] = [body["slots"]["shape"][0], 1]


def _not_valid_last_row(body: dict[str, Any], ctx: Context) -> None:
    """A well-formed ``valid`` (section 4.1.4): column 0's last row not valid, reward 0,
    after a row that terminated (a one-row fragment: its only row). The bases it is
    applied to truncate nothing in column 0."""
    t, b = body["rewards"]["shape"]
    valid = np.ones((t, b), bool)
    valid[t - 1, 0] = False
    body["valid"] = encode_array(valid)
    _set_cell(body["rewards"], (t - 1) * b, _float_bytes(body["rewards"], 0.0))
    _set_cell(body["terminated"], (t - 1) * b, b"\x00")
    if t > 1:
        _set_cell(body["terminated"], (t - 2) * b, b"\x01")


def _mask_out_first_action(body: dict[str, Any], ctx: Context) -> None:
    """Cell (0, 0)'s mask forbids the action it took (of its first component, whose
    block opens the mask)."""
    from ..rl.masking import MASK_KEY

    actions = body["actions"]
    action = int(np.frombuffer(actions["data"], np.dtype(actions["dtype"]).newbyteorder("<"))[0])
    mask = body["obs"][MASK_KEY]
    _set_cell(mask, action, np.zeros(1, np.dtype(mask["dtype"])).tobytes())


def _wrong_state(body: dict[str, Any], ctx: Context) -> None:
    width = body["slots"]["shape"][0]
    if ctx.state_size:
        body.pop("state", None)
    else:
        body["state"] = {"dtype": "float32", "shape": [width, 3], "data": b"\0" * (12 * width)}


FRAGMENT_MUTATIONS: tuple[Mutation, ...] = (
    Mutation("missing-final_obs_index", "no final_obs_index key (issue 21 finding 1)",
             "decode", "bad_field", _del("final_obs_index")),
    Mutation("missing-token", "no token key", "decode", "bad_field", _del("token")),
    Mutation("token-15-bytes", "a token of 15 bytes", "decode", "bad_field",
             lambda b, c: b.__setitem__("token", b["token"][:15])),
    Mutation("seq-float", "seq written as a float (an int field takes no float)", "decode",
             "bad_field", lambda b, c: b.__setitem__("seq", float(b["seq"]))),
    Mutation("actor_id-too-large", "actor_id 2^31, past the id range", "decode", "bad_field",
             _set("actor_id", 2**31)),
    Mutation("slots-repeated", "a slot twice in slots", "decode", "bad_field", _repeat_slot),
    Mutation("slots-float32", "slots as float32 (the field takes int32/int64)", "decode",
             "bad_dtype", _slots_float),
    Mutation("slots-2-d", "slots of shape [B, 1] instead of [B]", "decode", "bad_shape",
             _slots_2d),
    Mutation("final_obs_index-incomplete", "cell (0, 0) truncated without a final_obs entry",
             "decode", "bad_field", _truncate_first_cell),
    Mutation("rewards-not-array", "rewards as a msgpack list of floats", "decode", "bad_array",
             lambda b, c: b.__setitem__("rewards", [1.0, 1.0])),
    Mutation("data-as-str", "an array's data as a str, not a bin", "decode", "bad_array",
             lambda b, c: b["rewards"].__setitem__("data", "abcd")),
    Mutation("dtype-uint16", "an array of dtype uint16 (not one of the nine)", "decode",
             "bad_dtype", _dtype("rewards", "uint16")),
    Mutation("rewards-int32", "rewards as int32 (the field takes float32/float64)", "decode",
             "bad_dtype", _rewards_as_int),
    Mutation("rewards-1-d", "rewards of shape [T*B] instead of [T, B]", "decode",
             "bad_shape", _flat_rewards),
    Mutation("next_obs-width", "next_obs with B+1 rows", "decode", "bad_shape",
             _next_obs_width),
    Mutation("size-mismatch", "rewards data one byte short", "decode", "size_mismatch",
             _short_data),
    Mutation("bool-byte-2", "a bool byte 0x02 in terminated", "decode", "bad_value",
             _bool_two),
    Mutation("rewards-nan", "a NaN reward", "decode", "not_finite", _nan_reward),
    Mutation("valid-row-with-reward", "a row that is not valid (section 4.1.4) with a "
             "nonzero reward", "decode", "bad_field", _valid_row_with_reward),
    Mutation("valid-row-after-open-row", "a row that is not valid after a valid row "
             "that did not end its episode", "decode", "bad_field", _valid_row_open_before),
    Mutation("valid-wrong-shape", "valid of shape [T, B+1]", "decode", "bad_shape",
             _valid_shape),
    Mutation("other-run", "another run's run_id", "admit", "other_run",
             _set("run_id", "0000deadbeef")),
    Mutation("wrong-token", "a token that is not the registration's", "admit",
             "unknown_actor", lambda b, c: b.__setitem__("token", bytes(16))),
    Mutation("version-unpublished", "a version the learner has not published", "admit",
             "bad_version", lambda b, c: b.__setitem__("version", c.version + 1)),
    Mutation("slot-out-of-range", "a slot >= the actor's num_envs", "admit", "bad_slot",
             _bad_slot),
    Mutation("obs-wrong-shape", "observation leaves with an extra dimension", "admit",
             "bad_obs", _bad_obs),
    Mutation("reward-1e10", "a reward of 1e10 (finite, past 1e9)", "admit", "out_of_range",
             _huge_reward),
    Mutation("actions-wrong-shape", "actions with an extra dimension", "admit",
             "bad_actions", _bad_actions),
    Mutation("valid-in-single-agent-run", "a well-formed valid marking a row not valid "
             "(section 4.1.4), sent to a single-agent run", "admit", "bad_valid",
             _not_valid_last_row, lambda ctx: ctx.agents_per_env == 1),
    Mutation("masked-action", "cell (0, 0)'s action_mask forbidding the action it took",
             "admit", "masked_action", _mask_out_first_action, lambda ctx: ctx.masked),
    Mutation("state-mismatch", "a recurrent state the run does not have (or none where "
             "it does)", "admit", "bad_state", _wrong_state),
    Mutation("seq-old", "seq one below the expected one (a duplicate)", "admit", "old_seq",
             lambda b, c: b.__setitem__("seq", c.next_seq - 1)),
    Mutation("seq-jump", "seq 1025 beyond the expected one", "admit", "seq_jump",
             lambda b, c: b.__setitem__("seq", c.next_seq + 1025)),
)  # fmt: skip
"""Every defect of a fragment the learner must reject, as a mutation of a valid one."""


def mutated_fragment(base: dict[str, Any], mutation: Mutation, ctx: Context) -> bytes:
    """The frame of ``base`` (a fragment map with the envelope) after ``mutation``."""
    body = unpack(pack(base))  # a deep copy
    mutation.apply(body, ctx)
    return pack(body)


def _control_invalid() -> list[dict[str, Any]]:
    """Invalid frames of the control socket and of the hello checks."""
    from gymnasium import spaces

    hello = _hello()
    v1_hello = {**hello.to_map(), "next_seq": [], "proto": 1, "type": "hello"}
    v1_hello.pop("rejoin_run_id")
    mismatch = {**hello.to_map(), "action_space": space_spec(spaces.Discrete(3))}
    only_one = {**hello.to_map(), "action_space": {}}
    beat = Heartbeat(actor_id=0, token=TOKEN, run_id=RUN_ID, version=15).to_map()
    envelope = {"proto": PROTOCOL_VERSION}
    return [
        _invalid("control-v1-hello", "a protocol-1 hello (answered refuse version_mismatch)",
                 pack(v1_hello), "control", "decode", "version_mismatch",
                 refuse="version_mismatch"),
        _invalid("control-fragment", "a fragment sent to the control socket", pack(
            {**cartpole_fragment().to_map(), **envelope, "type": "fragment"}),
                 "control", "decode", "unexpected_type"),
        _invalid("heartbeat-paused-1.5", "an actor heartbeat with paused 1.5", pack(
            {**beat, "paused": 1.5, **envelope, "type": "heartbeat"}),
                 "control", "decode", "bad_field"),
        _invalid("heartbeat-no-token", "an actor heartbeat without its token", pack(
            {**{k: v for k, v in beat.items() if k != "token"}, **envelope,
             "type": "heartbeat"}), "control", "decode", "bad_field"),
        _invalid("heartbeat-unknown-token", "a heartbeat whose token is not the "
                 "registration's (answered refuse reregister)", pack(
            {**beat, "token": bytes(16), **envelope, "type": "heartbeat"}),
                 "control", "session", "unknown_actor", refuse="reregister",
                 context=worked_context()),
        _invalid("heartbeat-other-run", "a heartbeat of another run (queued toward a "
                 "learner that restarted on these ports, section 5.6): answered refuse "
                 "reregister, counted control/other_run, not as a reject",
                 pack({**beat, "run_id": "0123456789ab", "token": bytes(16), **envelope,
                       "type": "heartbeat"}),
                 "control", "session", "other_run", refuse="reregister",
                 context=worked_context(), counter="control/other_run"),
        _invalid("hello-space-mismatch", "a hello whose action space is Discrete(3) where "
                 "the learner runs Discrete(2)", pack({**mismatch, **envelope,
                                                       "type": "hello"}),
                 "control", "hello", "space_mismatch", refuse="space_mismatch"),
        _invalid("hello-one-space", "a hello with an observation space but no action space",
                 pack({**only_one, **envelope, "type": "hello"}),
                 "control", "hello", "bad_hello", refuse="bad_hello"),
        _invalid("hello-num_envs-out-of-range", "a hello asking for 5000 slots (over 4096): "
                 "does not decode, answered refuse bad_hello naming the field",
                 pack({**hello.to_map(), "num_envs": 5000, **envelope, "type": "hello"}),
                 "control", "decode", "bad_field", refuse="bad_hello"),
        _invalid("hello-features-string", "a hello whose features is the str 'policies', "
                 "not an array of str: does not decode, answered refuse bad_hello",
                 pack({**hello.to_map(), "features": FEATURE_POLICIES, **envelope,
                       "type": "hello"}),
                 "control", "decode", "bad_field", refuse="bad_hello"),
        _invalid("hello-num_envs-not-a-multiple", "a hello asking for 3 slots from a run "
                 "whose agents_per_env is 2 (section 4.3: a whole number of env copies)",
                 pack({**hello.to_map(), "num_envs": 3, **envelope, "type": "hello"}),
                 "control", "hello", "bad_hello", refuse="bad_hello", agents_per_env=2),
        _invalid("map-key-int", "a heartbeat with an int map key (section 3.1: keys are str)",
                 pack({**beat, 7: 1, **envelope, "type": "heartbeat"}),
                 "control", "decode", "not_msgpack"),
        _invalid("map-key-bin", "a bye whose stats map has a bin key",
                 pack({**Bye(0, TOKEN, {}, -1).to_map(), "stats": {b"steps": 1.0},
                       **envelope, "type": "bye"}),
                 "control", "decode", "not_msgpack"),
    ]  # fmt: skip


def _masked_invalid() -> list[dict[str, Any]]:
    """Fragments of a masked run (the valid vector ``fragment-masked``) whose rows break
    their own masks: rejected ``masked_action`` (section 7.2)."""
    import dataclasses

    header = {"actor_id": 0, "version": 3, "run_id": RUN_ID, "token": TOKEN, "sent_at": SENT_AT}
    context = dataclasses.replace(worked_context(), version=3, next_seq=11)
    context = dataclasses.replace(
        context, observation_space=masked_spaces()[0], action_space=masked_spaces()[1]
    )
    base = {**_masked_fragment(11, header).to_map(), "proto": PROTOCOL_VERSION, "type": "fragment"}
    (masked,) = [m for m in FRAGMENT_MUTATIONS if m.name == "masked-action"]
    empty = unpack(pack(base))
    mask = empty["obs"]["action_mask"]
    _set_cell(mask, 0, b"\x00")  # cell (0, 0): every entry 0
    _set_cell(mask, 1, b"\x00")
    _set_cell(mask, 2, b"\x00")
    return [
        _invalid("fragment-masked-action", "the masked fragment with cell (0, 0)'s "
                 "action_mask forbidding the action it took", mutated_fragment(
                     base, masked, context), "experience", "admit", "masked_action",
                 context=context),
        _invalid("fragment-mask-allows-nothing", "the masked fragment with cell (0, 0)'s "
                 "action_mask all 0 (no action allowed)", pack(empty), "experience",
                 "admit", "masked_action", context=context),
    ]  # fmt: skip


def _envelope(message: Any) -> dict[str, Any]:
    """The map of ``message`` with the envelope (a deep copy: free to mutate)."""
    return unpack(encode(message))


def _policies_invalid() -> list[dict[str, Any]]:
    """Invalid frames of a run of several policies (section 4.9): welcomes and weights
    an actor must reject, and a hello the learner must refuse."""
    from gymnasium import spaces

    def welcome(name: str, description: str, edit: Callable[[dict[str, Any]], None]) -> Any:
        body = _envelope(_policies_welcome())
        edit(body)
        return _invalid(
            f"welcome-{name}",
            f"the two-policy welcome with {description}",
            pack(body),
            "actor-control",
            "decode",
            "bad_field",
        )

    def config(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
        return lambda body: body["config"].__setitem__(key, value)

    def rename_second(body: dict[str, Any]) -> None:
        cfg = body["config"]
        cfg["policy_map"] = ["first", "sec ond"]
        cfg["policies"] = {"first": cfg["policies"]["first"], "sec ond": cfg["policies"]["second"]}

    second = _tiny_weights(16, "second", 6)
    bad_id = {**_envelope(second), "policy": "second/x"}
    hello = Hello(
        actor_id=-1,
        env_id="my_sim.pairs:two_carts",
        observation_space=space_spec(_spaces()["box"]),
        action_space=space_spec(spaces.Discrete(2)),
        num_envs=2,
        features=[FEATURE_POLICIES] * 17,
    )

    def drop_policy_type(body: dict[str, Any]) -> None:
        for policy in (body["config"]["policy"], *body["config"]["policies"].values()):
            policy.pop("policy_type")

    return [
        welcome("policy-key-missing", "no policy_type in its networks (section 4.4: every "
                "key of config.policy is required)", drop_policy_type),
        welcome("policy_map-length", "a policy_map of 3 ids for agents_per_env 2",
                config("policy_map", ["first", "second", "first"])),
        welcome("policy_map-unknown-id", "policy_map ['first', 'third']: 'third' is not "
                "a key of policies", config("policy_map", ["first", "third"])),
        welcome("policies-unused-id", "a policy 'third' in policies that no agent has",
                lambda b: b["config"]["policies"].__setitem__(
                    "third", b["config"]["policies"]["second"])),
        welcome("policy_map-missing", "policies but no policy_map",
                lambda b: b["config"].pop("policy_map")),
        welcome("policy-id-bad", "the policy id 'sec ond' (a space is not allowed)",
                rename_second),
        welcome("policy_weights-order", "policy_weights in the wrong order (second, "
                "first)", lambda b: b["policy_weights"].reverse()),
        _invalid("weights-topic-mismatch", "the weights of policy 'second' published "
                 "under the topic of policy 'first'", encode(second), "weights", "decode",
                 "bad_field", topic=weights_topic("first")),
        _invalid("weights-policy-bad-id", "weights of policy 'second/x' (a '/' is not "
                 "allowed in a policy id)", pack(bad_id), "weights", "decode", "bad_field",
                 topic=b"policy/second/x\0"),
        _invalid("hello-features-too-many", "a hello with 17 features (at most 16): "
                 "does not decode, answered refuse bad_hello naming the field",
                 encode(hello), "control", "decode", "bad_field", refuse="bad_hello"),
    ]  # fmt: skip


ACTOR_SOCKETS = {"actor-control": "control", "weights": "weights"}
"""The sockets of invalid vectors an *actor* rejects (its DEALER and SUB), with the
prefix of the actor's counter (section 7.4)."""


def _invalid(
    name: str,
    description: str,
    frame: bytes,
    socket: str,
    stage: str,
    reason: str,
    refuse: str | None = None,
    context: Context | None = None,
    topic: bytes | None = None,
    counter: str = "",
    agents_per_env: int = 1,
) -> dict[str, Any]:
    if counter:
        pass
    elif socket in ACTOR_SOCKETS:
        counter = f"{ACTOR_SOCKETS[socket]}:{reason}"
    elif stage == "hello":
        counter = f"refused/{reason}"
    else:
        counter = f"rejected/{socket}/{reason}"
    try:
        view = to_view(unpack(frame))
    except Exception:  # noqa: BLE001 - not msgpack at all: no view
        view = None
    out: dict[str, Any] = {
        "name": name,
        "description": description,
        "socket": socket,
        "stage": stage,
        "reason": reason,
        "counter": counter,
        "refuse": refuse,
        "size": len(frame),
        "hex": frame.hex(),
    }
    if topic is not None:  # a two-frame publication [topic, frame] (section 4.9)
        out["topic"] = topic.hex()
    out["view"] = view
    if context is not None or stage == "admit":
        out["context"] = (context or worked_context()).to_json()
    if stage == "hello":
        from gymnasium import spaces

        out["context"] = {
            "env_id": "CartPole-v1",
            "observation_space": to_view(space_spec(_spaces()["box"])),
            "action_space": to_view(space_spec(spaces.Discrete(2))),
            "agents_per_env": agents_per_env,
        }
    return out


def invalid_vectors() -> list[dict[str, Any]]:
    """Every invalid vector: the frame, where it goes, the reason and counter."""
    worked = cartpole_fragment()
    base = {**worked.to_map(), "proto": PROTOCOL_VERSION, "type": "fragment"}
    good = pack(base)
    context = worked_context()
    out = [
        _invalid("not-msgpack", "the byte 0xc1 (never valid msgpack)", b"\xc1",
                 "experience", "decode", "not_msgpack"),
        _invalid("trailing-bytes", "a valid fragment followed by one more byte",
                 good + b"\x00", "experience", "decode", "not_msgpack"),
        _invalid("not-a-map", "a msgpack list", pack([1, 2, 3]), "experience", "decode",
                 "not_a_map"),
        _invalid("proto-1", "the worked fragment with proto 1", pack({**base, "proto": 1}),
                 "experience", "decode", "version_mismatch"),
        _invalid("proto-missing", "the worked fragment without proto", pack(
            {k: v for k, v in base.items() if k != "proto"}), "experience", "decode",
                 "version_mismatch"),
        _invalid("unknown-type", "type 'fragments'", pack({**base, "type": "fragments"}),
                 "experience", "decode", "unknown_type"),
        _invalid("hello-on-experience", "a hello sent to the experience socket", pack(
            {**Hello(-1, "", {}, {}, 0).to_map(), "proto": PROTOCOL_VERSION,
             "type": "hello"}), "experience", "decode", "unexpected_type"),
    ]  # fmt: skip
    for mutation in FRAGMENT_MUTATIONS:
        if not mutation.applies(context):
            continue
        out.append(
            _invalid(
                f"fragment-{mutation.name}",
                f"the worked fragment with {mutation.description}",
                mutated_fragment(base, mutation, context),
                "experience",
                mutation.stage,
                mutation.reason,
                context=context if mutation.stage == "admit" else None,
            )
        )
    out.extend(_masked_invalid())
    out.extend(_policies_invalid())
    turn_based = _envelope(_turn_based_welcome())
    turn_based["config"]["opening_moves"] = -1
    out.append(
        _invalid(
            "welcome-opening_moves-negative",
            "the turn-based welcome with opening_moves -1",
            pack(turn_based),
            "actor-control",
            "decode",
            "bad_field",
        )
    )
    out.extend(_control_invalid())
    out.extend(_grants_invalid())
    return out


def _grants_invalid() -> list[dict[str, Any]]:
    """Invalid frames of grants (section 5.4.1): a grant in an actor's heartbeat (the
    learner rejects it), a negative grant and a batch_rows of 0 in a welcome (the actor
    rejects it)."""
    beat = Heartbeat(actor_id=0, token=TOKEN, run_id=RUN_ID, version=15).to_map()
    negative = _envelope(_rows_welcome())
    negative["grant"] = -1
    zero = _envelope(_rows_welcome())
    zero["config"]["batch_rows"] = 0
    return [
        _invalid("heartbeat-actor-grant", "an actor heartbeat carrying a grant (only a "
                 "learner's heartbeat has one, section 4.6)", pack(
                     {**beat, "grant": 544, "proto": PROTOCOL_VERSION, "type": "heartbeat"}),
                 "control", "decode", "bad_field"),
        _invalid("welcome-grant-negative", "the welcome of a learner of rows batches with "
                 "grant -1", pack(negative), "actor-control", "decode", "bad_field"),
        _invalid("welcome-batch_rows-zero", "the welcome of a learner of rows batches with "
                 "config.batch_rows 0 (absent means every-slot rollouts; present, at least "
                 "1)", pack(zero), "actor-control", "decode", "bad_field"),
    ]  # fmt: skip


# --------------------------------------------------------------------------- files


def _hex_dump(frame: bytes) -> str:
    lines = []
    for offset in range(0, len(frame), 32):
        chunk = frame[offset : offset + 32].hex()
        words = " ".join(chunk[i : i + 8] for i in range(0, len(chunk), 8))
        lines.append(f"{offset:04x}  {words}")
    return "\n".join(lines)


def compact_json(value: Any, indent: str = "") -> str:
    """JSON with one key per line but every list of scalars (or of such lists) and
    every small map of scalars on one line: how the page prints a view."""
    flat = json.dumps(value)
    if len(indent) + len(flat) <= 88 or _scalar_list(value):
        return flat
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {compact_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if isinstance(value, list):
        items = [inner + compact_json(v, inner) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + indent + "]"
    return flat


def _scalar_list(value: Any) -> bool:
    if isinstance(value, list):
        return all(_scalar_list(v) or not isinstance(v, (list, dict)) for v in value)
    return False


def worked_example_markdown() -> str:
    """Section 10 of docs/protocol.md, generated from the worked vector."""
    fragment = cartpole_fragment()
    frame = encode(fragment)
    view = to_view(unpack(frame))
    pretty = compact_json(view)
    obs = fragment.obs
    final = fragment.final_obs
    push = "right" if fragment.actions[1, 1] == 1 else "left"
    return f"""Generated by `python -m zmq_rl.conformance.vectors` from real CartPole-v1 steps
(vector `fragment-cartpole-worked.json`; `zmq_rl.conformance.vectors.cartpole_fragment`
says how). Actor 0 of run `{RUN_ID}` steps two slots in lockstep with
`fragment_length = 2`; this is its fragment `seq` {WORKED_SEQ}, acted by weights
version {WORKED_VERSION}. Slot 0 is at steps 10 and 11 of an episode; slot 1 at steps
498 and 499 of an episode that CartPole-v1's 500-step time limit **truncates, not
terminates**, at row 1. So cell (t=1, b=1) needs a final observation: flat index
`1 * B + 1 = 3`. `next_obs[1]` is the reset observation of slot 1's next episode;
`final_obs[0]` is what `env.step` returned for cell (1, 1) (actions are
`{fragment.actions.tolist()}`, so row 1 of slot 1 pushed {push}: `x_dot`
{obs[1, 1, 1]:.4f} → {final[0, 1]:.4f}). `values` and `log_probs` are illustrative
numbers, not a network's.

The view (§11.1):

```json
{pretty}
```

Encoded by `zmq_rl.wire.protocol.encode`, this is one frame of **{len(frame)} bytes**: a
`map16` of {len(view)} entries (`{frame[:3].hex()}`). With no truncated cell,
`final_obs_index` is `{{"dtype": "int32", "shape": [0], "data": <bin 0>}}` and
`final_obs` is `{{"dtype": "float32", "shape": [0, 4], "data": <bin 0>}}`; both keys
MUST still be present.

The complete frame (offset, then 32 bytes a line):

```
{_hex_dump(frame)}
```

Another encoder may order keys differently or pick other integer or float widths and
produce other bytes; any such frame that decodes to the same values is equally
valid (§3.1)."""


def generate(out: Path) -> tuple[int, int]:
    """Write every vector under ``out`` (``NAME.json``, ``invalid/NAME.json``, an
    ``index.json``); return (valid, invalid) counts."""
    valid, invalid = valid_vectors(), invalid_vectors()
    (out / "invalid").mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.json"), *(out / "invalid").glob("*.json")]:
        old.unlink()
    for vector in valid:
        _write(out / f"{vector['name']}.json", vector)
    for vector in invalid:
        _write(out / "invalid" / f"{vector['name']}.json", vector)
    index = {
        "protocol": PROTOCOL_VERSION,
        "generator": "python -m zmq_rl.conformance.vectors --out docs/protocol/vectors",
        "valid": [v["name"] for v in valid],
        "invalid": [v["name"] for v in invalid],
    }
    _write(out / "index.json", index)
    return len(valid), len(invalid)


def _write(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    """``python -m zmq_rl.conformance.vectors --out DIR``: write the golden vectors."""
    parser = argparse.ArgumentParser(description="Write the golden vectors of the protocol.")
    parser.add_argument("--out", type=Path, default=Path("docs/protocol/vectors"))
    parser.add_argument(
        "--example", action="store_true", help="print docs/protocol.md section 10 instead"
    )
    args = parser.parse_args(argv)
    if args.example:
        print(worked_example_markdown())
        return 0
    valid, invalid = generate(args.out)
    print(f"wrote {valid} valid and {invalid} invalid vectors to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
