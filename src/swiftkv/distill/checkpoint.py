"""Checkpoints of a distillation run: the trained tensors, the AdamW state and the run state, in one
file written atomically, so a kill at any moment leaves the previous checkpoint. A run is a pure
function of its settings and step index, so resuming replays exactly."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..files import atomic_file, check_new_output
from ..model.surgery import load_trained
from ..sources import resolve_source
from .settings import SETTING_DEFAULTS, DistillSettings, RunIdentity


@dataclass
class RunState:
    step: int = 0
    total_steps: int = 0
    elapsed: float = 0.0  # wall seconds spent training, over all resumed segments
    history: list = field(default_factory=list)  # held-out evaluations
    micro_batch: int | None = None  # blocks per forward this segment used (--micro-batch auto resolves it)


def save_checkpoint(path: Path, model: nn.Module, optimizer, state: RunState, identity: RunIdentity) -> None:
    """Written to a temp file then renamed: a kill at any moment leaves the previous checkpoint."""
    payload = {
        "fingerprint": identity.fingerprint(),
        "state": asdict(state),
        "trained": {name: p.detach().clone() for name, p in trained_parameters(model).items()},
        "optimizer": optimizer.state_dict(),
    }
    with atomic_file(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path, model: nn.Module, optimizer, identity: RunIdentity) -> RunState:
    payload = torch.load(check_resumable(path, identity), map_location="cpu", weights_only=False)
    load_trained(model, payload["trained"], trained_parameters(model))
    optimizer.load_state_dict(payload["optimizer"])
    return RunState(**payload["state"])


def trained_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters a run trains (its `--trainable` set, installed before training starts)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def check_resumable(path: Path, identity: RunIdentity) -> Path:
    """The checkpoint at `path` exists and was written by this run: same model, same settings.
    Memory-mapped, so checking costs no read of the tensors (run before any long work)."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; start without --resume")
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["fingerprint"]
    now = identity.fingerprint(by_content="source" not in saved)
    # A setting missing from an older checkpoint did not exist then: that run behaved as its default.
    then = {k: saved.get(k, SETTING_DEFAULTS.get(k)) for k in now}
    differing = {k: (then[k], v) for k, v in now.items() if then[k] != v}
    if differing:
        detail = ", ".join(f"{k}: checkpoint {old!r} vs now {new!r}" for k, (old, new) in differing.items())
        raise ValueError(f"--resume: checkpoint {path} is from another model or run configuration ({detail})")
    return path


def check_start(settings: DistillSettings) -> Path | None:
    """Refuse to clobber: an existing output needs --force, an existing checkpoint needs --resume;
    and a --resume whose checkpoint is missing or from another run fails here, before any work."""
    if settings.out:
        check_new_output(settings.out, settings.force)
    path = settings.checkpoint_path()
    if path is not None and settings.resume:
        resolve_source(settings.source)  # a missing source is reported as such, not as another model
        check_resumable(path, settings.identity())
    if path is not None and path.exists() and not settings.resume and not settings.force:
        raise FileExistsError(f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over")
    return path
