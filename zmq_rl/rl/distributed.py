"""Data-parallel learner ranks on ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

``num_learners = N`` runs N learner processes that train one policy. Rank 0 is the
learner the actors know: it owns the control socket, the membership, the weight
publisher, evaluation, checkpoints and the report. Every rank binds its own
experience PULL port (:meth:`~zmq_rl.config.LearnerConfig.experience_port`), and the
welcome sends each actor to the rank with the fewest live slots.

Every update the ranks meet three times, always in the same order, so a collective
never waits on a rank that is somewhere else (docs/design.md §4.2):

1. **plan** (broadcast from rank 0, msgpack): stop or go, the policy version, the
   env steps consumed, and each rank's actors (id, session token, slots, base
   version, member or waiting);
2. **report** (all-gather, msgpack): after each rank filled its own slots: its rows,
   what its actors delivered, whom it declared dead, the previous update's episode
   returns, a digest of its parameters;
3. **gradients** (all-reduce, inside :meth:`zmq_rl.rl.ppo.PPOTrainer.update`): every
   minibatch's gradient is the row-weighted mean over the ranks, so every rank takes
   the identical step. A rank without rows contributes weight 0 and still steps.

Nothing here touches a socket of the actors; messages between ranks are msgpack in
byte tensors (no pickle). The configs reach a locally spawned rank through
``multiprocessing``'s pipe to its own child, as the background evaluator's do.
"""

from __future__ import annotations

import datetime
import logging
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgpack
import torch
import torch.distributed as dist
from torch import nn

__all__ = [
    "Collective",
    "DataParallel",
    "LearnerRankLost",
    "RankSpec",
    "parameter_digest",
    "rank_spec",
]

log = logging.getLogger("zmq_rl.distributed")

RANK_TIMEOUT_S = 1800.0
"""How long a collective waits for a rank (gloo's default): rank 0 may evaluate or
checkpoint between two updates while the others wait in the plan."""


class LearnerRankLost(RuntimeError):
    """Another learner rank failed or exited mid-run: its collective broke. Rank 0
    ends the run (actors shut down, checkpoint and report written) and says so; the
    run continues with ``--resume``."""


def is_collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a broken collective (a peer rank gone), not a bug here."""
    dist_error = getattr(dist, "DistError", None)
    if dist_error is not None and isinstance(exc, dist_error):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("gloo" in text or "Connection" in text)


@dataclass(frozen=True)
class RankSpec:
    """One learner rank: its number, how many there are, where they meet."""

    rank: int
    world_size: int
    init_method: str  # "env://" under torchrun, else tcp://HOST:rendezvous_port

    @property
    def leader(self) -> bool:
        """Rank 0: control, weights, evaluation, checkpoints, the report."""
        return self.rank == 0


def rank_spec(num_learners: int, host: str, rendezvous_port: int) -> RankSpec | None:
    """This process's rank: from torchrun's ``RANK``/``WORLD_SIZE`` when set (then
    ``WORLD_SIZE`` must equal ``num_learners``), else rank 0 of ``num_learners`` that
    meet at ``host:rendezvous_port``; None for a single learner."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
        if world != num_learners:
            raise ValueError(
                f"num_learners={num_learners} but torchrun's WORLD_SIZE={world}: "
                "launch as many processes as --num-learners"
            )
        return RankSpec(int(os.environ["RANK"]), world, "env://") if world > 1 else None
    if num_learners <= 1:
        return None
    meet = "127.0.0.1" if host in ("0.0.0.0", "*", "") else host.strip("[]")
    return RankSpec(0, num_learners, f"tcp://{meet}:{rendezvous_port}")


