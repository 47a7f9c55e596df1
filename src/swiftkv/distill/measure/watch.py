"""What a run segment measures while it trains, handed to the loop by the run: the device memory its steps add
above the model and optimizer, the tensors its first steps hold, the steps `--profile-steps` profiles, and the
FLOPs per token of its step as executed (the summary's compute bound). The loop calls it around each step and
imports none of it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from ..core.checkpoint import RunState
from ..parallel.world import World
from ..settings import DistillSettings
from . import memory
from .bound import step_flops_per_token
from .profile import StepProfiler

# The first steps of a run segment count their tensors (`memory.TensorBytes`): the first creates the
# optimizer state, the second runs with it; a dispatch mode on every step would slow the run.
TENSOR_COUNTED_STEPS = 2


class SegmentWatch:
    """The measures of one run segment of `settings` on `world`'s device, written into its run state."""

    def __init__(self, settings: DistillSettings, world: World):
        self.settings, self.device = settings, world.device
        self.tensors = memory.TensorBytes()

    def model_ready(self) -> None:
        """Before any step: what the steps add is measured above the memory held now."""
        self.model_mib = memory.current_mib(self.device)
        memory.reset_peak(self.device)

    def state_ready(self, state: RunState, model, train, micro_batch: int) -> None:
        """The segment's FLOPs per train token, counted on its own blocks at its micro-batch."""
        state.flops_per_token = step_flops_per_token(model.config, self.settings, train, micro_batch)

    def steps_begin(self, first: int, last: int, say: Callable[[str], None]) -> None:
        self.first, self.last = first, last
        # The segment's first step allocates (and compiles): profiled steps start after it where there are more.
        self.profiler = StepProfiler(
            self.settings.output.profile_steps, first + (last - first > 1), self.device, say
        )

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        self.profiler.before(step)
        with self.tensors if step - self.first < TENSOR_COUNTED_STEPS else contextlib.nullcontext():
            yield
        self.profiler.after(step)

    def steps_end(self, state: RunState) -> None:
        self.profiler.close()
        state.step_memory_mib = round(memory.peak_mib(self.device) - self.model_mib, 1)
        state.step_tensor_mib = self.tensors.peak_mib if self.last > self.first else None
