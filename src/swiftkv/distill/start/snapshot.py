"""A student snapshot: a trained student's tensors in bf16, optionally cut into files of a bounded size
(`0.safetensors`, `1.safetensors`, ...), with its run's progress (step, held-out KL, tok/s, the student's
geometry and trainable set, the settings a resume must match) as JSON in the first file's metadata, so
tensors and progress are always from the same step. A snapshot folder is replaced whole (written beside,
then renamed), so a run cut at any moment leaves the last complete one.

`swiftkv distill --init-from` reads such a folder as a student's weights (`from_weights.py`), and
`install` turns one into a distilled HF folder. Training scripts that run outside `swiftkv distill` (e.g. on
a rented GPU, the scripts in scripts/gpu/) write them with `write_snapshot`."""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...files import atomic_output_dir
from ...model.surgery import build_swiftkv_model, write_swiftkv_folder
from ...sources import open_source
from ..core.trainable import install as install_trainable
from ..core.trainable import load_trained_set, merge_trained

PROGRESS_KEY = "progress"
FIRST_FILE = "0.safetensors"  # the file whose metadata holds the progress
# What the first file's progress must name for a snapshot to be read as a student (`student_model`).
STUDENT_KEYS = ("num_key_value_layers", "key_value_group_size", "trainable", "lora_rank")


def write_snapshot(
    folder: Path, tensors: dict[str, torch.Tensor], progress: dict, file_limit: int | None = None
) -> None:
    """`tensors` (by parameter name) in bf16 files of at most `file_limit` bytes of tensors each (None: one
    file), `progress` in the first one's metadata; the folder replaced atomically."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu", torch.bfloat16).contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if file_limit is not None and size + nbytes > file_limit and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    with atomic_output_dir(folder, force=True) as tmp:
        for index, shard in enumerate(shards):
            metadata = {"format": "pt", "shard": f"{index + 1}/{len(shards)}"}
            if index == 0:
                metadata[PROGRESS_KEY] = json.dumps(progress)
            save_file(shard, str(tmp / f"{index}.safetensors"), metadata=metadata)


def read_progress(folder: str | os.PathLike) -> dict:
    """A snapshot's progress alone (its first file's metadata: no tensor is read)."""
    first = Path(folder) / FIRST_FILE
    if not first.is_file():
        raise FileNotFoundError(f"{first} is missing: {folder} is not a student snapshot ({EXPECTED})")
    with safe_open(first, "pt") as shard:
        text = (shard.metadata() or {}).get(PROGRESS_KEY)
    progress = json.loads(text) if text else {}
    missing = [key for key in STUDENT_KEYS if key not in progress]
    if missing:
        raise ValueError(
            f"{first} is of another layout: its metadata's {PROGRESS_KEY!r} lacks {', '.join(missing)}; "
            f"expected a student snapshot ({EXPECTED})"
        )
    return progress


EXPECTED = (
    f"{FIRST_FILE} whose metadata {PROGRESS_KEY!r} names {', '.join(STUDENT_KEYS)}, then 1.safetensors ... "
    "as its 'shard' count says"
)


def read_snapshot(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, progress) of a snapshot folder, checked whole."""
    folder = Path(folder)
    progress = read_progress(folder)
    tensors, count, index = {}, None, 0
    while (folder / f"{index}.safetensors").is_file():
        with safe_open(folder / f"{index}.safetensors", "pt") as shard:
            count = int((shard.metadata() or {}).get("shard", "1/1").split("/")[1])
            tensors.update({name: shard.get_tensor(name) for name in shard.keys()})  # noqa: SIM118
        index += 1
    if index != count:
        raise ValueError(f"{folder} holds {index} of its {count} files; the snapshot is incomplete")
    return tensors, progress


def student_model(teacher_model, progress: dict):
    """A fresh student of the snapshot's geometry and trainable set over `teacher_model`'s weights;
    returns (model, its trained parameters by name)."""
    model = build_swiftkv_model(
        teacher_model, progress["num_key_value_layers"], progress["key_value_group_size"]
    )
    return model, install_trainable(model, progress["trainable"], progress["lora_rank"], progress["seed"])


