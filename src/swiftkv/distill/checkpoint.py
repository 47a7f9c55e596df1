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
from dataclasses import asdict, dataclass, field, replace
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

from ..files import atomic_file, check_new_output
from ..model.surgery import load_trained
from .from_weights import check_weights_student, weights_folder, weights_trained
from .settings import CHECKPOINT_FILE, MODEL_KEY, SETTING_DEFAULTS, DistillSettings, RunIdentity
from .snapshot import saved_checkpoint
from .trainable import load_trained_set
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


# Settings a continuing run (--continue-from) may change: how long it trains and its optimizer's schedule.
CONTINUE_MAY_CHANGE = (
    "tokens",
    "passes",
    "continue_from",
    "lr",
    "late_lr",
    "warmup",
    "weight_decay",
    "max_grad_norm",
)


@dataclass(frozen=True)
class Continued:
    """The run a --continue-from run continues: its checkpoint and where it left the data."""

    checkpoint: Path
    steps: int  # the data's optimizer steps trained by it and by the runs it continued


def earlier_checkpoint(given: str, option: str) -> Path:
    """The checkpoint file an option names: an earlier run's OUT.ckpt folder or the file in it."""
    path = Path(given)
    path = path / CHECKPOINT_FILE if path.is_dir() else path
    if not path.is_file():
        raise FileNotFoundError(
            f"{option} {given}: no checkpoint there; expected an earlier run's OUT.ckpt folder or the "
            f"{CHECKPOINT_FILE} in it"
        )
    return path


def check_continuable(settings: DistillSettings) -> Continued | None:
    """The --continue-from checkpoint exists, was written by a run of this student on this data (every
    setting equal but those of CONTINUE_MAY_CHANGE, one pass of the same length), and leaves steps for
    this run to train. Memory-mapped: checked before any long work."""
    if settings.continue_from is None:
        return None
    path = earlier_checkpoint(settings.continue_from, "--continue-from")
    payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    saved = payload["fingerprint"]
    differing = differing_settings(saved, settings.identity(), may_change=CONTINUE_MAY_CHANGE)
    if differing:
        raise ValueError(
            f"--continue-from {path}: that run trained another student or data ({differing}); a continuing "
            f"run may change only {', '.join(CONTINUE_MAY_CHANGE)}"
        )
    earlier = replace(settings, **{k: saved.get(k, SETTING_DEFAULTS[k]) for k in ("tokens", "passes")})
    if earlier.data_tokens != settings.data_tokens:
        passes = max(2, settings.passes)
        raise ValueError(
            f"--continue-from {path}: its pass over the data held {earlier.data_tokens:,} train tokens and "
            f"this run's holds {settings.data_tokens:,} (--tokens / --passes); expected the same data, "
            f"e.g. --tokens {earlier.data_tokens * passes:,} with --passes {passes}"
        )
    state = RunState(**payload["state"])
    steps = state.continued_steps + state.step
    if steps * settings.batch_size >= settings.train_tokens // settings.seq_len:
        raise ValueError(
            f"--continue-from {path}: it has trained {steps * settings.batch_size * settings.seq_len:,} "
            f"tokens of the data and this run asks for {settings.train_tokens:,} in all; ask for more "
            "--tokens (with --passes to repeat the data)"
        )
    return Continued(path, steps)


# What makes an earlier run's trained tensors this run's student (--init-from): the model both start
# from (its identity keys) and what they train.
STUDENT_SETTINGS = ("source", "trainable", "lora_rank")


def check_initializable(settings: DistillSettings, config: dict | None = None) -> Path | None:
    """The --init-from checkpoint exists and trained this student (the same model, --trainable and
    --lora-rank); every other setting may differ. Memory-mapped: checked before any long work. A weights
    folder instead is checked against `config` (`from_weights`). None when there is none, or when this
    run continues one started from it (--continue-from: the tensors come from that run, whose
    --init-from check_continuable finds equal to this one's)."""
    if settings.init_from is None or settings.continue_from is not None:
        return None
    folder = weights_folder(settings.init_from)
    if folder is not None:
        check_weights_student(folder, settings, config)
        return folder
    path = earlier_checkpoint(settings.init_from, "--init-from")
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["fingerprint"]
    identity = settings.identity()
    others = tuple(
        k
        for k in identity.fingerprint(by_content="source" not in saved)
        if k not in STUDENT_SETTINGS and not k.startswith(MODEL_KEY)
    )
    differing = differing_settings(saved, identity, may_change=others)
    if differing:
        raise ValueError(
            f"--init-from {path}: that run trained another student ({differing}); expected the same "
            "source, --trainable and --lora-rank"
        )
    return path


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


