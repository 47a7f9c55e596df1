"""This process's place in a (possibly one-process) torch.distributed group: torchrun gives DDP,
gloo on CPU and nccl on GPU."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from ..dtypes import compute_device


@dataclass
class World:
    """This process's place in a (possibly 1-process) torch.distributed group."""

    rank: int = 0
    size: int = 1
    ddp: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_world() -> World:
    """torchrun sets WORLD_SIZE/RANK: join the group (gloo on CPU, nccl on GPU)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    device = training_device()
    if size == 1:
        return World(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(torch.distributed.get_rank(), torch.distributed.get_world_size(), ddp=True, device=device)


def training_device() -> torch.device:
    """This process's GPU when there is one (torchrun's LOCAL_RANK picks it), else the CPU. A single
    process on a GPU machine trains on the GPU too, not only a torchrun group."""
    return compute_device(int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """Sum over processes (through the group's device: nccl only reduces CUDA tensors)."""
    if not world.ddp:
        return tensor
    on_device = tensor.to(world.device)
    torch.distributed.all_reduce(on_device)
    return on_device.to(tensor.device)


def log(world: World, message: str) -> None:
    if world.is_main:
        print(message, flush=True)
