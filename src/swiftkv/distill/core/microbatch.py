"""How many blocks one forward takes (`--micro-batch`): a number, or `auto`.

The optimizer step is the same for any micro-batch size (each micro-batch's loss is scaled by the
global batch's denominators), so the size only trades memory for speed. `auto` on CUDA tries the
divisors of the per-process batch from the largest down, with one real forward + backward on the
run's first blocks, and keeps the first that fits with room for the optimizer state; on a CPU a
bigger micro-batch buys nothing (the matmuls are already large at 1024 tokens per block), so it is 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

AUTO = "auto"
CPU_MICRO_BATCH = 2
# A micro-batch fits when its probe step peaks below this share of the device's memory: the rest is
# for the optimizer state (allocated at the first step) and the allocator's fragmentation.
MEMORY_SHARE = 0.85


def parse_micro_batch(text: str) -> int | str:
    """`auto` or a positive number of blocks."""
    if text == AUTO:
        return AUTO
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"--micro-batch {text!r}: expected a positive number of blocks or 'auto'"
        )
    return value


def check_split(batch_size: int, world_size: int, micro_batch: int | str) -> None:
    """--batch-size is the global batch (blocks per optimizer step over all processes): each of the
    `world_size` processes takes an equal share, a whole number of micro-batches (`auto` sizes them later
    from the divisors of that share, so it needs only the share). Refused with the numbers and the
    nearest batch that splits, before any model is loaded."""
    micro = 1 if micro_batch == AUTO else int(micro_batch)
    unit = world_size * micro
    if batch_size > 0 and batch_size % unit == 0:
        return
    raise ValueError(
        f"--batch-size {batch_size} (the global batch) does not split over {world_size} process(es) x "
        f"--micro-batch {micro_batch}: expected a multiple of {unit}, e.g. --batch-size "
        f"{nearest_multiple(batch_size, unit)}"
    )


def nearest_multiple(value: int, unit: int) -> int:
    """The positive multiple of `unit` nearest to `value` (the larger one on a tie)."""
    below = value // unit * unit
    return below if below > 0 and value - below < below + unit - value else below + unit


def divisors_descending(n: int) -> list[int]:
    return [k for k in range(n, 0, -1) if n % k == 0]


def largest_fitting(per_rank: int, fits: Callable[[int], bool]) -> int:
    """The largest divisor of `per_rank` for which `fits` holds (1 is tried last and always kept:
    if even one block does not fit, the run's own first step says so)."""
    for size in divisors_descending(per_rank):
        if size == 1 or fits(size):
            return size
    return 1


def cpu_micro_batch(per_rank: int) -> int:
    return max(k for k in divisors_descending(per_rank) if k <= CPU_MICRO_BATCH)


def probe_fits(step: Callable[[int], None], device: torch.device) -> Callable[[int], bool]:
    """`fits(size)`: run `step(size)` (one forward + backward of `size` blocks) and report whether it
    stayed within MEMORY_SHARE of the device's memory without running out."""

    def fits(size: int) -> bool:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        try:
            step(size)
        except torch.cuda.OutOfMemoryError:
            return False
        finally:
            torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
        return torch.cuda.max_memory_allocated(device) <= MEMORY_SHARE * total

    return fits


def resolve_micro_batch(
    requested: int | str, per_rank: int, device: torch.device, probe_step: Callable[[int], None]
) -> int:
    """The run's micro-batch: the number given, or `auto` (see the module docstring). `probe_step(size)`
    must leave no gradients behind; it is only called on CUDA."""
    if requested != AUTO:
        return int(requested)
    if device.type != "cuda":
        return cpu_micro_batch(per_rank)
    return largest_fitting(per_rank, probe_fits(probe_step, device))
