"""--compile: every decoder layer through `torch.compile`, with the plain path as the fallback.

A small model's step on a GPU is bound by kernel launches, not by its matmuls (the one H100 run so far
reached about 1% of the bf16 peak): compiling a decoder layer fuses its norms, rotary embedding and
activation into few kernels. Each layer is compiled, not the whole step: the student's later layers see
a different number of positions every step (the prefill skip keeps only the rows the loss reads), which
`dynamic=True` takes as one symbolic size instead of a recompile per shape, and a layer is the unit
FSDP2 shards too. Compiling can fail where it was never tried (a new GPU, a torch version): the first
failure turns it off for the rest of the run, says why, and reruns that step on the plain path, so a
run always trains.

Each layer sees several guard variants: the teacher's path and the student's (`on_student_path`, a
module global so that dynamo reads it as a constant), grad on or off (the teacher, the held-out scoring),
an input that requires grad or not, plain and adapted MLPs, with or without a document mask. Those are
more than dynamo's default of 8 compiled versions per function, past which it runs the rest eagerly
without failing, so the limit is raised, and the first compiled call logs how many graphs and graph
breaks it made: a run's log shows at once whether the layers compiled whole.

`compiled_artifacts` serializes what a process compiled (torch's portable cache of the Inductor and
AOTAutograd results) and `load_compiled_artifacts` loads it into another process's caches, so a fresh
machine (e.g. a freshly rented GPU) compiles the same layers from cache hits.
"""

from __future__ import annotations

import lzma
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn

T = TypeVar("T")
RECOMPILE_LIMIT = 64  # compiled versions per function: the variants above with room to spare


class CompiledLayers:
    """The model's decoder layers compiled (or not, with `enabled=False`); `run` calls a step through
    them and falls back to the plain layers when the compiled ones fail."""

    def __init__(
        self,
        model: nn.Module,
        enabled: bool,
        log: Callable[[str], None],
        backend: str | Callable = "inductor",
    ):
        self.model = model
        self.layers = list(model.model.layers) if enabled else []
        self.log = log
        self.reported = False
        if self.layers:
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        for layer in self.layers:
            layer.compile(dynamic=True, backend=backend)

    @property
    def active(self) -> bool:
        return bool(self.layers)

    def run(self, step: Callable[..., T], *args) -> T:
        """`step(*args)`; if the compiled layers fail, the plain ones from now on and `step(*args)` again
        (the failed attempt's gradients cleared)."""
        if not self.active:
            return step(*args)
        try:
            result = step(*args)
        except Exception as error:  # noqa: BLE001 - any compile failure: the plain layers still train
            self.turn_off(reason_of(error))
            self.model.zero_grad(set_to_none=True)
            return step(*args)
        if not self.reported:
            self.reported = True
            self.log(f"--compile: {compile_summary()}")
        return result

    def turn_off(self, reason: str) -> None:
        for layer in self.layers:
            layer._compiled_call_impl = None  # noqa: SLF001 - what nn.Module.compile() set
        self.layers = []
        torch._dynamo.reset()  # noqa: SLF001 - drop the failed graphs
        self.log(f"--compile: the compiled layers failed ({reason}); training on the plain path")


def compile_summary() -> str:
    """What dynamo made so far in this process: graphs, and graph breaks with their most common reason."""
    counters = torch._dynamo.utils.counters  # noqa: SLF001 - dynamo's own tally
    breaks = counters["graph_break"]
    line = f"{counters['stats']['unique_graphs']} graph(s), {sum(breaks.values())} graph break(s)"
    if breaks:
        reason, count = max(breaks.items(), key=lambda item: item[1])
        line += f" (most often, {count}x: {' '.join(str(reason).split())[:200]})"
    return line


def reason_of(error: BaseException, limit: int = 300) -> str:
    """The error on one line (dynamo's wrapper names the failing backend, then its error, on the next)."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:limit]


def compiled_artifacts(log: Callable[[str], None]) -> bytes | None:
    """Everything this process compiled so far (cache hits included), as torch's portable cache
    artifacts, xz-compressed; None where it compiled nothing, or where serializing failed (said: the
    artifacts only save a later run time, never cost this one its training)."""
    try:
        saved = torch.compiler.save_cache_artifacts()
    except Exception as error:  # noqa: BLE001 - see above
        log(f"--compile: the compiled artifacts were not kept ({reason_of(error)})")
        return None
    return lzma.compress(saved[0], preset=1) if saved and saved[0] else None


def load_compiled_artifacts(data: bytes, source: str, log: Callable[[str], None]) -> None:
    """Hot-load `compiled_artifacts` written by another process (from `source`, named in the log line);
    artifacts this torch cannot read only cost the time they would have saved."""
    try:
        torch.compiler.load_cache_artifacts(lzma.decompress(data))
    except Exception as error:  # noqa: BLE001 - any unreadable cache: the layers compile as without it
        log(f"--compile: {source} not loaded ({reason_of(error)}); compiling from nothing")
        return
    log(f"--compile: loaded {len(data) / 2**20:.1f} MiB of compiled artifacts from {source}")
