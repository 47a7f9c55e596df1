"""Where a student's step spends its time, printed once per loan: a few steps under torch's profiler right
after the first speed line. The first loan's students ran at 3-4% of the matmul peak while the same trainer
at the 8B shape ran at 91%, so the small model's step is bound by something other than its matmuls; this
table names it (kernels, copies, host-side gaps) in the log that comes back, at the cost of a few steps.
Any failure of the profiler is printed and the run goes on unprofiled."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

PROFILED_STEPS = 3
TABLE_ROWS = 12


def profile_steps(step: Callable[[int], None], steps: range, device: torch.device) -> str:
    """Run `step` for each of `steps` under the profiler; a report: wall and device-busy milliseconds
    per step, then the ops with the most self time on the device (the CPU when there is no GPU)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    began = time.perf_counter()
    with profile(activities=activities) as profiler:
        for index in steps:
            step(index)
    wall_ms = (time.perf_counter() - began) * 1e3 / len(steps)
    events = profiler.key_averages()
    kind = "device" if cuda else "cpu"
    busy_ms = sum(self_time(event, kind) for event in events) / 1e3 / len(steps)
    table = events.table(sort_by=f"self_{kind}_time_total", row_limit=TABLE_ROWS)
    return (
        f"profile of {len(steps)} steps: {wall_ms:.1f} ms wall per step, {busy_ms:.1f} ms of {kind} self time "
        f"per step ({busy_ms / wall_ms:.0%} busy)\n{table}"
    )


def self_time(event, kind: str) -> float:
    """An op's self time in microseconds on `kind` (torch names the CUDA one device_ or cuda_ by version)."""
    if kind == "cpu":
        return event.self_cpu_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
