"""torch.distributed at the job level: the launch torchrun describes in the environment.

``torchrun`` (``python -m torch.distributed.run``) starts one process per rank and sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``; a job that sees
``WORLD_SIZE`` > 1 joins the process group (gloo on CPU, NCCL with one GPU per rank on CUDA).
Without torchrun nothing here is used.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch

from phrasescore.errors import InputError

log = logging.getLogger(__name__)

# Ranks wait at barriers while the slowest shard finishes or rank 0 validates or merges: far
# longer than torch's 30-minute default may pass on a large table.
DEFAULT_TIMEOUT = datetime.timedelta(hours=48)


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_env() -> Launch | None:
    """The torchrun launch of this process, or None when it runs alone."""
    world = os.environ.get("WORLD_SIZE")
    if world is None or int(world) <= 1:
        return None
    return Launch(
        rank=int(os.environ["RANK"]),
        world_size=int(world),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
    )


def rank_device(launch: Launch, device: str) -> torch.device:
    """One GPU per rank (``cuda:LOCAL_RANK``) where CUDA is used, else the CPU."""
    from phrasescore.hardware import resolve_device

    resolved = resolve_device(device)
    if resolved.type != "cuda":
        return resolved
    if resolved.index is not None:
        raise InputError("under torchrun give --device cuda (each rank takes cuda:LOCAL_RANK)")
    if launch.local_rank >= torch.cuda.device_count():
        raise InputError(
            f"rank {launch.rank} needs cuda:{launch.local_rank}, but only "
            f"{torch.cuda.device_count()} GPU(s) are visible (--nproc-per-node at most that)"
        )
    torch.cuda.set_device(launch.local_rank)
    return torch.device("cuda", launch.local_rank)


def init(launch: Launch, device: torch.device, backend: str | None = None) -> None:
    """Join the process group: NCCL for CUDA, gloo for the CPU (``backend`` overrides)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend=backend, timeout=DEFAULT_TIMEOUT, **kwargs)
    log.debug("rank %d of %d joined (%s)", launch.rank, launch.world_size, backend)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def all_sum(value: int) -> int:
    """The sum of ``value`` over the ranks (a collective: every rank must call it)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return value
    total = _main_device_tensor(torch.tensor([value], dtype=torch.int64))
    dist.all_reduce(total)
    return int(total.item())


def shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def start_job(device: str) -> tuple[Launch | None, torch.device]:
    """The launch (None without torchrun) and this rank's device; joins the process group."""
    from phrasescore.hardware import resolve_device

    launch = from_env()
    if launch is None:
        return None, resolve_device(device)
    dev = rank_device(launch, device)
    init(launch, dev)
    return launch, dev


class _Loss(torch.nn.Module):
    """``network.loss_terms`` as ``forward``, so that DistributedDataParallel sees the call
    (the self-normalisation penalty, part of the objective, is averaged with the NLL)."""

    def __init__(self, network: torch.nn.Module):
        super().__init__()
        self.network = network

    def forward(self, *args, **kwargs):
        return self.network.loss_terms(*args, **kwargs)


def data_parallel_loss(network: torch.nn.Module, device: torch.device):
    """``network.loss_terms`` wrapped in DistributedDataParallel (gradients averaged over
    ranks)."""
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [device] if device.type == "cuda" else None
    return DistributedDataParallel(_Loss(network), device_ids=device_ids)


def _main_device_tensor(tensor: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    return tensor.cuda() if dist.get_backend() == "nccl" else tensor


def sum_floats(values: list[float]) -> list[float]:
    """Element-wise sums over the ranks, in float64 (a collective)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return values
    total = _main_device_tensor(torch.tensor(values, dtype=torch.float64))
    dist.all_reduce(total)
    return total.cpu().tolist()


def from_main(obj):
    """Rank 0's ``obj`` on every rank (a collective; picklable objects)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather_rng_states() -> list[torch.Tensor]:
    """Every rank's CPU random state, in rank order (a collective)."""
    import torch.distributed as dist

    mine = torch.get_rng_state()
    if not dist.is_initialized():
        return [mine]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states
