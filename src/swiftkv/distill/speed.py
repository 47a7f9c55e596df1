"""Tokens/s of one distillation step, shared prefix vs the naive two-full-passes way, in one run.

The two ways alternate step by step on the same blocks, so a machine shared with other jobs slows
both alike; CPU seconds of this process are reported beside wall seconds for the same reason.
"""

from __future__ import annotations

import resource
import time
from dataclasses import replace

import torch

from ..data.packing import Blocks
from ..dtypes import dtype_name, resolve_dtype
from ..sources import source_name
from . import trainable
from .bound import compute_bound, device_label
from .compiled import CompiledLayers
from .loss import BatchSizes
from .run import written_replies
from .setup import load_student
from .trainer import (
    ATTENTION,
    cast_frozen,
    distiller_for,
    optimizer_for,
    sized_micro_batch,
    train_step,
    training_blocks,
)
from .world import World, training_device


def timed_step(
    compiled: CompiledLayers, distiller, model, optimizer, blocks, step_settings, world: World
) -> tuple[float, float]:
    sync = torch.cuda.synchronize if world.device.type == "cuda" else (lambda: None)
    wall, cpu = time.perf_counter(), time.process_time()
    compiled.run(train_step, distiller, model, optimizer, blocks, BatchSizes.of(blocks), step_settings, world)
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def probe_blocks(settings, steps: int, tokenizer, world: World) -> Blocks:
    """The blocks of `steps` steps of the run `settings` describes: its data, split, --skip-tokens and
    targets (teacher replies where it trains on them, written first if the reply file lacks them), so the
    probe times the run's step: the loss, and the lm_head rows it runs on, follow the targets' share."""
    probe = replace(settings, tokens=settings.batch_size * steps * settings.seq_len, passes=1)
    train, _ = training_blocks(probe, tokenizer, written_replies(probe, tokenizer, world))
    return train


def measure_shared_vs_naive(settings, steps: int, naive: bool = True) -> dict:
    """`steps` optimizer steps each way (after one warm-up step each), alternating, on the run's kind of
    blocks (`probe_blocks`); `naive=False` times the shared-prefix way alone (training throughput). With
    `--compile` the decoder layers are compiled as a training run compiles them; the warm-up step then
    includes the compile."""
    settings = settings.opened()
    model, tokenizer = load_student(settings)
    world = World(device=training_device())  # the GPU where there is one, as `swiftkv distill`
    train = probe_blocks(settings, steps + 1, tokenizer, world)
    model.to(world.device)
    model.set_attn_implementation(ATTENTION)
    trainable.install(model, settings.trainable, settings.lora_rank, settings.seed)
    optimizer = optimizer_for(model, replace(settings, lr=0.0, late_lr=0.0))  # the run's trainable set; lr 0
    dtype = resolve_dtype(settings.dtype, world.device)
    cast_frozen(model, dtype)
    step_settings = sized_micro_batch(
        model, train, replace(settings.step_settings(), naive=False), settings.batch_size, world
    )
    ways = {"shared": distiller_for(model, step_settings)}
    if naive:
        ways["naive"] = distiller_for(model, replace(step_settings, naive=True))
    compiled = CompiledLayers(model, settings.compile, lambda text: print(text, flush=True))
    totals = {name: [0.0, 0.0] for name in ways}
    for step in range(steps + 1):
        blocks = train.select(slice(step * settings.batch_size, (step + 1) * settings.batch_size))
        for name, distiller in ways.items():
            wall, cpu = timed_step(compiled, distiller, model, optimizer, blocks, step_settings, world)
            if step:  # step 0 warms up allocators and kernels
                totals[name][0] += wall
                totals[name][1] += cpu
    tokens = steps * settings.batch_size * settings.seq_len
    result = {
        "model": source_name(settings.source),
        "num_key_value_layers": model.config.num_key_value_layers,
        "tokens_per_way": tokens,
        "seq_len": settings.seq_len,
        "dtype": dtype_name(dtype),
        "device": device_label(world.device),
        "micro_batch": step_settings.micro_batch,
        "compiled": compiled.active,
        "threads": torch.get_num_threads(),
        "trainable": settings.trainable,
        "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    for name, (wall, cpu) in totals.items():
        result[name] = {
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "tokens_per_s": round(tokens / wall, 1),
            "tokens_per_cpu_s": round(tokens / cpu, 1),
        }
    result["compute_bound"] = compute_bound(
        model.config,
        settings,
        train,
        result["shared"]["tokens_per_s"],
        dtype,
        world.device,
        micro_batch=step_settings.micro_batch,
    )
    result["peak_memory_mib"] = peak_memory_mib(world.device)
    if naive:
        result["speedup_wall"] = round(totals["naive"][0] / totals["shared"][0], 3)
        result["speedup_cpu"] = round(totals["naive"][1] / totals["shared"][1], 3)
    return result


def peak_memory_mib(device: torch.device) -> float:
    """This process's peak: resident memory on a CPU (model, data and steps), allocated memory on a GPU."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB
