"""A student as a loan brings it back: its trained tensors in bf16, cut into files under the transfer's
per-file limit, with the run's progress (step, held-out KL, tok/s, the settings a resume must match) in
the first file's metadata, so tensors and progress are always from the same step. A snapshot folder
is replaced whole (written beside, then renamed), so a loan cut at any moment leaves the last complete
one. `install` turns a snapshot into a distilled HF folder."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..distill.trainable import install as install_trainable
from ..distill.trainable import load_trained_set, merge_trained
from ..files import atomic_output_dir
from ..model.surgery import build_swiftkv_model, write_swiftkv_folder
from ..sources import open_source

FILE_LIMIT = 15 * 2**20  # bytes of tensors per file: the device tool returns files of at most 16 MiB
PROGRESS_KEY = "progress"
FIRST_FILE = "0.safetensors"  # the file whose metadata holds the progress


def write_snapshot(folder: Path, tensors: dict[str, torch.Tensor], progress: dict) -> None:
    """`tensors` (by parameter name) in bf16 files of at most FILE_LIMIT bytes each, `progress` in the
    first one's metadata; the folder replaced atomically."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().to("cpu", torch.bfloat16).contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if size + nbytes > FILE_LIMIT and shards[-1]:
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
        raise FileNotFoundError(
            f"{first} is missing: {folder} is not a loan snapshot (written by `swiftkv loan run`)"
        )
    with safe_open(first, "pt") as shard:
        return json.loads(shard.metadata()[PROGRESS_KEY])


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
    info = {"source": source.name, "init": "distilled", "trimmed": False, "loan": progress_summary(progress)}
    write_swiftkv_folder(model, source.load_tokenizer(), out, info, force=force)
    return Path(out)


def snapshot_teacher(progress: dict, teacher: str | None) -> str:
    """The teacher a snapshot is installed over: the one given, else the path it trained with where that
    exists (a CPU run's), else the name the stage gave it (the loan box's path is not here)."""
    if teacher:
        return teacher
    if Path(progress["teacher"]).exists():
        return progress["teacher"]
    if progress.get("teacher_name"):
        return progress["teacher_name"]
    raise ValueError(
        f"the snapshot's teacher {progress['teacher']} is where the loan ran, not here; pass --teacher with "
        f"the same teacher here (the one staged as the tar of sha256 {progress['teacher_digest']})"
    )


def progress_summary(progress: dict) -> dict:
    keep = ("step", "total_steps", "train_tokens", "heldout", "tokens_per_second", "device")
    return {key: progress.get(key) for key in keep}