class Collective:
    """The process group of the learner ranks, with msgpack messages in byte tensors."""

    def __init__(self, spec: RankSpec, backend: str = "gloo") -> None:
        self.spec = spec
        self.rank, self.world_size = spec.rank, spec.world_size
        dist.init_process_group(
            backend,
            init_method=spec.init_method,
            rank=spec.rank,
            world_size=spec.world_size,
            timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S),
        )
        log.info("learner rank %d of %d joined (%s)", spec.rank, spec.world_size, backend)

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def broadcast(self, message: Any = None) -> Any:
        """Rank 0's ``message`` (msgpack-able) on every rank."""
        data = msgpack.packb(message) if self.rank == 0 else b""
        length = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(length, 0)
        if self.rank == 0:
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        else:
            buf = torch.empty(int(length.item()), dtype=torch.uint8)
        dist.broadcast(buf, 0)
        return msgpack.unpackb(buf.numpy().tobytes(), strict_map_key=False)

    def all_gather(self, message: Any) -> list[Any]:
        """Every rank's ``message``, by rank."""
        data = msgpack.packb(message)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(lengths, torch.tensor([len(data)], dtype=torch.int64))
        longest = max(int(t.item()) for t in lengths)
        mine = torch.zeros(longest, dtype=torch.uint8)
        mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(bufs, mine)
        return [
            msgpack.unpackb(b[: int(n.item())].numpy().tobytes(), strict_map_key=False)
            for b, n in zip(bufs, lengths, strict=True)
        ]

    def share_tensors(self, tensors: Iterable[torch.Tensor]) -> None:
        """Overwrite each tensor, in place, with rank 0's (a CUDA tensor through a
        host copy: the ranks talk over gloo)."""
        for tensor in tensors:
            host = tensor.data.cpu() if tensor.is_cuda else tensor.data
            dist.broadcast(host, 0)
            if host is not tensor.data:
                tensor.data.copy_(host)


class DataParallel:
    """Gradient all-reduce for :class:`~zmq_rl.rl.ppo.PPOTrainer` (its ``sync``)."""

    def __init__(self, collective: Collective) -> None:
        self.collective = collective

    def sum_counts(self, counts: list[int]) -> list[int]:
        """Element-wise sums of ``counts`` over every rank."""
        total = torch.tensor(counts, dtype=torch.int64)
        dist.all_reduce(total)
        return [int(v) for v in total.tolist()]

    def average_gradients(
        self, parameters: Iterable[nn.Parameter], weight: int, approx_kl: float
    ) -> float | None:
        """Each parameter's gradient becomes ``sum_r w_r g_r / sum_r w_r`` (``w_r``:
        rank r's rows in this minibatch, so the step is the one a single learner would
        take on the union of the ranks' minibatches); return the same weighted mean
        of ``approx_kl`` (None, gradients cleared, when every weight is 0). One
        all-reduce per minibatch; every rank ends with identical gradients."""
        params = list(parameters)
        device = params[0].device
        parts = [
            p.grad.detach().reshape(-1) * weight
            if p.grad is not None
            else torch.zeros(p.numel(), device=device, dtype=p.dtype)
            for p in params
        ]
        parts.append(
            torch.tensor([float(weight), weight * approx_kl], device=device, dtype=parts[0].dtype)
        )
        flat = torch.cat(parts).cpu()  # gloo: one host copy per minibatch on CUDA
        dist.all_reduce(flat)
        flat = flat.to(device)
        total = float(flat[-2])
        if total == 0:
            for p in params:
                p.grad = None
            return None
        at = 0
        for p in params:
            n = p.numel()
            p.grad = (flat[at : at + n] / total).view_as(p).clone()
            at += n
        return float(flat[-1]) / total


def parameter_digest(module: nn.Module) -> int:
    """A CRC-32 of every parameter and buffer's bytes (on the CPU): equal on every
    rank while the ranks train one policy, so a difference names a divergence."""
    crc = 0
    for name, tensor in module.state_dict().items():
        crc = zlib.crc32(name.encode(), crc)
        crc = zlib.crc32(tensor.detach().cpu().contiguous().numpy().tobytes(), crc)
    return crc
