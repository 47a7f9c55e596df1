"""Checkpoints of a distillation run: the trained tensors, the AdamW state and the run state, in one
file written atomically, so a kill at any moment leaves the previous checkpoint. A run is a pure
function of its settings and step index, so resuming replays exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..files import atomic_file, check_new_output
from ..model.modeling import swiftkv_parameters
from ..model.surgery import load_trained
from .settings import DistillSettings


@dataclass
class RunState:
    step: int = 0
    total_steps: int = 0
    elapsed: float = 0.0  # wall seconds spent training, over all resumed segments
    history: list = field(default_factory=list)  # held-out evaluations


def save_checkpoint(path: Path, model: nn.Module, optimizer, state: RunState, settings: DistillSettings) -> None:
    """Written to a temp file then renamed: a kill at any moment leaves the previous checkpoint."""
    payload = {
        "fingerprint": settings.fingerprint(),
        "state": asdict(state),
        "trained": {name: p.detach().clone() for name, p in swiftkv_parameters(model).items()},
        "optimizer": optimizer.state_dict(),
    }
    with atomic_file(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path, model: nn.Module, optimizer, settings: DistillSettings) -> RunState:
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; start without --resume")
    payload = torch.load(path, map_location="cpu", weights_only=False)
    differing = {k: (payload["fingerprint"].get(k), v) for k, v in settings.fingerprint().items()
                 if payload["fingerprint"].get(k) != v}
    if differing:
        detail = ", ".join(f"{k}: checkpoint {old!r} vs now {new!r}" for k, (old, new) in differing.items())
        raise ValueError(f"--resume: checkpoint {path} is from another run configuration ({detail})")
    load_trained(model, payload["trained"])
    optimizer.load_state_dict(payload["optimizer"])
    return RunState(**payload["state"])


def check_start(settings: DistillSettings) -> Path | None:
    """Refuse to clobber: an existing output needs --force, an existing checkpoint needs --resume."""
    if settings.out:
        check_new_output(settings.out, settings.force)
    path = settings.checkpoint_path()
    if path is not None and path.exists() and not settings.resume and not settings.force:
        raise FileExistsError(f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over")
    return path
