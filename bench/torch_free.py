"""Actor hosts without torch (issue 46): what acting costs per step in numpy, in torch
and in ONNX Runtime, and what the actor host's install costs.

``step``: for each shipped network at its preset's size, the CPU time of one acting
step of ``B`` rows (B = 1, 8, 64; one thread each; CPU time, not wall time, so that a
shared box's load does not count):

* ``numpy``: :mod:`zmq_rl.rl.numpy_nets` / :mod:`~zmq_rl.rl.numpy_mlp` ``act``
  (the forward pass and the sampling), what every actor runs;
* ``torch``: the torch module's ``act`` with a ``torch.Generator``, the observations
  converted as an actor converts them (``torch.from_numpy``), under ``inference_mode``;
* ``onnxruntime``: the module's forward pass (distribution parameters and values,
  and the next state of a recurrent cell) exported with ``torch.onnx.export`` and
  run in an ``InferenceSession`` (one intra-op thread), plus the numpy sampling on
  its output -- what an ONNX Runtime actor would run.

``install``: zmq_rl's wheel built from this tree (not timed), a fresh venv
(``python -m venv``), then ``pip install`` of the wheel with no extras (the actor
host's install, tests/actor_host.py; its dependencies from the wheels pip finds):
seconds, and megabytes on disk of the venv and of what the install added
(site-packages less the venv's own pip and setuptools); checks that torch is absent.

    python bench/torch_free.py                 # both
    python bench/torch_free.py step --smoke
    python bench/torch_free.py install
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _util  # noqa: E402

ROOT = _util.ROOT
BATCHES = (1, 8, 64)


def networks() -> dict[str, tuple[Any, Any, Any]]:
    """The shipped networks at their presets' sizes: (observation space, action space,
    policy config)."""
    import gymnasium as gym
    import numpy as np

    from zmq_rl.config import PolicyConfig

    board = gym.spaces.Dict(
        [
            ("action_mask", gym.spaces.Box(0, 1, (7,), np.int8)),
            ("observation", gym.spaces.Box(0, 1, (6, 7, 2), np.int8)),
        ]
    )
    box = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
    return {
        "mlp (CartPole)": (
            gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
            gym.spaces.Discrete(2),
            PolicyConfig(),
        ),
        "masked dict (tic-tac-toe)": (
            gym.spaces.Dict(
                [
                    ("action_mask", gym.spaces.Box(0, 1, (9,), np.int8)),
                    ("observation", gym.spaces.Box(0, 1, (3, 3, 2), np.int8)),
                ]
            ),
            gym.spaces.Discrete(9),
            PolicyConfig(),
        ),
        "multi-discrete head": (box, gym.spaces.MultiDiscrete([3, 3, 3]), PolicyConfig()),
        "box 2-d head": (box, gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32), PolicyConfig()),
        "lstm": (
            gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            gym.spaces.Discrete(2),
            PolicyConfig(policy_type="lstm"),
        ),
        "gru": (
            gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
            gym.spaces.Discrete(2),
            PolicyConfig(policy_type="gru"),
        ),
        "minatar_cnn": (
            gym.spaces.Box(0, 1, (4, 10, 10), np.uint8),
            gym.spaces.Discrete(3),
            PolicyConfig(factory="zmq_rl.rl.cnn:minatar_cnn"),
        ),
        "nature_cnn (Atari)": (
            gym.spaces.Box(0, 255, (4, 84, 84), np.uint8),
            gym.spaces.Discrete(6),
            PolicyConfig(factory="zmq_rl.rl.cnn:nature_cnn"),
        ),
        "board_cnn": (
            board,
            gym.spaces.Discrete(7),
            PolicyConfig(factory="zmq_rl.rl.boards:board_cnn"),
        ),
        "gravity_board_cnn": (
            board,
            gym.spaces.Discrete(7),
            PolicyConfig(factory="zmq_rl.rl.boards:gravity_board_cnn"),
        ),
        "drop_game_cnn": (
            board,
            gym.spaces.Discrete(7),
            PolicyConfig(factory="zmq_rl.rl.boards:drop_game_cnn"),
        ),
    }


def _batch(space: Any, rows: int) -> Any:
    import gymnasium as gym
    import numpy as np

    space.seed(0)
    samples = [space.sample() for _ in range(rows)]
    if isinstance(space, gym.spaces.Dict):
        out = {k: np.stack([s[k] for s in samples]) for k in space.spaces}
        if "action_mask" in out:
            out["action_mask"][:, 0] = 1
        return out
    return np.stack(samples)


def _onnx_session(module: Any, obs: Any, state: Any, path: Path) -> Any:
    """``module``'s forward pass (params, value[, next_state]) as an ONNX Runtime session
    with one thread."""
    import warnings

    import onnxruntime as ort
    import torch

    keys = list(obs) if isinstance(obs, dict) else []

    class Forward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = module

        def forward(self, *inputs: torch.Tensor) -> Any:
            value: Any = dict(zip(keys, inputs, strict=False)) if keys else inputs[0]
            if state is None:
                return self.net(value)
            h, next_state = self.net.unroll(self.net.features(value).unsqueeze(0), inputs[-1])
            h = h[0]
            return self.net.policy_head(h), self.net.value_head(h).squeeze(-1), next_state

    leaves = [obs[k] for k in keys] if keys else [obs]
    example = tuple(torch.from_numpy(a) for a in leaves)
    names = keys or ["obs"]
    if state is not None:
        example += (torch.from_numpy(state),)
        names = [*names, "state"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Forward().eval(),
            example,
            str(path),
            dynamo=False,
            input_names=names,
            dynamic_axes={n: {0: "batch"} for n in names},
            opset_version=17,
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def step_costs(seconds: float) -> list[dict[str, Any]]:
    """Microseconds per acting step of every network of :func:`networks` at each batch
    size of :data:`BATCHES`, in numpy, torch and (when installed) ONNX Runtime."""
    import numpy as np
    import torch

    from zmq_rl.rl.numpy_mlp import rng_of
    from zmq_rl.rl.numpy_nets import numpy_network
    from zmq_rl.rl.policy import build_policy, export_weights

    torch.set_num_threads(1)
    _util_threads()
    rows = []
    tmp = Path(tempfile.mkdtemp(prefix="torch-free-"))
    try:
        for name, (obs_space, act_space, cfg) in networks().items():
            torch.manual_seed(0)
            module = build_policy(obs_space, act_space, cfg.validate()).eval()
            net = numpy_network(obs_space, act_space, cfg, rng_of(0))
            net.load(export_weights(module))
            for b in BATCHES:
                obs = _batch(obs_space, b)
                state = np.zeros((b, net.state_size), np.float32) if net.state_size else None
                row = {"network": name, "batch": b}
                row.update(_step_row(module, net, obs, state, seconds, tmp / "net.onnx"))
                rows.append(row)
                print(
                    f"{name:28s} B={b:3d}  numpy {row['numpy_us']:9.1f} us  torch "
                    f"{row['torch_us']:9.1f} us  onnxruntime "
                    f"{row.get('onnxruntime_us', float('nan')):9.1f} us",
                    flush=True,
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def _step_row(
    module: Any, net: Any, obs: Any, state: Any, seconds: float, onnx_path: Path
) -> dict[str, float]:
    """The three timings of one network and batch."""
    import importlib.util

    import torch

    gen = torch.Generator().manual_seed(0)

    def to_torch() -> Any:
        if isinstance(obs, dict):
            return {k: torch.from_numpy(v) for k, v in obs.items()}
        return torch.from_numpy(obs)

    if state is None:

        def numpy_fn() -> Any:
            return net.act(obs)

        def torch_fn() -> Any:
            with torch.inference_mode():
                return module.act(to_torch(), gen)

    else:
        state_t = torch.from_numpy(state)

        def numpy_fn() -> Any:
            return net.act_recurrent(obs, state)

        def torch_fn() -> Any:
            with torch.inference_mode():
                return module.act_recurrent(to_torch(), state_t, gen)

    row = {"numpy_us": 1e6 * _time(numpy_fn, seconds), "torch_us": 1e6 * _time(torch_fn, seconds)}
    if importlib.util.find_spec("onnxruntime") is None:
        return row
    session = _onnx_session(module, obs, state, onnx_path)
    leaves = dict(obs) if isinstance(obs, dict) else {"obs": obs}
    if state is not None:
        leaves["state"] = state
    feed = {i.name: leaves[i.name] for i in session.get_inputs()}  # (unused ones are pruned)
    mask = obs.get(net.mask_key) if isinstance(obs, dict) and net.mask_key else None
    heads = getattr(net, "heads", None)

    def ort_fn() -> Any:
        params = session.run(None, feed)[0]
        if heads is None:  # the plain MLP: its numpy sampling on the logits
            return params
        return heads.sample(net.w, params, net.rng, mask)

    row["onnxruntime_us"] = 1e6 * _time(ort_fn, seconds)
    return row


def _util_threads() -> None:
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return
    threadpool_limits(limits=1, user_api="blas")


def _time(fn: Any, seconds: float) -> float:
    """CPU seconds of this process per call of ``fn``: the least of 5 runs of about
    ``seconds / 5`` each. CPU time, not wall time: on a box that other work shares
    (this one's two cores often are), waiting for a core is not the cost of a step;
    every variant runs on one thread (BLAS, torch, ONNX Runtime), so the two agree on
    an idle box."""
    fn()
    n = 1
    while True:
        t = time.process_time()
        for _ in range(n):
            fn()
        dt = time.process_time() - t
        if dt > 0.02:
            break
        n *= 2
    reps = max(1, int(seconds / 5 / (dt / n)))
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for _ in range(reps):
            fn()
        best = min(best, (time.process_time() - t) / reps)
    return best


def install_cost() -> dict[str, Any]:
    """A fresh venv and ``pip install`` of zmq_rl's wheel, no extras (the actor host's
    install, tests/actor_host.py; its dependencies from the wheels pip finds)."""
    from tests.actor_host import make_actor_host

    tmp = Path(tempfile.mkdtemp(prefix="actor-host-"))
    try:
        host = make_actor_host(tmp)
        torch = subprocess.run([str(host.python), "-c", "import torch"], capture_output=True)
        out = {
            "venv_s": host.venv_s,
            "pip_install_s": host.install_s,
            "venv_mb": host.venv_mb,
            "installed_mb": host.installed_mb,
            "torch_importable": torch.returncode == 0,
            "packages": host.packages,
        }
        print(
            f"actor host: venv {host.venv_s:.1f} s, pip install {host.install_s:.1f} s; "
            f"{host.venv_mb:.0f} MB venv, {host.installed_mb:.0f} MB installed by zmq_rl "
            f"({len(host.packages)} packages with pip and setuptools); torch importable: "
            f"{out['torch_importable']}",
            flush=True,
        )
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("step", "install", "both"), default="both")
    parser.add_argument("--seconds", type=float, default=1.5, help="per timing")
    _util.add_common_flags(parser)
    args = parser.parse_args()
    data: dict[str, Any] = {}
    if args.what in ("step", "both"):
        data["step"] = step_costs(0.2 if args.smoke else args.seconds)
    if args.what in ("install", "both"):
        data["install"] = install_cost()
    _util.write_result("torch_free", args, data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
