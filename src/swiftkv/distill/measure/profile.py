"""`swiftkv distill --profile-steps N`: N steps under torch's profiler, and where a step's time goes.

A small student's GPU step can run at a few percent of the matmul peak while the same trainer at an 8B
shape runs near it, so its step is bound by something other than its matmuls; the report names it: wall
milliseconds per step against the milliseconds the device (the CPU when there is no GPU) was busy in
ops, and the ops with the most self time. The profiled steps are ordinary steps (the same losses and
tensors as unprofiled ones); they start after the segment's first step, which allocates and compiles.
A profiler that fails is said and the run trains on unprofiled.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

TABLE_ROWS = 12


def profile_steps(step: Callable[[int], None], steps: range, device: torch.device) -> str:
    """Run `step` for each of `steps` under the profiler; its report (`StepProfiler.report`)."""
    profiler = StepProfiler(len(steps), steps.start, device, say=None)
    for index in steps:
        profiler.before(index)
        step(index)
        profiler.after(index)
    if profiler.error is not None:
        raise profiler.error
    return profiler.text


class StepProfiler:
    """Profiles `count` steps from step `start`: the loop calls `before(step)` / `after(step)` around
    each step and `close()` when it ends (a run shorter than the profiled steps reports those it ran).
    `count` 0 or None profiles nothing."""

    def __init__(
        self, count: int | None, start: int, device: torch.device, say: Callable[[str], None] | None
    ):
        self.count, self.start, self.device, self.say = count or 0, start, device, say
        self.profiler, self.began, self.done = None, 0.0, 0
        self.text, self.error = "", None

    def before(self, step: int) -> None:
        if self.count and step == self.start:
            self.guarded(self.open)

    def after(self, step: int) -> None:
        if self.profiler is None:
            return
        self.done += 1
        if self.done == self.count:
            self.close()

    def close(self) -> None:
        if self.profiler is not None:
            self.guarded(self.report)
            self.profiler = None

    def open(self) -> None:
        cuda = self.device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        self.profiler = profile(activities=activities)
        self.profiler.start()
        self.began = time.perf_counter()

    def report(self) -> None:
        """Wall and busy milliseconds per step, then the ops with the most self time on the device."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall_ms = (time.perf_counter() - self.began) * 1e3 / self.done
        self.profiler.stop()
        events = self.profiler.key_averages()
        kind = "device" if self.device.type == "cuda" else "cpu"
        busy_ms = sum(self_time(event, kind) for event in events) / 1e3 / self.done
        table = events.table(sort_by=f"self_{kind}_time_total", row_limit=TABLE_ROWS)
        self.text = (
            f"profile of {self.done} steps: {wall_ms:.1f} ms wall per step, {busy_ms:.1f} ms of {kind} self "
            f"time per step ({busy_ms / wall_ms:.0%} busy)\n{table}"
        )
        if self.say is not None:
            self.say(self.text)

    def guarded(self, action: Callable[[], None]) -> None:
        """The profiler is a diagnosis: its failure is said (or kept for `profile_steps`), never fatal."""
        try:
            action()
        except Exception as error:  # noqa: BLE001
            self.profiler, self.count, self.error = None, 0, error
            if self.say is not None:
                self.say(f"profile failed ({type(error).__name__}: {error}); training on unprofiled")


def self_time(event, kind: str) -> float:
    """An op's self time in microseconds on `kind` (torch names the CUDA one device_ or cuda_ by version)."""
    if kind == "cpu":
        return event.self_cpu_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