def install(
    snapshot: str | os.PathLike, out: str | os.PathLike, teacher: str | None = None, force: bool = False
) -> Path:
    """The distilled HF SwiftKV folder of a snapshot: the teacher's weights, the trained SwiftKV
    parameters, the student-only adapters merged (as `swiftkv distill` writes its output)."""
    tensors, progress = read_snapshot(snapshot)
    source = open_source(snapshot_teacher(progress, teacher))
    teacher_model = source.load_model(torch.float32)
    load_trained_set(*student_model(copy.deepcopy(teacher_model), progress), tensors, snapshot)
    model = build_swiftkv_model(
        teacher_model, progress["num_key_value_layers"], progress["key_value_group_size"]
    )
    merge_trained(model, {k: v.float() for k, v in tensors.items()}, progress["trainable"])
    info = {
        "source": source.name,
        "init": "distilled",
        "trimmed": False,
        "progress": progress_summary(progress),
    }
    write_swiftkv_folder(model, source.load_tokenizer(), out, info, force=force)
    return Path(out)


def snapshot_teacher(progress: dict, teacher: str | None) -> str:
    """The teacher a snapshot is installed over: the one given, else the path it trained with where that
    exists here, else the name it was staged by (a snapshot trained on another machine names that
    machine's path)."""
    if teacher:
        return teacher
    if Path(progress["teacher"]).exists():
        return progress["teacher"]
    if progress.get("teacher_name"):
        return progress["teacher_name"]
    raise ValueError(
        f"the snapshot's teacher {progress['teacher']} is not on this machine; pass --teacher with the same "
        f"teacher here (the one staged as the tar of sha256 {progress['teacher_digest']})"
    )


def progress_summary(progress: dict) -> dict:
    keep = ("step", "total_steps", "train_tokens", "heldout", "tokens_per_second", "device")
    return {key: progress.get(key) for key in keep}


# --------------------------------------------------------------------------------------------------
# Wall-clock snapshots of a run (`swiftkv distill --snapshot-every SECONDS`)
# --------------------------------------------------------------------------------------------------
# A run on a machine that can be taken away at any moment (a preemptible or rented GPU) saves its
# checkpoint on a wall-clock interval as well as every --checkpoint-every steps: the same file, written the
# same way (`checkpoint.save_checkpoint`: a temp file renamed into place, so a torn write never replaces a
# good one), so the newest of the two is by construction the one that is there. The same command run
# again resumes from it.


class SnapshotClock:
    """Whether a run's checkpoint is due on the wall clock: `every` seconds since it was last written (None:
    never). Under several processes the main process's clock decides for all (`agree`), so every process
    makes the same collective calls of a sharded save."""

    def __init__(self, every: float | None):
        self.every = every
        self.saved_at = time.monotonic()

    def due(self, agree: Callable[[bool], bool] = bool) -> bool:
        if self.every is None:
            return False
        return agree(time.monotonic() - self.saved_at >= self.every)

    def saved(self) -> None:
        self.saved_at = time.monotonic()


def saved_checkpoint(folder: Path, checkpoint_file: str) -> Path | None:
    """The checkpoint a rerun of a snapshotting run resumes from: `folder/checkpoint_file` when it is there,
    None when the folder is absent or empty (nothing was saved yet). A folder that holds other files only is
    of another layout: one error naming what it holds and what was expected."""
    path = folder / checkpoint_file
    if path.is_file():
        return path
    held = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []
    if held:
        raise ValueError(
            f"{folder} holds {', '.join(held[:4])}{' ...' if len(held) > 4 else ''} but no {checkpoint_file}: "
            f"it is not a distill run's checkpoint folder of this layout (expected {checkpoint_file}, and "
            "shards-stepNNNNNNNN/ beside it under --fsdp); move it aside or pass --force to start over"
        )
    return None
