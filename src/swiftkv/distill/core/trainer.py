"""Knowledge-preserving distillation of a SwiftKV student into itself (teacher = swiftkv off).

Why it is cheaper than the reference (ArcticTraining): layers < N are identical for teacher and
student, so one forward through them (no grad) feeds both the teacher's later layers (no grad) and
the student's (grad only into the SwiftKV projections). Only masked rows reach the vocabulary
projection, in chunks. Runs on CPU or GPU, with bf16 autocast where bf16 is native; `torchrun` gives DDP (gloo on CPU, nccl on GPU).

The loop's pieces are small functions: `lr_at`, `train_step`, `evaluate`, `prepare`; `loop.Trainer` runs
them with `checkpoint`'s save and load. A run is a pure function of its settings and step index (data order comes
from the seed, the schedule from the step), so resuming from a checkpoint replays exactly.
"""

from __future__ import annotations

import contextlib
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from torch import nn

from ...data.packing import Blocks, load_blocks
from ...dtypes import autocast, resolve_dtype
from ...metrics import agreement_stats
from ...model.modeling import PairHidden, swiftkv_parameters
from ..parallel import sharding
from ..parallel.shared_blocks import shared_blocks
from ..parallel.world import World, all_reduce, log
from ..sections import OptimSettings
from ..settings import HUMAN_SHARE, DistillSettings, StepSettings
from ..start import sharded
from . import microbatch, trainable
from .checkpoint import (
    RunState,
    trained_parameters,
)
from .compiled import CompiledLayers
from .loss import BatchSizes, LossTerms, distill_loss

# --------------------------------------------------------------------------------------------------
# Model pieces
# --------------------------------------------------------------------------------------------------


# torch's fused attention (on CUDA it dispatches to flash / memory-efficient kernels). transformers'
# flash_attention_2 is not used: the student's later layers attend with queries on a subset of the
# positions (the prefill skip) over every position's K/V, which its packed-sequence path does not take.
ATTENTION = "sdpa"


def freeze_all_but_swiftkv(model: nn.Module) -> list[nn.Parameter]:
    """Only the SwiftKV projections and norm_swiftkv train; everything else is the frozen teacher."""
    return list(trainable.install(model, "swiftkv").values())


def optimizer_for(model: nn.Module, optim: OptimSettings) -> torch.optim.Optimizer:
    """AdamW over the run's trainable set (installed before, so that a sharded model is built first):
    the SwiftKV parameters at --lr, the student-only later-layer weights (if any) at --late-lr. Each
    group keeps its peak rate for the schedule."""
    trained = trained_parameters(model)
    own = swiftkv_parameters(model)
    groups = [{"params": [p for n, p in trained.items() if n in own], "peak_lr": optim.lr}]
    late = [p for n, p in trained.items() if n not in own]
    if late:
        groups.append({"params": late, "peak_lr": optim.late_lr})
    fused = fused_adamw(list(trained.values()))
    return torch.optim.AdamW(groups, lr=optim.lr, weight_decay=optim.weight_decay, fused=fused)


# Devices where torch has AdamW's fused kernel for float tensors (sharded DTensors included).
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def fused_adamw(parameters: list[nn.Parameter]) -> bool:
    """Whether AdamW runs fused: one multi-tensor kernel updates every trained tensor, where the default is
    a dozen foreach launches per tensor chunk on CUDA (356 calls per N = 15 step) and a loop of a dozen ops
    per tensor on a CPU (1,494 calls). A small student's GPU step is bound by its launches, so these count
    there; on a CPU they are a rounding error, and the update is the same math."""
    return all(p.device.type in FUSED_ADAMW_DEVICES and p.is_floating_point() for p in parameters)


def cast_frozen(model: nn.Module, dtype: torch.dtype) -> None:
    """Frozen (teacher) weights in the compute dtype, trained ones kept fp32 (the master copy):
    autocast would otherwise re-cast every frozen weight on every forward (measured: a fifth of a
    bf16 step was such copies). The output folder is rebuilt from the source, so the teacher weights
    written stay exactly the source's."""
    if dtype == torch.float32:
        return
    for parameter in model.parameters():
        if not parameter.requires_grad:
            parameter.data = parameter.data.to(dtype)


