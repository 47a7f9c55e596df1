"""Loading and checking what a distillation run needs, so bad input fails before any work is done."""

from __future__ import annotations

import os

import torch

from ...model.config import is_swiftkv
from ...model.surgery import copy_init_params, load_trained, tokenizer_differences
from ...sources import Source, check_weights_present
from ...tensorfiles import FolderTensors
from ..core.trainable import check_trainable
from ..parallel.sharding import owned_rows
from ..parallel.world import World, all_reduce
from ..settings import REDERIVED_INITS
from .sharded import meta_student


def set_threads() -> None:
    """Split the machine's cores between the processes torchrun started on it (unless OMP says)."""
    if "OMP_NUM_THREADS" not in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def load_student(settings, world: World | None = None):
    """(model, tokenizer) of a SwiftKV folder whose teacher weights are intact, checked for the run.
    `settings` are opened (`DistillSettings.opened`): their sources are resolved already. Under --fsdp
    (`world.fsdp`) the model is built on the meta device, and each process fills its own shards once it
    is sharded, the init included (distill/start/sharded.py); otherwise it is loaded whole, in fp32."""
    world = world or World()
    settings.check_written_replies()
    if settings.model.teacher:  # a teacher that is only a config is refused before the student loads
        check_weights_present(settings.model.teacher.folder)
    model = (
        meta_student(settings.model.source) if world.fsdp else settings.model.source.load_model(torch.float32)
    )
    check_student(model, settings.model.source, settings.data.seq_len)
    check_trainable(settings.model.trainable, settings.model.lora_rank, model.config)
    check_init(model.config, settings.model.init, settings.model.source)
    if not world.fsdp:
        apply_init(model, settings.model.init)
    tokenizer = settings.model.source.load_tokenizer()
    if settings.model.teacher:
        check_teacher(settings.model.source, tokenizer, settings.model.teacher, world)
    return model, tokenizer


def apply_init(model, init: str) -> None:
    """The recipe's starting point: copy/mean are re-derived from the model's own teacher weights
    (`surgery.copy_init_tensors`); keep and lstsq are the folder's own SwiftKV tensors."""
    if init in REDERIVED_INITS:
        load_trained(model, copy_init_params(model, average_group=init == "mean"))


def check_init(config, init: str, source: str) -> None:
    """lstsq needs calibration data, so it must come from `swiftkv convert --init lstsq`."""
    if init == "lstsq":
        converted = (getattr(config, "swiftkv_conversion", None) or {}).get("init")
        if converted != "lstsq":
            raise ValueError(
                f"--init lstsq: {source} was converted with --init {converted}; convert the "
                "source with `swiftkv convert ... --init lstsq` (it fits on calibration data) or pass "
                "--init keep / copy / mean"
            )


def check_student(model, source: str, seq_len: int) -> None:
    config = model.config
    if not is_swiftkv(config):
        raise ValueError(
            f"{source} is not a SwiftKV model (no num_key_value_layers); run "
            "`swiftkv convert SRC DST --num-key-value-layers N` first and distill DST"
        )
    if config.teacher_missing:
        raise ValueError(
            f"{source} cannot be distilled: {config.teacher_missing}, and distillation needs "
            "its teacher path; distill an untrimmed conversion of the source model (to train on from "
            "a distilled student, pass its weights folder or alias with --init-from)"
        )
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and seq_len > limit:
        raise ValueError(f"--seq-len {seq_len} exceeds the model's max_position_embeddings {limit}")
    if seq_len < 2:
        raise ValueError(f"--seq-len {seq_len}: expected at least 2 tokens per block")


def check_teacher(source: Source, student_tokenizer, teacher_source: Source, world: World) -> None:
    """Shared-prefix distillation is only valid when the student was converted from this teacher:
    same tokenizer, and every teacher tensor in the student's folder with the same shape and values
    (`stored_teacher_difference`)."""
    differences = tokenizer_differences(student_tokenizer, teacher_source.load_tokenizer())
    if differences:
        raise ValueError(
            f"--teacher {teacher_source}: its tokenizer differs from the student's ({'; '.join(differences)}); "
            "expected the model the student was converted from"
        )
    difference = stored_teacher_difference(
        FolderTensors(source.folder), FolderTensors(teacher_source.folder), world
    )
    if difference:
        raise ValueError(
            f"--teacher {teacher_source}: {difference}; the shared-prefix distillation needs the student "
            "converted from exactly this teacher"
        )


def stored_teacher_difference(student: FolderTensors, teacher: FolderTensors, world: World) -> str | None:
    """Why `teacher` is not the model `student` was converted from (None when it is), compared as stored
    (both in the source's layout): each of the teacher's tensors but its SwiftKV ones is in the student,
    with the same shape and the same values in fp32 (what loading both in fp32 would compare). Each
    process compares its rows of each tensor (`owned_rows`), so the two folders are read once over the
    processes, a few rows at a time, and the first tensor any of them finds differing is named."""
    names = [name for name in teacher if "swiftkv" not in name]
    for name in names:
        if name not in student.entries:
            return f"{name} is missing from the student"
        ours, theirs = student.entries[name].shape, teacher.entries[name].shape
        if ours != theirs:
            return f"{name} has shape {theirs}, the student's has {ours}"
    first = next(
        (i for i, name in enumerate(names) if not same_rows(student, teacher, name, world)), len(names)
    )
    first = int(all_reduce(torch.tensor([first]), world, torch.distributed.ReduceOp.MIN)[0])
    return f"{names[first]} differs from the student's copy" if first < len(names) else None


def same_rows(student: FolderTensors, teacher: FolderTensors, name: str, world: World) -> bool:
    shape = teacher.entries[name].shape
    if not shape:  # a scalar has no rows to split: every process compares it
        return torch.equal(student[name].float(), teacher[name].float())
    start, stop = owned_rows(shape[0], world)
    return torch.equal(student.rows(name, start, stop).float(), teacher.rows(name, start, stop).float())
