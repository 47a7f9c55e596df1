"""This process's place in a (possibly one-process) torch.distributed group: torchrun gives DDP, or
FSDP2 with `--fsdp`; gloo on CPU and nccl on GPU."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import torch

from ...dtypes import compute_device


@dataclass
class World:
    """This process's place in a (possibly 1-process) torch.distributed group."""

    rank: int = 0
    size: int = 1
    ddp: bool = False  # several processes (a group of more than one)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    fsdp: bool = False  # parameters, gradients and optimizer state sharded over the group (distill/parallel/sharding.py)
    owns_group: bool = False  # this process made a one-process group for --fsdp without torchrun

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world(fsdp: bool = False) -> World:
    """torchrun sets WORLD_SIZE/RANK: join the group (gloo on CPU, nccl on GPU). `--fsdp` without
    torchrun runs as one shard of a one-process group, so it takes the same code path."""
    size = launched_world_size()
    device = training_device()
    if size == 1 and not fsdp:
        return World(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns_group = False
    if not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if size == 1:
            print(
                "swiftkv distill: --fsdp without torchrun: one process, one shard",
                file=sys.stderr,
                flush=True,
            )
            torch.distributed.init_process_group(
                backend, store=torch.distributed.HashStore(), rank=0, world_size=1
            )
            owns_group = True
        else:
            torch.distributed.init_process_group(backend)
    rank, size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    return World(rank, size, ddp=size > 1, device=device, fsdp=fsdp, owns_group=owns_group)


def launched_world_size() -> int:
    """The processes torchrun started (WORLD_SIZE; 1 without torchrun), known before any group exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_as_main() -> bool:
    """Whether this is torchrun's first process (RANK 0) or no torchrun at all, known before any group."""
    return int(os.environ.get("RANK", "0")) == 0


def close_world(world: World) -> None:
    """Leave the one-process group `init_world` made (a torchrun group is torchrun's to end)."""
    if world.owns_group and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def training_device() -> torch.device:
    """This process's GPU when there is one (torchrun's LOCAL_RANK picks it), else the CPU. A single
    process on a GPU machine trains on the GPU too, not only a torchrun group."""
    return compute_device(int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce(
    tensor: torch.Tensor,
    world: World,
    op: torch.distributed.ReduceOp.RedOpType = torch.distributed.ReduceOp.SUM,
) -> torch.Tensor:
    """Sum (or `op`) over processes, returned (through the group's device: nccl only reduces CUDA
    tensors, so a host tensor is reduced in a copy)."""
    if not world.ddp:
        return tensor
    on_device = tensor.to(world.device)
    torch.distributed.all_reduce(on_device, op=op)
    return on_device.to(tensor.device)


def barrier(world: World) -> None:
    if world.ddp or world.fsdp:
        torch.distributed.barrier()


def log(world: World, message: str) -> None:
    if world.is_main:
        print(message, flush=True)
