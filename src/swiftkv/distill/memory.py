"""Memory a run's steps add above the model they train, measured to check `swiftkv distill --plan`.

On a CPU the resident set is all there is: the peak (VmHWM) is reset when the steps start (Linux's
/proc/self/clear_refs), so what loading the model and reading the data peaked at does not hide it. On
CUDA, torch's allocator counts the same thing exactly."""

from __future__ import annotations

from pathlib import Path

import torch


def current_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return status_kib("VmRSS") / 1024


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set size
    except OSError:
        pass  # not Linux, or not allowed: the peak then counts from the process's start


def peak_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return status_kib("VmHWM") / 1024


def status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(f"/proc/self/status has no {key}")
