"""Loading and checking what a distillation run needs, so bad input fails before any work is done."""

from __future__ import annotations

import os

import torch

from ..model.config import is_swiftkv
from ..model.surgery import copy_init_params, load_trained, teacher_difference, tokenizer_differences
from ..sources import Source
from .settings import REDERIVED_INITS
from .trainable import check_trainable


def set_threads() -> None:
    """Split the machine's cores between the processes torchrun started on it (unless OMP says)."""
    if "OMP_NUM_THREADS" not in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def load_student(settings):
    """(model, tokenizer) of a SwiftKV folder whose teacher weights are intact, checked for the run.
    `settings` are opened (`DistillSettings.opened`): their sources are resolved already."""
    settings.check_written_replies()
    model = settings.source.load_model(torch.float32)
    check_student(model, settings.source, settings.seq_len)
    check_trainable(settings.trainable, settings.lora_rank, model.config)
    apply_init(model, settings.init, settings.source)
    tokenizer = settings.source.load_tokenizer()
    if settings.teacher:
        check_teacher(model, tokenizer, settings.teacher)
    return model, tokenizer


def apply_init(model, init: str, source: str) -> None:
    """The recipe's starting point: copy/mean are re-derived from the model's own teacher weights;
    lstsq needs calibration data, so it must come from `swiftkv convert --init lstsq`."""
    if init in REDERIVED_INITS:
        load_trained(model, copy_init_params(model, average_group=init == "mean"))
    elif init == "lstsq":
        converted = (getattr(model.config, "swiftkv_conversion", None) or {}).get("init")
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


def check_teacher(student, student_tokenizer, teacher_source: Source) -> None:
    """Shared-prefix distillation is only valid when the student was converted from this teacher:
    same tokenizer, same shapes and the same weights in every teacher tensor (`teacher_difference`)."""
    differences = tokenizer_differences(student_tokenizer, teacher_source.load_tokenizer())
    if differences:
        raise ValueError(
            f"--teacher {teacher_source}: its tokenizer differs from the student's ({'; '.join(differences)}); "
            "expected the model the student was converted from"
        )
    difference = teacher_difference(student, teacher_source.load_model(torch.float32))
    if difference:
        raise ValueError(
            f"--teacher {teacher_source}: {difference}; the shared-prefix distillation needs the student "
            "converted from exactly this teacher"
        )
