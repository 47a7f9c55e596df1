"""One distillation run end to end, as a library call: check the inputs, load, train (or resume),
write the distilled folder. `swiftkv distill` is a thin command line over `run_distillation`."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from torch import nn
from transformers import AutoConfig

from ..data.packing import load_blocks
from ..hostmemory import peak_mib, reset_peak
from ..model.modeling import swiftkv_parameters
from ..model.surgery import generation_config, write_model_folder
from ..results import DistillSummary
from ..sources import source_name
from ..tensorfiles import FolderTensors, copy_weights
from .core.checkpoint import RunState, inner_model, trained_parameters
from .core.loop import Trainer
from .core.microbatch import AUTO, CPU_MICRO_BATCH
from .core.trainable import mark_distilled, merged_student_weights
from .core.trainer import evaluate, finished
from .measure.summary import run_summary, speed_line
from .measure.watch import SegmentWatch
from .parallel.sharding import whole_tensor
from .parallel.world import World, barrier, close_world, init_world, launched_world_size, log
from .settings import DistillSettings
from .start.decide import Start, decide_start
from .start.setup import load_student
from .start.targets import check_replies_written, written_replies


@dataclass
class DistillResult:
    state: RunState
    summary: dict  # the JSON of results.DistillSummary: settings, tokens, seconds, tokens/s, held-out before/after, loss history
    wrote: bool  # the output folder was written (the run reached its last step)


def run_distillation(settings: DistillSettings) -> DistillResult:
    """Train `settings.model.source` per `settings` (a slice of it with `stop_after`); on the last step
    write `settings.output.out` atomically. Bad input fails here, before any training (`start.decide_start`)."""
    settings.check_batch_split(launched_world_size())  # before the source opens: a number alone answers it
    settings = settings.opened()  # a missing source is reported here, as such, before any work
    start = decide_start(settings)
    if launched_world_size() > 1:
        check_replies_written(settings)
    world = init_world(settings.parallel.fsdp)
    try:
        return train_and_write(settings, world, start)
    finally:
        close_world(world)


def train_and_write(settings: DistillSettings, world: World, start: Start) -> DistillResult:
    model, tokenizer = load_student(settings, world)  # under --fsdp: on the meta device, filled once sharded
    started = time.time()
    state, distiller = run_training(
        settings, model, tokenizer, world, written_replies(settings, tokenizer, world), start
    )
    summary = run_summary(settings, state, world)
    done = finished(state)
    if done and (world.is_main or world.fsdp):  # under --fsdp every process gathers, one writes
        write_output(settings, distiller, tokenizer, summary, world)
    wrote = world.is_main and done
    if wrote:
        facts = DistillSummary.from_json(summary)
        log(
            world,
            f"wrote {settings.output.out} ({facts.train_tokens} tokens, {facts.train_seconds} s train, "
            f"{time.time() - started:.0f} s this segment; {speed_line(summary)})",
        )
    elif world.is_main:
        log(world, f"stopped after step {state.step}; continue with --resume")
    barrier(world)  # the others wait for the folder, so the run ends when it is written
    return DistillResult(state, summary, wrote)


def run_training(
    settings: DistillSettings,
    model: nn.Module,
    tokenizer,
    world: World,
    replies=None,
    start: Start | None = None,
) -> tuple[RunState, nn.Module]:
    """`distill`, also returning the distiller the steps ran through: under --fsdp the model is sharded
    in place, and the output is written through it (`run.write_output`). `start`: as `run_distillation`
    decided it (else decided here)."""
    return Trainer(settings, model, tokenizer, world, replies, start, SegmentWatch(settings, world)).run()


def distill(
    settings: DistillSettings, model: nn.Module, tokenizer, world: World | None = None, replies=None
) -> RunState:
    """Train `model` in place (a SwiftKV model whose teacher weights are the source). Returns the run
    state; checkpoints go to `settings.checkpoint_path()` when it is set. `replies`: the written replies
    of `--targets teacher|mixed`. How it starts is decided from the settings (`start.decide_start`,
    without the checks of a run's output folder)."""
    return run_training(settings, model, tokenizer, world or World(), replies)[0]


def write_output(settings: DistillSettings, distiller, tokenizer, summary: dict, world: World) -> None:
    """The distilled student as a plain HF SwiftKV folder (swiftkv=True), with the run summary: the
    source folder's files, copied tensor by tensor in their stored dtype (bf16 stays bf16), with the
    trained tensors written in. Student-only later-layer weights (`--trainable lora|late|late-norms`)
    are merged under their original names, and the config says so: the folder then no longer contains
    its teacher. No process holds the source model: under --fsdp each trained tensor is gathered whole
    only when its turn to be written comes, on every process (a collective), and process 0 writes it.
    Each process reports the peak host memory the write added above what it held."""
    held = reset_peak()
    source = FolderTensors(settings.model.source.folder)
    model = inner_model(distiller)
    trained = {name: partial(whole_tensor, p) for name, p in trained_parameters(model).items()}
    merged = merged_student_weights(trained, source)
    own = swiftkv_parameters(model)
    replaced = {name: gather for name, gather in trained.items() if name in own} | merged
    if not world.is_main:
        copy_weights(source, None, replaced=replaced, write=False)
    else:
        config = AutoConfig.from_pretrained(settings.model.source.folder)
        mark_distilled(config, settings.model.trainable, bool(merged))

        def fill(tmp: Path) -> None:
            copy_weights(source, tmp, replaced=replaced)
            config.save_pretrained(tmp)
            generation_config(settings.model.source.folder, config).save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "distill.json").write_text(json.dumps(summary, indent=2) + "\n")

        write_model_folder(settings.output.out, fill, force=True)
    peak = peak_mib()
    if held is not None and peak is not None:
        print(
            f"process {world.rank}: writing the output raised its peak host memory {peak - held:,.0f} MiB "
            f"above the {held:,.0f} MiB it held",
            flush=True,
        )


def heldout_agreement(settings: DistillSettings) -> dict:
    """Held-out KL / top-1 of the model as it is (the split depends on --data, --seed, --heldout-tokens)."""
    settings = settings.opened()
    model, tokenizer = load_student(settings.but(init="keep"))  # measure the weights as they are
    _, heldout = load_blocks(
        settings.data.spec,
        tokenizer,
        settings.data.seq_len,
        settings.data.seq_len,
        settings.data.heldout_tokens,
        settings.optim.seed,
        split=settings.data.data_split,
    )
    # Evaluation has no backward to size a micro-batch against: `auto` takes the CPU size on any device.
    micro = settings.parallel.micro_batch if settings.parallel.micro_batch != AUTO else CPU_MICRO_BATCH
    return {
        "model": source_name(settings.model.source),
        "data": settings.data.spec,
        "heldout_tokens": settings.data.heldout_tokens,
        **evaluate(model, heldout, replace(settings.step_settings(), micro_batch=micro), World()),
    }