def check_resumable(path: Path, identity: RunIdentity, fsdp: bool = False) -> Path:
    """The checkpoint at `path` exists, was written by this run (same model, same settings) and in the
    layout this run reads (sharded under --fsdp, whole otherwise). Memory-mapped, so checking costs no
    read of the tensors (run before any long work)."""
    if not path.is_file():
        raise FileNotFoundError(f"--resume: no checkpoint at {path}; start without --resume")
    payload = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    differing = differing_settings(payload["fingerprint"], identity)
    if differing:
        raise ValueError(
            f"--resume: checkpoint {path} is from another model or run configuration ({differing})"
        )
    if ("shards" in payload) != fsdp:
        written = "with --fsdp (sharded)" if "shards" in payload else "without --fsdp (whole)"
        raise ValueError(
            f"--resume: checkpoint {path} was written {written}; resume it "
            f"{'with' if 'shards' in payload else 'without'} --fsdp"
        )
    return path


def check_same_continuation(path: Path, continued: Continued) -> None:
    """A resumed continuation trains the data after the steps it started after: refused if the run it
    continues has trained on since (its checkpoint now ends elsewhere in the data)."""
    started_after = torch.load(path, map_location="cpu", weights_only=False, mmap=True)["state"][
        "continued_steps"
    ]
    if started_after != continued.steps:
        raise ValueError(
            f"--resume: this run continued {continued.checkpoint} after {started_after} steps of the data, "
            f"and that checkpoint now ends after {continued.steps}; resume with the checkpoint as it was, "
            "or start a new continuation"
        )


def differing_settings(saved: dict, identity: RunIdentity, may_change: tuple[str, ...] = ()) -> str:
    """The settings and model identity in which a checkpoint's fingerprint `saved` differs from this
    run's (those of `may_change` aside), described; empty when none does."""
    now = identity.fingerprint(by_content="source" not in saved)
    # A setting missing from an older checkpoint did not exist then: that run behaved as its default.
    then = {k: saved.get(k, SETTING_DEFAULTS.get(k)) for k in now}
    return ", ".join(
        f"{k}: checkpoint {then[k]!r} vs now {v!r}"
        for k, v in now.items()
        if then[k] != v and k not in may_change
    )


def snapshot_resume(settings: DistillSettings) -> DistillSettings:
    """A run with --snapshot-every started again by the same command: it resumes from the checkpoint it
    left (`snapshot.saved_checkpoint`), as with --resume; --force starts over, and a first start starts."""
    if settings.snapshot_every is None or settings.resume or settings.force:
        return settings
    path = settings.checkpoint_path()
    if path is None or saved_checkpoint(path.parent, path.name) is None:
        return settings
    return replace(settings, resume=True)


def check_start(settings: DistillSettings) -> Path | None:
    """Refuse to clobber: an existing output needs --force, an existing checkpoint needs --resume;
    and a --resume, --continue-from or --init-from whose checkpoint is missing or from another run fails here,
    before any work."""
    if settings.out:
        check_new_output(settings.out, settings.force)
    if settings.passes < 1:
        raise ValueError(f"--passes {settings.passes}: expected a whole number of passes, at least 1")
    if settings.snapshot_every is not None and not settings.snapshot_every > 0:
        raise ValueError(f"--snapshot-every {settings.snapshot_every}: expected a number of seconds above 0")
    if settings.profile_steps is not None and settings.profile_steps < 1:
        raise ValueError(f"--profile-steps {settings.profile_steps}: expected a number of steps, at least 1")
    continued = check_continuable(settings)
    check_initializable(settings)
    path = settings.checkpoint_path()
    if path is not None and settings.resume:
        check_resumable(path, settings.identity(), settings.fsdp)
        if continued is not None:
            check_same_continuation(path, continued)
    if path is not None and path.exists() and not settings.resume and not settings.force:
        raise FileExistsError(
            f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over"
        )
    return path
