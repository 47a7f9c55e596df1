"""The distillation loop: a `Trainer` set up once per run segment, whose `run` reads top to bottom: for each
step, the step itself, then the held-out evaluation and the checkpoint when they are due.

The pieces it calls live beside it: `trainer.prepare` (the distiller, optimizer and step settings),
`trainer.train_step` and `trainer.evaluate`, `checkpoint` (what a run saves and resumes from); `start/` decides
how a run begins. What a segment measures (memory, profiled steps, FLOPs) is a watch the run hands in
(`measure.watch.SegmentWatch`): the loop calls it and imports nothing of the measuring wing.
"""

from __future__ import annotations

import json
import time

import torch
from torch import nn
from tqdm import tqdm

from ...hostmemory import peak_mib as host_peak_mib
from ..parallel.world import World, all_reduce, log
from ..settings import DistillSettings
from ..start.decide import Start, check_model_start, decide_start
from ..start.snapshot import SnapshotClock
from .checkpoint import RunState, load_checkpoint, load_trained_from, save_checkpoint
from .loss import BatchSizes
from .trainer import evaluate, lr_at, prepare, rank_blocks, run_blocks, train_step


class Trainer:
    """One run segment of `settings` over `model`: its blocks, distiller, optimizer and run state. `watch`
    measures the segment (`measure.watch.SegmentWatch`: model_ready, state_ready, steps_begin, step,
    steps_end)."""

    def __init__(
        self,
        settings: DistillSettings,
        model: nn.Module,
        tokenizer,
        world: World,
        replies,
        start: Start | None,
        watch,
    ):
        settings.check_batch_split(world.size)
        config = model.config.to_dict()
        if start is None:
            start = decide_start(settings, config, writes_output=False)
        else:
            check_model_start(start, settings, config)
        self.settings, self.model, self.world, self.start, self.watch = settings, model, world, start, watch
        self.train, self.heldout = run_blocks(settings, tokenizer, replies, world, start.continued_steps)
        self.total_steps = len(self.train) // settings.optim.batch_size
        self.distiller, self.optimizer, self.step_settings, self.compiled = prepare(
            settings, model, self.train, world
        )
        if world.fsdp:  # what each process held to start: its shards (start/sharded.py), not the model
            print(
                f"process {world.rank}: peak host memory {host_peak_mib():,.0f} MiB after the start",
                flush=True,
            )
        watch.model_ready()
        self.identity = settings.identity()  # what a checkpoint of this run is checked against on resume
        self.state = self.starting_state()
        self.last = (
            self.total_steps
            if settings.checkpoint.stop_after is None
            else min(self.total_steps, settings.checkpoint.stop_after)
        )

    def starting_state(self) -> RunState:
        """The run state to go on from: a resumed run's checkpoint, else a fresh one (with an earlier run's
        trained tensors where the run continues or starts from one)."""
        start, world = self.start, self.world
        state = (
            load_checkpoint(start.load, self.distiller, self.optimizer, world)
            if start.resumes
            else RunState()
        )
        # A resumed run's tensors are its own checkpoint's; only a first start takes an earlier run's.
        if start.kind in ("continue", "init"):
            load_trained_from(start.load, self.distiller, world)
        if start.kind != "fresh":
            log(world, start.why)
        state.continued_steps = start.continued_steps
        state.total_steps = self.total_steps
        self.watch.state_ready(state, self.model, self.train, self.step_settings.micro_batch)
        state.micro_batch = self.step_settings.micro_batch
        return state

    def run(self) -> tuple[RunState, nn.Module]:
        """The steps from the state's to the last; returns the state and the distiller they ran through."""
        settings, state = self.settings, self.state
        if not state.history:
            self.evaluate(log_as="held-out before")
        first = state.step
        progress = self.progress_bar()
        say = (
            progress.write if self.world.is_main else (lambda text: None)
        )  # tqdm.write prints on every process
        self.watch.steps_begin(first, self.last, say)
        clock = SnapshotClock(settings.checkpoint.snapshot_every)
        for step in progress:
            with self.watch.step(step):
                loss, seconds = self.train_one(step)
            lr = self.optimizer.param_groups[0]["lr"]
            block_tokens = settings.optim.batch_size * settings.data.seq_len
            progress.set_postfix(loss=f"{loss:.4f}", tok_s=f"{block_tokens / seconds:.0f}", lr=f"{lr:.2e}")
            if state.step % settings.output.eval_every == 0 or state.step == self.total_steps:
                self.evaluate(log_as=f"held-out at step {state.step}", say=say)
            self.checkpoint_if_due(clock)
        self.watch.steps_end(state)
        progress.close()
        return state, self.distiller

    def train_one(self, step: int) -> tuple[float, float]:
        """One optimizer step on this process's share of the step's blocks: (loss over all processes, s)."""
        settings, state = self.settings, self.state
        started = time.perf_counter()
        blocks = rank_blocks(self.train, step, settings.optim.batch_size, self.world)
        sizes = BatchSizes.of(
            self.train.select(slice(step * settings.optim.batch_size, (step + 1) * settings.optim.batch_size))
        )
        for group in self.optimizer.param_groups:
            group["lr"] = lr_at(step, self.total_steps, group["peak_lr"], settings.optim.warmup)
        loss = self.compiled.run(
            train_step,
            self.distiller,
            self.model,
            self.optimizer,
            blocks,
            sizes,
            self.step_settings,
            self.world,
        )
        loss = float(all_reduce(torch.tensor([loss], dtype=torch.float64), self.world))
        seconds = time.perf_counter() - started
        state.step = step + 1
        state.elapsed += seconds
        state.history.append({"step": state.step, "loss": loss, "lr": self.optimizer.param_groups[0]["lr"]})
        return loss, seconds

    def evaluate(self, log_as: str, say=None) -> None:
        """The held-out measures at the state's step, appended to its history and logged by the main process."""
        measured = self.compiled.run(
            evaluate, self.model, self.heldout, self.step_settings, self.world, self.distiller
        )
        self.state.history.append({"step": self.state.step, **measured})
        line = f"{log_as}: {json.dumps(self.state.history[-1])}"
        if say is None:
            log(self.world, line)
        elif self.world.is_main:
            say(line)

    def checkpoint_if_due(self, clock: SnapshotClock) -> None:
        """Save a checkpoint every --checkpoint-every steps, at the segment's last step, or when the snapshot
        clock (--snapshot-every) says so on the main process."""
        settings, state, world = self.settings, self.state, self.world
        path = self.start.checkpoint
        due = state.step % settings.checkpoint.checkpoint_every == 0 or state.step == self.last
        if path is not None and (clock.due(lambda late: agreed(late, world)) or due):
            save_checkpoint(path, self.distiller, self.optimizer, state, self.identity, world)
            clock.saved()

    def progress_bar(self) -> tqdm:
        return tqdm(
            range(self.state.step, self.last),
            initial=self.state.step,
            total=self.total_steps,
            disable=not self.world.is_main,
            desc="distill",
            unit="step",
            dynamic_ncols=True,
        )


def agreed(flag: bool, world: World) -> bool:
    """The main process's `flag`, on every process (a decision that leads to collective calls)."""
    return bool(all_reduce(torch.tensor([float(flag and world.is_main)]), world)[0])
