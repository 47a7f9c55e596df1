"""Knowledge-preserving distillation of a SwiftKV student into itself (teacher = swiftkv off).

Why it is cheaper than the reference (ArcticTraining): layers < N are identical for teacher and
student, so one forward through them (no grad) feeds both the teacher's later layers (no grad) and
the student's (grad only into the SwiftKV projections). Only masked rows reach the vocabulary
projection, in chunks. Runs on CPU (optionally with bf16 autocast); `torchrun` gives DDP (gloo on CPU, nccl on GPU).

The loop is small functions: `lr_at`, `train_step`, `evaluate`, `save_checkpoint` / `load_checkpoint`,
and `distill` wires them. A run is a pure function of its settings and step index (data order comes
from the seed, the schedule from the step), so resuming from a checkpoint replays exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..modeling import swiftkv_parameters
from ..sources import atomic_file
from .data import Blocks, load_blocks
from .loss import agreement_stats, backward_distill_loss

CHECKPOINT_FILE = "checkpoint.pt"
# Settings that do not change the training trajectory; a resume may differ in them.
RUN_ONLY_SETTINGS = ("out", "checkpoint_dir", "eval_every", "checkpoint_every", "stop_after", "force", "resume")


@dataclass
class DistillSettings:
    source: str
    out: str | None = None
    data: str = "sharegpt"
    teacher: str | None = None
    tokens: int = 1_000_000  # train tokens (whole blocks, masked or not)
    heldout_tokens: int = 32_768
    seq_len: int = 1024
    batch_size: int = 16  # blocks per optimizer step, over all processes
    micro_batch: int = 2  # blocks per forward
    lr: float = 2e-4
    warmup: float = 0.05  # fraction of steps with linear warmup; linear decay to 0 after
    weight_decay: float = 0.0
    temperature: float = 2.0
    mse_weight: float = 0.0
    max_grad_norm: float = 1.0
    bf16: bool = False  # measured slower than fp32 on this 2-core machine (docs/distillation.md)
    chunk_rows: int = 512
    naive: bool = False  # teacher and student each run all layers (the reference way), for comparison
    seed: int = 0
    eval_every: int = 50
    checkpoint_every: int = 10
    checkpoint_dir: str | None = None
    stop_after: int | None = None  # leave after this many steps (checkpointed), e.g. to slice a long run
    resume: bool = False
    force: bool = False

    def fingerprint(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in RUN_ONLY_SETTINGS}

    def checkpoint_path(self) -> Path | None:
        folder = self.checkpoint_dir or (f"{self.out}.ckpt" if self.out else None)
        return Path(folder) / CHECKPOINT_FILE if folder else None


@dataclass
class World:
    """This process's place in a (possibly 1-process) torch.distributed group."""

    rank: int = 0
    size: int = 1
    ddp: bool = False
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass
class RunState:
    step: int = 0
    total_steps: int = 0
    elapsed: float = 0.0  # wall seconds spent training, over all resumed segments
    history: list = field(default_factory=list)  # held-out evaluations


# --------------------------------------------------------------------------------------------------
# Model pieces
# --------------------------------------------------------------------------------------------------


def freeze_all_but_swiftkv(model: nn.Module) -> list[nn.Parameter]:
    """Only the SwiftKV projections and norm_swiftkv train; everything else is the frozen teacher."""
    trained = swiftkv_parameters(model)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trained)
    return list(trained.values())


class SharedPrefixDistiller(nn.Module):
    """forward(blocks) -> (student rows, teacher rows): final hidden states, before the final norm, of
    the trained positions. Layers < N run once for both (or twice with `naive`)."""

    def __init__(self, model: nn.Module, naive: bool = False):
        super().__init__()
        self.model = model
        self.naive = naive

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, rows: torch.Tensor):
        inner = self.model.model
        with torch.no_grad():
            early = inner.embed_and_early(input_ids=input_ids, position_ids=position_ids)
            teacher = inner.late(early, student=False)
            if self.naive:
                early = inner.embed_and_early(input_ids=input_ids, position_ids=position_ids)
        student = inner.late(early, student=True)
        width = student.shape[-1]
        return student.reshape(-1, width)[rows], teacher.reshape(-1, width)[rows]


def logits_fn(model: nn.Module):
    return lambda hidden: model.lm_head(model.model.norm(hidden))


def autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


def device_of(model: nn.Module) -> torch.device:
    return model.lm_head.weight.device


# --------------------------------------------------------------------------------------------------
# Schedule, step, evaluation
# --------------------------------------------------------------------------------------------------


