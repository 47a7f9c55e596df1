"""--init-from a SwiftKV weights folder: `swiftkv.json` + `swiftkv.safetensors` as `save_swiftkv_params`
writes them, e.g. an installed student by its alias. Such a folder keeps no optimizer state and no
run settings, only the trained tensors: its SwiftKV parameters and, for a `--trainable lora` student,
each adapted weight's difference from the base as rank factors (weight += delta_b @ delta_a), which
are an adapter's own two factors (its B @ A) up to how the product is split. A run started from it
trains on from those tensors with a fresh AdamW, like one started from an earlier run's checkpoint.
A student snapshot (`snapshot.py`: bf16 files with the run's progress in the first one's metadata) is
such a folder too: its tensors are already named as a run's trained parameters, and its progress says
which student it holds.

Both store the tensors in bf16, so the run starts within bf16 rounding of the student they name (the
held-out score at step 0 shows where)."""

from __future__ import annotations

from pathlib import Path

import torch

from ...model.surgery import DELTA_FACTORS, TRAINED_SPEC, read_trained, read_trained_spec
from ...sources import WEIGHTS_DIR, available_aliases
from ..core.trainable import LORA_A, LORA_B, STUDENT_MODULES
from ..settings import DistillSettings
from .snapshot import FIRST_FILE as SNAPSHOT_FIRST_FILE
from .snapshot import read_progress, read_snapshot


def weights_folder(given: str) -> Path | None:
    """The weights folder `given` names (a folder holding TRAINED_SPEC, a student snapshot, or an
    installed student's alias); None when it names none (it may then name a checkpoint)."""
    path = Path(given)
    if (path / TRAINED_SPEC).is_file() or is_snapshot(path):
        return path
    if given in available_aliases() and (WEIGHTS_DIR / given / TRAINED_SPEC).is_file():
        return WEIGHTS_DIR / given
    return None


def with_folder_rank(settings: DistillSettings, rank_given: bool) -> DistillSettings:
    """A `--trainable lora` run --init-from a weights folder takes the folder's adapter rank unless
    --lora-rank was given: on from a student means at its rank (a shipped soup's 128, not the recipe's
    64), and a rank given that differs is still refused by `start.check_weights_student`, naming both."""
    if rank_given or settings.model.trainable != "lora" or settings.model.init_from is None:
        return settings
    folder = weights_folder(settings.model.init_from)
    rank = folder_spec(folder).get("student_rank") if folder is not None else None
    return settings.but(lora_rank=rank) if rank else settings


def is_snapshot(folder: Path) -> bool:
    return (folder / SNAPSHOT_FIRST_FILE).is_file() and not (folder / TRAINED_SPEC).is_file()


def folder_spec(folder: Path) -> dict:
    """What a weights folder says of its student; a snapshot's progress, in the same terms (the teacher
    by the name its stage gave it: the base the student was converted from)."""
    if not is_snapshot(folder):
        return read_trained_spec(folder)
    progress = read_progress(folder)
    trained = list(STUDENT_MODULES[progress["trainable"]])
    return {
        "base": progress.get("teacher_name"),
        "num_key_value_layers": progress["num_key_value_layers"],
        "key_value_group_size": progress["key_value_group_size"],
        "student_trained": trained or None,
        "student_rank": progress["lora_rank"] if trained else None,
    }


def weights_trained(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors by the trained parameter names of a run of its student (fp32): the SwiftKV
    parameters as stored, each rank factor as its adapter's factor (a snapshot's are named so already)."""
    if is_snapshot(folder):
        return {name: tensor.float() for name, tensor in read_snapshot(folder)[0].items()}
    _, tensors = read_trained(folder)
    delta_b, delta_a = (".weight" + suffix for suffix in DELTA_FACTORS)
    named = {}
    for name, tensor in tensors.items():
        if name.endswith(delta_b):
            name = name.removesuffix(delta_b) + LORA_B
        elif name.endswith(delta_a):
            name = name.removesuffix(delta_a) + LORA_A
        named[name] = tensor.float()
    return named