class SharedPrefixDistiller(nn.Module):
    """forward(blocks) -> PairHidden of the trained positions (`model.model.forward_pair`). Layers < N
    run once for both, or twice with `naive`. A module, so that DDP can wrap it."""

    def __init__(self, model: nn.Module, naive: bool = False, probe_layer: int | None = None):
        super().__init__()
        self.model = model
        self.naive = naive
        self.probe_layer = probe_layer

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, rows: torch.Tensor) -> PairHidden:
        return self.model.model.forward_pair(
            input_ids, position_ids, rows, self.probe_layer, shared_prefix=not self.naive
        )


def distiller_for(model: nn.Module, step: StepSettings) -> SharedPrefixDistiller:
    """The plain (not DDP) distiller of a run: shared prefix or naive, with the MSE's probe layer."""
    return SharedPrefixDistiller(model, naive=step.naive, probe_layer=probe_layer_of(step.loss, model.config))


def probe_layer_of(terms: LossTerms, config) -> int | None:
    """The later layer whose input the MSE compares: transformers' hidden_states[k] is the input of
    layer k (k < L), so index -2 is the input of the last layer."""
    if not terms.mse_weight:
        return None
    layers = config.num_hidden_layers
    layer = terms.mse_hidden_index % (layers + 1)
    if not config.num_key_value_layers < layer < layers:
        raise ValueError(
            f"--mse-hidden-index {terms.mse_hidden_index} is hidden_states[{layer}], the input of "
            f"layer {layer}; expected the input of a later layer {config.num_key_value_layers + 1}.."
            f"{layers - 1} (early layers are identical in teacher and student)"
        )
    return layer


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


def rank_blocks(train: Blocks, step: int, batch_size: int, world: World) -> Blocks:
    """This process's share of the global batch of `step`: the same global batch for any world size."""
    per_rank = batch_size // world.size
    start = step * batch_size + world.rank * per_rank
    return train.select(slice(start, start + per_rank))