def lr_at(step: int, total_steps: int, peak: float, warmup: float) -> float:
    """Linear warmup over `warmup` of the steps, then linear decay to 0 (the reference schedule)."""
    warmup_steps = max(1, math.ceil(warmup * total_steps))
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    return peak * max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def rank_blocks(train: Blocks, step: int, settings: DistillSettings, world: World) -> Blocks:
    """This process's share of the global batch of `step`: the same global batch for any world size."""
    per_rank = settings.batch_size // world.size
    start = step * settings.batch_size + world.rank * per_rank
    return train.select(slice(start, start + per_rank))


def train_step(distiller: nn.Module, model: nn.Module, optimizer: torch.optim.Optimizer, blocks: Blocks,
               global_rows: int, settings: DistillSettings, world: World) -> float:
    """One optimizer step over this process's blocks; returns this process's loss sum. Each
    micro-batch's loss is scaled so the (DDP-averaged) gradient is that of the global mean loss."""
    scale = world.size / max(1, global_rows)
    micro_batches = [blocks.select(slice(i, i + settings.micro_batch)) for i in range(0, len(blocks), settings.micro_batch)]
    total, device = 0.0, device_of(model)
    for k, micro in enumerate(micro_batches):
        sync_later = world.ddp and k < len(micro_batches) - 1
        with distiller.no_sync() if sync_later else contextlib.nullcontext(), autocast(settings.bf16, device):
            micro = micro.to(device)
            rows = micro.loss_mask.reshape(-1).nonzero().squeeze(1)
            student, teacher = distiller(micro.input_ids, micro.position_ids, rows)
            total += backward_distill_loss(student, teacher, logits_fn(model), settings.temperature,
                                           settings.mse_weight, scale, settings.chunk_rows)
    parameters = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(parameters, settings.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def evaluate(model: nn.Module, heldout: Blocks, settings: DistillSettings, world: World) -> dict:
    """Held-out KL(teacher || student) at T = 1 and top-1 agreement over the trained positions."""
    distiller = SharedPrefixDistiller(model)
    totals = torch.zeros(3, dtype=torch.float64)
    mine = heldout.select(slice(world.rank, None, world.size))
    for i in range(0, len(mine), settings.micro_batch):
        micro = mine.select(slice(i, i + settings.micro_batch)).to(device_of(model))
        with autocast(settings.bf16, device_of(model)):
            rows = micro.loss_mask.reshape(-1).nonzero().squeeze(1)
            student, teacher = distiller(micro.input_ids, micro.position_ids, rows)
            totals += torch.tensor(agreement_stats(student, teacher, logits_fn(model), settings.chunk_rows),
                                   dtype=torch.float64)
    all_reduce(totals, world)
    kl, agree, rows = totals.tolist()
    return {"kl": kl / max(rows, 1), "top1": agree / max(rows, 1), "positions": int(rows)}


def all_reduce(tensor: torch.Tensor, world: World) -> torch.Tensor:
    """Sum over processes (through the group's device: nccl only reduces CUDA tensors)."""
    if not world.ddp:
        return tensor
    on_device = tensor.to(world.device)
    torch.distributed.all_reduce(on_device)
    return on_device.to(tensor.device)


# --------------------------------------------------------------------------------------------------
# Checkpoints
# --------------------------------------------------------------------------------------------------


def save_checkpoint(path: Path, model: nn.Module, optimizer, state: RunState, settings: DistillSettings) -> None:
    """Written to a temp file then renamed: a kill at any moment leaves the previous checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
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
    with torch.no_grad():
        for name, parameter in swiftkv_parameters(model).items():
            parameter.copy_(payload["trained"][name])
    optimizer.load_state_dict(payload["optimizer"])
    return RunState(**payload["state"])


def check_start(settings: DistillSettings) -> Path | None:
    """Refuse to clobber: an existing output needs --force, an existing checkpoint needs --resume."""
    if settings.out and Path(settings.out).exists() and not settings.force:
        raise FileExistsError(f"output folder {settings.out} already exists; pass --force to overwrite it")
    path = settings.checkpoint_path()
    if path is not None and path.exists() and not settings.resume and not settings.force:
        raise FileExistsError(f"a checkpoint exists at {path}; pass --resume to continue it or --force to start over")
    return path


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def init_world() -> World:
    """torchrun sets WORLD_SIZE/RANK: join the group (gloo on CPU, nccl on GPU)."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size == 1:
        return World()
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(torch.distributed.get_rank(), torch.distributed.get_world_size(), ddp=True, device=device)


def check_batch(settings: DistillSettings, world: World) -> None:
    per_rank = settings.batch_size // world.size
    if settings.batch_size % world.size or per_rank % settings.micro_batch:
        raise ValueError(f"--batch-size {settings.batch_size} must split into {world.size} process(es) x a multiple "
                         f"of --micro-batch {settings.micro_batch}")


def wrap(model: nn.Module, settings: DistillSettings, world: World) -> nn.Module:
    distiller = SharedPrefixDistiller(model, naive=settings.naive)
    if world.ddp:
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(distiller, device_ids=device_ids, broadcast_buffers=False)
    return distiller


def log(world: World, message: str) -> None:
    if world.is_main:
        print(message, flush=True)


def distill(settings: DistillSettings, model: nn.Module, tokenizer, world: World | None = None) -> RunState:
    """Train `model` in place (a SwiftKV model whose teacher weights are the source). Returns the run
    state; checkpoints go to `settings.checkpoint_path()` when it is set."""
    from tqdm import tqdm

    world = world or World()
    check_batch(settings, world)
    ckpt = settings.checkpoint_path()
    train, heldout = load_blocks(settings.data, tokenizer, settings.seq_len, settings.tokens,
                                 settings.heldout_tokens, settings.seed)
    total_steps = len(train) // settings.batch_size
    if total_steps == 0:
        raise ValueError(f"--tokens {settings.tokens} gives {len(train)} blocks, fewer than one --batch-size "
                         f"{settings.batch_size}; raise --tokens or lower --batch-size / --seq-len")
    model.to(world.device)
    parameters = freeze_all_but_swiftkv(model)
    optimizer = torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay)
    state = load_checkpoint(ckpt, model, optimizer, settings) if settings.resume else RunState()
    state.total_steps = total_steps
    distiller = wrap(model, settings, world)
    if not state.history:
        state.history.append({"step": 0, **evaluate(model, heldout, settings, world)})
        log(world, f"held-out before: {json.dumps(state.history[-1])}")
    last = total_steps if settings.stop_after is None else min(total_steps, settings.stop_after)
    progress = tqdm(range(state.step, last), initial=state.step, total=total_steps, disable=not world.is_main,
                    desc="distill", unit="step", dynamic_ncols=True)
    block_tokens = settings.batch_size * settings.seq_len
    for step in progress:
        started = time.perf_counter()
        blocks = rank_blocks(train, step, settings, world)
        global_rows = int(train.select(slice(step * settings.batch_size, (step + 1) * settings.batch_size)).loss_mask.sum())
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, total_steps, settings.lr, settings.warmup)
        loss = train_step(distiller, model, optimizer, blocks, global_rows, settings, world)
        loss = float(all_reduce(torch.tensor([loss], dtype=torch.float64), world)) / max(global_rows, 1)
        state.step, seconds = step + 1, time.perf_counter() - started
        state.elapsed += seconds
        progress.set_postfix(loss=f"{loss:.4f}", tok_s=f"{block_tokens / seconds:.0f}", lr=f"{group['lr']:.2e}")
        state.history.append({"step": state.step, "loss": loss, "lr": group["lr"]})
        if state.step % settings.eval_every == 0 or state.step == total_steps:
            state.history.append({"step": state.step, **evaluate(model, heldout, settings, world)})
            if world.is_main:
                progress.write(f"held-out at step {state.step}: {json.dumps(state.history[-1])}")
        if ckpt is not None and world.is_main and (state.step % settings.checkpoint_every == 0 or state.step == last):
            save_checkpoint(ckpt, model, optimizer, state, settings)
    progress.close()
    return state


def finished(state: RunState) -> bool:
    return state.total_steps > 0 and state.step >= state.total_steps


def run_summary(settings: DistillSettings, state: RunState) -> dict:
    evals = [h for h in state.history if "kl" in h]
    losses = [h["loss"] for h in state.history if "loss" in h]
    tokens = state.step * settings.batch_size * settings.seq_len
    return {
        "settings": asdict(settings),
        "steps": state.step,
        "train_tokens": tokens,
        "train_seconds": round(state.elapsed, 1),
        "tokens_per_second": round(tokens / state.elapsed, 1) if state.elapsed else None,
        "heldout_before": evals[0] if evals else None,
        "heldout_after": evals[-1] if evals else None,
        "final_loss": losses[-1] if losses else None,
        "history": state.history,
    }
