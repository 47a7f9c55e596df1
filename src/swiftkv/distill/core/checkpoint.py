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
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor, distribute_tensor

from ...files import atomic_file
from ...model.surgery import load_trained
from ..parallel.world import World, barrier
from ..settings import RunIdentity
from ..start.from_weights import weights_trained
from .trainable import load_trained_set

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
    # Optimizer steps of the same data that the runs this one continues (--continue-from) trained before
    # it: this run's step k trains the data's step continued_steps + k.
    continued_steps: int = 0
    # FLOPs per train token of this run's step on its own blocks (`bound.step_flops_per_token`): its
    # compute bound's numerator, set by each segment
    flops_per_token: float | None = None


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


def load_checkpoint(path: Path, distiller: nn.Module, optimizer, world: World) -> RunState:
    """This run's own checkpoint at `path` (checked by `start.decide_start`) into the model and optimizer;
    the run state it saved."""
    payload = torch.load(path, map_location="cpu", weights_only=False)
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


def load_trained_from(checkpoint: Path, distiller: nn.Module, world: World) -> None:
    """The trained tensors of an earlier run's checkpoint into this run's model (its optimizer state is
    not taken: this run's schedule starts over). `checkpoint` may be a weights folder instead."""
    model = inner_model(distiller)
    trained = trained_parameters(model)
    if checkpoint.is_dir():
        load_trained_set(model, trained, placed_as(weights_trained(checkpoint), trained), checkpoint)
        return
    payload = torch.load(checkpoint, map_location="cpu", weights_only=False)
    if "shards" in payload:
        saved = {"model": get_model_state_dict(distiller, options=SHARDED_OPTIONS)}
        shards = checkpoint.parent / payload["shards"]
        alone = not torch.distributed.is_initialized()  # one process reads every shard: what is meant
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
            dcp.load(saved, checkpoint_id=shards, no_dist=alone)
        set_model_state_dict(distiller, saved["model"], options=SHARDED_OPTIONS)
    else:
        load_trained(model, placed_as(payload["trained"], trained), trained)


def placed_as(tensors: dict[str, torch.Tensor], params: dict[str, nn.Parameter]) -> dict[str, torch.Tensor]:
    """Whole tensors placed as the parameters they load into: under --fsdp a parameter is a DTensor, and
    each process takes its shard of the whole tensor (every process read the same file)."""
    return {
        name: distribute_tensor(
            tensor.to(params[name].dtype), params[name].device_mesh, params[name].placements
        )
        if isinstance(params.get(name), DTensor)
        else tensor
        for name, tensor in tensors.items()
    }


def trained_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters a run trains (its `--trainable` set, installed before training starts)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}
