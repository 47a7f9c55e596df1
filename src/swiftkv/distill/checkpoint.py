"""Checkpoints of a distillation run: the trained tensors, the AdamW state and the run state, written
so that a kill at any moment leaves the previous checkpoint. A run is a pure function of its settings
and step index, so resuming replays exactly.

One process (or DDP, where every process holds the same tensors): one file, `checkpoint.pt`, written by
process 0 to a temp file and renamed. Under --fsdp every process writes its shards with
torch.distributed.checkpoint into `shards-stepNNNNNNNN/` (a temp folder, renamed when all are done);
then process 0 writes `checkpoint.pt` with the run state and that folder's name, the commit point, and
only then removes older shard folders. The folder must be one every process sees (a shared file
system across nodes). DCP reshards on load, so a run may resume at another world size.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ..files import atomic_file, check_new_output
from ..model.surgery import load_trained
from .settings import SETTING_DEFAULTS, DistillSettings, RunIdentity
from .world import World, barrier

SHARDS_PREFIX = "shards-step"
SHARDED_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)  # frozen weights: the source's


@dataclass
class RunState:
    step: int = 0
    total_steps: int = 0
    elapsed: float = 0.0  # wall seconds spent training, over all resumed segments
    history: list = field(default_factory=list)  # held-out evaluations
    micro_batch: int | None = None  # blocks per forward this segment used (--micro-batch auto resolves it)
    # Peak memory this segment's steps added above the model they train (gradients, optimizer state,
    # activations), in MiB: what `swiftkv distill --plan` estimates beside the weights it counts
    step_memory_mib: float | None = None
    step_tensor_mib: float | None = None  # the same counted tensor by tensor over the segment's first steps


def inner_model(distiller: nn.Module) -> nn.Module:
    """The model a distiller runs (through DDP's wrapper when there is one)."""
    return getattr(distiller, "module", distiller).model


def save_checkpoint(
    path: Path, distiller: nn.Module, optimizer, state: RunState, identity: RunIdentity, world: World
) -> None:
    """A kill at any moment leaves the previous checkpoint (see the module docstring)."""
    payload = {"fingerprint": identity.fingerprint(), "state": asdict(state)}
    if world.fsdp:
        payload["shards"] = save_shards(path.parent, distiller, optimizer, state.step, world)
    else:
        if not world.is_main:
            return
        trained = trained_parameters(inner_model(distiller))
        payload |= {
            "trained": {name: p.detach().clone() for name, p in trained.items()},
            "optimizer": optimizer.state_dict(),
        }
    if world.is_main:
        with atomic_file(path) as tmp:
            torch.save(payload, tmp)
    if world.fsdp:
        if world.is_main:
            for old in path.parent.glob(f"{SHARDS_PREFIX}*"):
                if old.name != payload["shards"]:
                    shutil.rmtree(old, ignore_errors=True)
        barrier(world)


def save_shards(folder: Path, distiller: nn.Module, optimizer, step: int, world: World) -> str:
    """Every process's shards of the trained tensors and optimizer state, in a folder renamed into place
    once all are written; returns its name."""
    name = f"{SHARDS_PREFIX}{step:08d}"
    tmp = folder / f"{name}.tmp"
    if world.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    barrier(world)
    model_state, optimizer_state = get_state_dict(distiller, optimizer, options=SHARDED_OPTIONS)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=tmp)
    barrier(world)
    if world.is_main:
        shutil.rmtree(folder / name, ignore_errors=True)
        tmp.rename(folder / name)
    barrier(world)
    return name


def load_checkpoint(
    path: Path, distiller: nn.Module, optimizer, identity: RunIdentity, world: World
) -> RunState:
    payload = torch.load(check_resumable(path, identity, world.fsdp), map_location="cpu", weights_only=False)
    if world.fsdp:
        model_state, optimizer_state = get_state_dict(distiller, optimizer, options=SHARDED_OPTIONS)
        saved = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(saved, checkpoint_id=path.parent / payload["shards"])
        set_state_dict(
            distiller,
            optimizer,
            model_state_dict=saved["model"],
            optim_state_dict=saved["optimizer"],
            options=SHARDED_OPTIONS,
        )
    else:
        model = inner_model(distiller)
        load_trained(model, payload["trained"], trained_parameters(model))
        optimizer.load_state_dict(payload["optimizer"])
    return RunState(**payload["state"])


def trained_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters a run trains (its `--trainable` set, installed before training starts)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def check_resumable(path: Path, identity: RunIdentity, fsdp: bool = False) -> Path:
    """The checkpoint at `path` exists, was written by this run (same model, same settings) and in the
    layout this run reads (sharded under --fsdp, whole otherwise). Memory-mapped, so checking costs no
    read of the tensors (run before any long work)."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; start without --resume")
    payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    saved = payload["fingerprint"]
    now = identity.fingerprint(by_content="source" not in saved)
    # A setting missing from an older checkpoint did not exist then: that run behaved as its default.
    then = {k: saved.get(k, SETTING_DEFAULTS.get(k)) for k in now}
    differing = {k: (then[k], v) for k, v in now.items() if then[k] != v}
    if differing:
        detail = ", ".join(f"{k}: checkpoint {old!r} vs now {new!r}" for k, (old, new) in differing.items())
        raise ValueError(f"--resume: checkpoint {path} is from another model or run configuration ({detail})")
    if ("shards" in payload) != fsdp:
        written = "with --fsdp (sharded)" if "shards" in payload else "without --fsdp (whole)"
        raise ValueError(
            f"--resume: checkpoint {path} was written {written}; resume it "
            f"{'with' if 'shards' in payload else 'without'} --fsdp"
        )
    return path


def check_start(settings: DistillSettings) -> Path | None:
    """Refuse to clobber: an existing output needs --force, an existing checkpoint needs --resume;
    and a --resume whose checkpoint is missing or from another run fails here, before any work."""
    if settings.out:
        check_new_output(settings.out, settings.force)
    path = settings.checkpoint_path()
    if path is not None and settings.resume:
        check_resumable(path, settings.identity(), settings.fsdp)
    if path is not None and path.exists() and not settings.resume and not settings.force:
        raise FileExistsError(
            f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over"
        )
    return path