def train_step(
    distiller: nn.Module,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    blocks: Blocks,
    sizes: BatchSizes,
    step: StepSettings,
    world: World,
) -> float:
    """One optimizer step over this process's blocks; returns this process's share of the global
    mean loss."""
    total = accumulate_gradients(distiller, model, blocks, sizes, step, world)
    parameters = [p for p in model.parameters() if p.requires_grad]
    torch.nn.utils.clip_grad_norm_(parameters, step.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def accumulate_gradients(
    distiller: nn.Module,
    model: nn.Module,
    blocks: Blocks,
    sizes: BatchSizes,
    step: StepSettings,
    world: World,
) -> float:
    """Forward + backward of `blocks`, --micro-batch blocks at a time; returns this process's share of
    the step's global mean loss (`distill_loss` scales each micro-batch's gradients to it)."""
    micro_batches = [
        blocks.select(slice(i, i + step.micro_batch)) for i in range(0, len(blocks), step.micro_batch)
    ]
    total, device = 0.0, device_of(model)
    dtype = resolve_dtype(step.dtype, device)
    for k, micro in enumerate(micro_batches):
        with gradient_sync(distiller, world, k == len(micro_batches) - 1), autocast(dtype, device):
            micro, rows, trained = on_device(micro, device)
            pair = distiller(micro.input_ids, micro.position_ids, rows)
            total += distill_loss(pair, model.lm_head, step.loss, sizes, world.size, trained)
    return float(total)  # the step's one wait for the device


def on_device(micro: Blocks, device: torch.device) -> tuple[Blocks, torch.Tensor, bool]:
    """(the micro-batch on `device`, the flat positions the loss reads there, whether any is trained). The
    positions are found on the host, before the copy, so finding them never waits for the device. A
    micro-batch without trained positions still runs one position, at zero weight: the model never sees an
    empty selection, and every process makes the same collective calls (DDP's gradient reduction, FSDP's
    gathers)."""
    rows = micro.loss_mask.reshape(-1).nonzero().squeeze(1)
    rows, trained = (rows, True) if len(rows) else (rows.new_zeros(1), False)
    return micro.to(device), rows.to(device), trained


def gradient_sync(distiller: nn.Module, world: World, last: bool):
    """DDP reduces gradients after the last micro-batch of a step only. FSDP reduce-scatters after each:
    holding the unsharded gradients of every unit until the last one would cost the whole trained set's
    gradients on every process, the memory sharding is there to save."""
    return distiller.no_sync() if world.ddp and not world.fsdp and not last else contextlib.nullcontext()


@torch.no_grad()
def evaluate(
    model: nn.Module, heldout: Blocks, step: StepSettings, world: World, distiller: nn.Module | None = None
) -> dict:
    """Held-out KL(teacher || student) at T = 1 and top-1 agreement over the trained positions.
    `distiller`: the run's sharded one under FSDP (else a plain one is made)."""
    distiller = distiller if world.fsdp else SharedPrefixDistiller(model)
    totals = torch.zeros(3, dtype=torch.float64)
    mine = heldout.select(slice(world.rank, None, world.size))
    device = device_of(model)
    # Under FSDP every process runs as many forwards as the one with the most blocks; the extra ones count nothing.
    forwards = (
        math.ceil(math.ceil(len(heldout) / world.size) / step.micro_batch)
        if world.fsdp
        else math.ceil(len(mine) / step.micro_batch)
    )
    for i in range(forwards):
        micro = mine.select(slice(i * step.micro_batch, (i + 1) * step.micro_batch))
        counted = len(micro) > 0
        micro = micro if counted else heldout.select(slice(0, 1))
        micro, rows, trained = on_device(micro, device)
        with autocast(resolve_dtype(step.dtype, device), device):
            pair = distiller(micro.input_ids, micro.position_ids, rows)
            stats = agreement_stats(pair.student, pair.teacher, model.lm_head, step.loss.chunk_rows)
            if counted and trained:
                totals += torch.tensor(stats, dtype=torch.float64)
    totals = all_reduce(totals, world)  # a copy where the group reduces on a GPU
    kl, agree, rows = totals.tolist()
    return {"kl": kl / max(rows, 1), "top1": agree / max(rows, 1), "positions": int(rows)}


# --------------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------------


def sized_micro_batch(
    model: nn.Module, train: Blocks, step: StepSettings, batch_size: int, world: World
) -> StepSettings:
    """`step` with --micro-batch resolved to a number (`auto`: see distill/core/microbatch.py). The CUDA
    probe runs the first step's blocks through a plain (not DDP) distiller, so no process waits on
    another's collective, and every process then takes the smallest size any of them could fit."""
    per_rank = batch_size // world.size
    probe_blocks = rank_blocks(train, 0, batch_size, world)

    def probe_step(size: int) -> None:
        try:
            accumulate_gradients(
                distiller_for(model, step),
                model,
                probe_blocks.select(slice(0, size)),
                BatchSizes.of(probe_blocks),
                replace(step, micro_batch=size),
                World(device=world.device),
            )
        finally:
            model.zero_grad(set_to_none=True)

    if world.fsdp and step.micro_batch == microbatch.AUTO and world.device.type == "cuda":
        # The probe needs the whole model on one device, which sharding exists to avoid: one block per forward.
        size = 1
    else:
        size = microbatch.resolve_micro_batch(step.micro_batch, per_rank, world.device, probe_step)
    if world.ddp:
        smallest = torch.tensor([size], device=world.device)
        torch.distributed.all_reduce(smallest, op=torch.distributed.ReduceOp.MIN)
        size = int(smallest)
    if step.micro_batch == microbatch.AUTO:
        log(world, f"--micro-batch auto: {size} block(s) per forward on {world.device.type}")
    return replace(step, micro_batch=size)


def wrap(distiller: SharedPrefixDistiller, world: World, compute_dtype: torch.dtype) -> nn.Module:
    """`distiller` as this world trains it: sharded with --fsdp, DDP-wrapped when there are several
    processes, else as it is."""
    if world.fsdp:
        return sharding.shard(distiller, world, compute_dtype)
    if world.ddp:
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(distiller, device_ids=device_ids, broadcast_buffers=False)
    return distiller


def training_blocks(settings: DistillSettings, tokenizer, replies=None) -> tuple[Blocks, Blocks]:
    """(train, held-out) blocks; `replies` (a `swiftkv.replies.ReplyCache`, written before the run)
    answer the train prompts of `--targets teacher|mixed`."""
    if settings.data.targets != "human" and replies is None:
        raise ValueError(
            f"--targets {settings.data.targets} trains on written replies, and none were given; "
            "`run_distillation` writes them first (the replies stage)"
        )
    written = settings.replies_settings()  # which prompts were answered: what packing must read back
    return load_blocks(
        settings.data.spec,
        tokenizer,
        settings.data.seq_len,
        settings.data_tokens,
        settings.data.heldout_tokens,
        settings.optim.seed,
        replies if settings.data.targets != "human" else None,
        HUMAN_SHARE[settings.data.targets],
        written.long_mix(),
        every_turn=written.every_turn,
        passes=settings.data.passes,
        skip_tokens=settings.data.skip_tokens,
        split=settings.data.data_split,
    )


def run_blocks(
    settings: DistillSettings, tokenizer, replies, world: World, continued_steps: int
) -> tuple[Blocks, Blocks]:
    """(train, held-out) blocks of this run: the data's steps after the `continued_steps` that the runs it
    continues (--continue-from) trained."""
    near = (
        Path(settings.output.out).resolve().parent if settings.output.out else None
    )  # room for the blocks beside the output
    train, heldout = shared_blocks(lambda: training_blocks(settings, tokenizer, replies), world, near)
    steps = len(train) // settings.optim.batch_size
    if steps == 0:
        raise ValueError(
            f"--data {settings.data.spec!r} gives {len(train)} train blocks of {settings.data.seq_len} tokens, "
            f"fewer than one --batch-size {settings.optim.batch_size}; use more data or lower --batch-size / "
            "--seq-len"
        )
    short_of_tokens(settings, steps * settings.optim.batch_size * settings.data.seq_len, world)
    if continued_steps >= steps:
        raise ValueError(
            f"--continue-from: the data gives {steps} steps and the runs it continues trained "
            f"{continued_steps} of them; ask for more --passes"
        )
    return train.select(slice(continued_steps * settings.optim.batch_size, None)), heldout


def short_of_tokens(settings: DistillSettings, trained: int, world: World) -> None:
    """Say so when the data runs out before --tokens: the run then makes its --passes over what there is,
    with the schedule over its own (fewer) steps."""
    if trained < settings.train_tokens and world.is_main:
        more = (
            "; --prompt-turns every answers every user turn"
            if settings.data.targets != "human" and settings.replies.prompt_turns == "first"
            else ""
        )
        print(
            f"swiftkv distill: --data {settings.data.spec!r} gives {trained:,} train tokens of the "
            f"{settings.train_tokens:,} asked; training {settings.data.passes} pass(es) over them{more}",
            file=sys.stderr,
            flush=True,
        )


class Prepared(NamedTuple):
    distiller: nn.Module  # as this world trains it (sharded, DDP-wrapped or plain)
    optimizer: torch.optim.Optimizer
    step: StepSettings  # with --micro-batch resolved
    compiled: CompiledLayers  # run steps through it: --compile's fallback to the plain layers


def prepare(settings: DistillSettings, model: nn.Module, train: Blocks, world: World) -> Prepared:
    """The model on its device with its trainable set installed and frozen weights in the compute dtype;
    the distiller as this world trains it (sharded under --fsdp, which must precede the optimizer);
    the optimizer; the step settings with --micro-batch resolved; the layers compiled with --compile
    (after the micro-batch probe, which would otherwise compile every size it tries). A model on the
    meta device (`setup.load_student` under --fsdp) is sharded as it is, then each process fills its
    own shards (`sharded.fill_shards`)."""
    on_meta = device_of(model).type == "meta"
    if not on_meta:
        model.to(world.device)
    model.set_attn_implementation(ATTENTION)
    trainable.install(model, settings.model.trainable, settings.model.lora_rank, settings.optim.seed)
    compute_dtype = resolve_dtype(settings.parallel.dtype, world.device)
    cast_frozen(model, compute_dtype)
    step_settings = sized_micro_batch(
        model, train, settings.step_settings(), settings.optim.batch_size, world
    )
    if settings.parallel.activation_checkpointing:
        sharding.checkpoint_layers(model)
    compiled = CompiledLayers(model, settings.parallel.compile, lambda text: log(world, text))
    distiller = wrap(distiller_for(model, step_settings), world, compute_dtype)
    if on_meta:
        sharded.fill_shards(distiller, model, settings, world)
    return Prepared(distiller, optimizer_for(model, settings.optim), step_settings, compiled)


def finished(state: RunState) -> bool:
    return state.total_steps > 0 and state.step >= state.total_steps
