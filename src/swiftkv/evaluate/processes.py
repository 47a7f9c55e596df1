"""Where `swiftkv eval` runs: the device, and under torchrun or `accelerate launch` (both set WORLD_SIZE,
RANK and LOCAL_RANK) this process's share of the work.

Every process runs the same evaluation: lm-eval builds the same requests in each, and each unit of work
(a scoring batch, a conversation, a prompt) is computed by one process and handed to all, so every process
ends with the same numbers a single process computes. A batch is the same batch at any process count (the
batches are formed first, then dealt out), so the scores are the same to the bit, not only within rounding.
The results cache is read and written by process 0 alone, its answers broadcast: every process sees the
same cache, so all agree on what is left to compute.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..dtypes import compute_device

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def eval_device(name: str, local_rank: int = 0) -> torch.device:
    """`--device`: cpu, cuda (this process's GPU: LOCAL_RANK's under a launcher) or auto (cuda when
    there is one). Checked before any model loads."""
    if name not in DEVICE_CHOICES:
        raise ValueError(f"--device {name!r} is unknown; expected one of {list(DEVICE_CHOICES)}")
    if name == "auto":
        return compute_device(local_rank)
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible to this process; use --device cpu")
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"--device cuda: LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are visible"
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


@dataclass
class Processes:
    """This process's place among the evaluation's processes (one, without a launcher)."""

    rank: int = 0
    size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    units: int = 0  # units of work (batches, conversations, prompts) this process computed

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_gather(self, value: object) -> list:
        """Every process's `value`, in rank order."""
        if self.size == 1:
            return [value]
        values = [None] * self.size
        torch.distributed.all_gather_object(values, value)
        return values

    def broadcast(self, value: object) -> object:
        """Process 0's `value`, in every process."""
        if self.size == 1:
            return value
        box = [value]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def computed(self, items: list, compute: Callable) -> Iterator[tuple[object, object]]:
        """(item, compute(item)) for each item, in order, in every process: item i is computed by process
        i % size, one round of `size` items at a time (so a crash loses at most a round)."""
        for start in range(0, len(items), self.size):
            round_items = items[start : start + self.size]
            mine = None
            if self.rank < len(round_items):
                mine = compute(round_items[self.rank])
                self.units += 1
            yield from zip(round_items, self.all_gather(mine)[: len(round_items)], strict=True)


def launched_processes() -> int:
    """The processes torchrun or accelerate launch started (WORLD_SIZE; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def start_processes(device: str = "auto") -> Processes:
    """Join the launcher's group (gloo on CPU, nccl on GPU); one process without a launcher."""
    size = launched_processes()
    place = eval_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if size == 1:
        return Processes(device=place)
    if place.type == "cuda":
        torch.cuda.set_device(place)
    if not torch.distributed.is_initialized():
        # lm-eval (the snowflake recipe) gathers only at the end of a task, after answers of uneven
        # lengths in each process: a long wait is expected there, not a hang (lm-eval allows a year).
        torch.distributed.init_process_group(
            "nccl" if place.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=12)
        )
    return Processes(torch.distributed.get_rank(), torch.distributed.get_world_size(), place)


class SharedStore:
    """A results cache seen alike by every process: process 0 reads and writes it, the others receive
    what it read (they never open the file)."""

    def __init__(self, store, processes: Processes):
        self.store, self.processes = store, processes

    def get_many(self, model: str, keys) -> dict[str, object]:
        found = self.store.get_many(model, keys) if self.processes.is_main else None
        return self.processes.broadcast(found)

    def put_many(self, model: str, items: dict[str, object]) -> None:
        if self.processes.is_main:
            self.store.put_many(model, items)

    def close(self) -> None:
        if self.processes.is_main:
            self.store.close()
