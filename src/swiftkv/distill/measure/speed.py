"""Tokens/s of one distillation step: shared prefix vs the naive two-full-passes way in one run (`--speed`,
`--compare-naive`), and the time plan of `--plan` on random weights of a model's shape (`time_plan`, below).

The two ways alternate step by step on the same blocks, so a machine shared with other jobs slows
both alike; CPU seconds of this process are reported beside wall seconds for the same reason.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from transformers import AutoModelForCausalLM

from ...data.packing import Blocks
from ...dtypes import dtype_name, resolve_dtype
from ...model.modeling import swiftkv_parameters
from ...peaks import nominal_peak
from ...sources import source_name
from ..core import trainable
from ..core.compiled import CompiledLayers
from ..core.loss import BatchSizes
from ..core.trainer import (
    ATTENTION,
    cast_frozen,
    distiller_for,
    optimizer_for,
    prepare,
    sized_micro_batch,
    train_step,
    training_blocks,
)
from ..parallel.world import World, training_device
from ..start.setup import load_student
from ..start.targets import written_replies
from . import memory
from .bound import compute_bound, device_label, device_peak, step_flops_per_token


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
    probe = settings.but(tokens=settings.optim.batch_size * steps * settings.data.seq_len, passes=1)
    train, _ = training_blocks(probe, tokenizer, written_replies(probe, tokenizer, world))
    return train


def alternated_totals(ways: dict, timed: Callable, batches: list[Blocks]) -> dict[str, tuple[float, float]]:
    """Each way's wall and CPU seconds over `batches`, the ways alternating on each batch (so a drift in the
    machine's speed reaches both), the first batch left out: it warms up allocators and kernels."""
    totals = {name: (0.0, 0.0) for name in ways}
    for step, blocks in enumerate(batches):
        for name, distiller in ways.items():
            wall, cpu = timed(distiller, blocks)
            if step:
                totals[name] = (totals[name][0] + wall, totals[name][1] + cpu)
    return totals


def way_rates(wall: float, cpu: float, tokens: int) -> dict:
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "tokens_per_s": round(tokens / wall, 1),
        "tokens_per_cpu_s": round(tokens / cpu, 1),
    }


def timed_student(settings, steps: int, world: World):
    """The student as a run trains it on `world`'s device (its trainable set, frozen weights in the compute
    dtype, an optimizer at lr 0), with the blocks of `steps` steps and a warm-up: (model, blocks, optimizer,
    dtype)."""
    model, tokenizer = load_student(settings)
    train = probe_blocks(settings, steps + 1, tokenizer, world)
    model.to(world.device)
    model.set_attn_implementation(ATTENTION)
    trainable.install(model, settings.model.trainable, settings.model.lora_rank, settings.optim.seed)
    optimizer = optimizer_for(model, replace(settings.optim, lr=0.0, late_lr=0.0))  # the run's trainable set
    dtype = resolve_dtype(settings.parallel.dtype, world.device)
    cast_frozen(model, dtype)
    return model, train, optimizer, dtype


def measure_shared_vs_naive(settings, steps: int, naive: bool = True) -> dict:
    """`steps` optimizer steps each way (after one warm-up step each), alternating, on the run's kind of
    blocks (`probe_blocks`); `naive=False` times the shared-prefix way alone (training throughput). With
    `--compile` the decoder layers are compiled as a training run compiles them; the warm-up step then
    includes the compile."""
    settings = settings.opened()
    world = World(device=training_device())  # the GPU where there is one, as `swiftkv distill`
    model, train, optimizer, dtype = timed_student(settings, steps, world)
    step_settings = sized_micro_batch(
        model, train, replace(settings.step_settings(), naive=False), settings.optim.batch_size, world
    )
    ways = {"shared": distiller_for(model, step_settings)}
    if naive:
        ways["naive"] = distiller_for(model, replace(step_settings, naive=True))
    compiled = CompiledLayers(model, settings.parallel.compile, lambda text: print(text, flush=True))
    batches = [
        train.select(slice(step * settings.optim.batch_size, (step + 1) * settings.optim.batch_size))
        for step in range(steps + 1)
    ]
    totals = alternated_totals(
        ways,
        lambda distiller, blocks: timed_step(
            compiled, distiller, model, optimizer, blocks, step_settings, world
        ),
        batches,
    )
    tokens = steps * settings.optim.batch_size * settings.data.seq_len
    result = {
        "model": source_name(settings.model.source),
        "num_key_value_layers": model.config.num_key_value_layers,
        "tokens_per_way": tokens,
        "seq_len": settings.data.seq_len,
        "dtype": dtype_name(dtype),
        "device": device_label(world.device),
        "micro_batch": step_settings.micro_batch,
        "compiled": compiled.active,
        "threads": torch.get_num_threads(),
        "trainable": settings.model.trainable,
        "trained_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    for name, (wall, cpu) in totals.items():
        result[name] = way_rates(wall, cpu, tokens)
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
    return round(memory.peak_mib(device), 1)


# --------------------------------------------------------------------------------------------------
# The time plan of `swiftkv distill SRC --plan`
# --------------------------------------------------------------------------------------------------
# Time of a planned distillation run on this device (`swiftkv distill SRC --plan`): a few real steps of the
# trainer (`trainer.prepare`, `trainer.train_step`) on random weights of SRC's shape, turned into tokens/s and
# device-hours per 100M tokens of the planned run by its FLOPs as executed (`bound.step_flops_per_token`).
#
# On a GPU whose memory holds the whole model (one process, the plan's DDP count) the whole model is timed.
# Otherwise, and always on a CPU, three layers at the true width are (one early, two later: every matmul of
# the step at the model's own sizes, and a later layer's input for the hidden-state MSE at index -2 to read), on a CPU over a shorter block and a smaller vocabulary so that a step takes
# seconds; the rate they reach (FLOP/s as executed) is divided by the planned run's FLOPs per token. The blocks
# are random tokens with the last quarter of each block's positions trained (about the share of chat answers;
# teacher replies train fewer, which the count follows). One process is timed: FSDP's gathers and DDP's
# reductions are not, so a sharded run's time is a lower bound.

TIMED_LAYERS = 3  # of a model too large to time whole: one early, two later
TRAINED_SHARE = 0.25  # of each timed block's positions, the last ones (as the 8B shape was timed on the H200)
TIMED_STEPS = 2  # after one warm-up step
CPU_SEQ_LEN = 256  # a CPU times shorter blocks and a smaller head: seconds, not minutes, per step
CPU_VOCAB = 8192
WHOLE_MODEL_SHARE = 0.85  # of a GPU's memory, under which the whole model is timed
HOURS_PER_100M = 1e8 / 3600


@dataclass
class TimePlan:
    device: str
    dtype: str
    timed: (
        str  # what ran: the whole model, or three layers at the true width (and at which block / vocabulary)
    )
    seconds_per_step: float
    achieved_flops: float  # FLOP/s of the timed steps, as executed
    flops_per_token: float  # the planned run's, as executed
    tokens_per_s: float  # per process
    device_hours_per_100m_tokens: float  # the same on any number of processes, if they scaled linearly
    fraction_of_peak: float  # of this device's measured matmul peak in the compute dtype
    mfu: float | None  # against its nominal dense bf16 peak (None: a CPU, an unlisted GPU)
    measured_peak_gib: float | None = None  # the whole model's steps on a GPU: torch's allocated peak

    def lines(self, world_size: int) -> list[str]:
        mfu = "n/a" if self.mfu is None else f"{self.mfu:.1%}"
        wall = self.device_hours_per_100m_tokens / world_size
        memory = f"; measured peak {self.measured_peak_gib:.2f} GiB" if self.measured_peak_gib else ""
        return [
            f"time on this device ({self.device}, {self.dtype}): {figures(self.tokens_per_s)} tok/s per process, "
            f"{figures(self.device_hours_per_100m_tokens)} device-hours per 100M tokens ({figures(wall)} h on "
            f"{world_size} process(es) if they scaled linearly; gathers and reductions not timed)",
            f"  timed: {self.timed}, {self.seconds_per_step:.2f} s per step, {flops(self.achieved_flops)}/s as "
            f"executed = {self.fraction_of_peak:.1%} of the measured matmul peak, MFU {mfu}; the run: "
            f"{flops(self.flops_per_token)} per token{memory}",
        ]


def figures(value: float) -> str:
    """Three significant figures at least, with thousands separated (0.333, 21,263, 1.31)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def flops(value: float) -> str:
    """`value` FLOPs with the prefix that keeps three figures readable (786 MFLOP, 32.2 GFLOP, 753 TFLOP)."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if value >= scale:
            return f"{value / scale:,.3g} {prefix}FLOP"
    return f"{value:,.0f} FLOP"


def random_blocks(count: int, seq_len: int, vocab: int) -> Blocks:
    """Random token blocks, one document each, the last TRAINED_SHARE of each block's positions trained
    (but the last, which has no next token)."""
    ids = torch.randint(3, vocab, (count, seq_len), generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(count, seq_len, dtype=torch.bool)
    mask[:, int(seq_len * (1 - TRAINED_SHARE)) : -1] = True
    return Blocks(ids, torch.arange(seq_len).repeat(count, 1), mask)


def few_layer_config(config, vocab_size: int | None):
    """`config` cut to one early and two later layers (G = 1) at the same widths (`vocab_size`: a smaller
    vocabulary, None keeps it). Two later layers, so that hidden_states[-2], the reference recipe's MSE
    target, is a later layer's input (an early layer's is the same in teacher and student, and refused)."""
    values = config.to_dict()
    values.update(num_hidden_layers=TIMED_LAYERS, num_key_value_layers=1, key_value_group_size=1)
    if values.get("layer_types"):
        values["layer_types"] = values["layer_types"][:TIMED_LAYERS]
    if vocab_size is not None:  # the special ids may lie beyond it; random tokens need none
        values.update(vocab_size=min(vocab_size, config.vocab_size), bos_token_id=None, pad_token_id=None)
        values["eos_token_id"] = None
    return type(config)(**values)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def random_model(config, device: torch.device, dtype: torch.dtype):
    """A SwiftKV model of `config` with random weights, built on `device` in the compute dtype (no fp32 copy
    of a large model ever exists), its SwiftKV parameters fp32 as the trainer keeps them."""
    torch.manual_seed(0)
    with torch.device(device), default_dtype(dtype):  # dtype given too: a config's own `dtype` would win
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    for parameter in swiftkv_parameters(model).values():
        parameter.data = parameter.data.float()
    return model


def whole_model_fits(whole_gib: float, device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return whole_gib * 2**30 < WHOLE_MODEL_SHARE * torch.cuda.get_device_properties(device).total_memory


def time_plan(
    config, settings, dtype: torch.dtype, device: torch.device, whole_gib: float, steps: int = TIMED_STEPS
) -> TimePlan:
    """Time `steps` steps (after a warm-up) of `settings`' step, one micro-batch each, on random weights of
    `config`'s shape on `device` (see the module docstring); `whole_gib`: the plan of the whole model on one
    process, which decides whether it is timed whole."""
    whole = whole_model_fits(whole_gib, device)
    seq_len = settings.data.seq_len if device.type == "cuda" else min(settings.data.seq_len, CPU_SEQ_LEN)
    timed_config = config if whole else few_layer_config(config, None if device.type == "cuda" else CPU_VOCAB)
    micro = int(settings.parallel.micro_batch)
    timed_settings = settings.but(
        seq_len=seq_len, batch_size=micro, fsdp=False, compile=False, tokens=micro * seq_len
    )
    model = random_model(timed_config, device, dtype)
    train = random_blocks(micro * (steps + 1), seq_len, timed_config.vocab_size)
    world = World(device=device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    distiller, optimizer, step_settings, _ = prepare(timed_settings, model, train, world)
    seconds = timed_steps(distiller, model, optimizer, train, step_settings, world, micro)
    timed_blocks = train.select(slice(micro, None))
    executed = (
        step_flops_per_token(timed_config, timed_settings, timed_blocks, micro) * timed_blocks.num_tokens
    )
    achieved = executed / seconds
    planned = random_blocks(micro, settings.data.seq_len, timed_config.vocab_size)  # the run's blocks' shape
    flops_per_token = step_flops_per_token(config, settings, planned, micro)
    rate = achieved / flops_per_token
    label = device_label(device)
    nominal = nominal_peak(label)
    measured = torch.cuda.max_memory_allocated(device) / 2**30 if whole else None
    del distiller, optimizer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return TimePlan(
        device=label,
        dtype=dtype_name(dtype),
        timed=timed_what(whole, timed_config, seq_len, micro),
        seconds_per_step=seconds / steps,
        achieved_flops=achieved,
        flops_per_token=flops_per_token,
        tokens_per_s=rate,
        device_hours_per_100m_tokens=HOURS_PER_100M / rate,
        fraction_of_peak=achieved / device_peak(dtype, device),
        mfu=achieved / nominal if nominal else None,
        measured_peak_gib=round(measured, 2) if measured else None,
    )


def timed_steps(distiller, model, optimizer, train: Blocks, step_settings, world: World, micro: int) -> float:
    """Seconds of the steps after the first (which allocates and warms up), one micro-batch each."""
    sync = torch.cuda.synchronize if world.device.type == "cuda" else (lambda: None)
    seconds = 0.0
    for index in range(len(train) // micro):
        blocks = train.select(slice(index * micro, (index + 1) * micro))
        sync()
        started = time.perf_counter()
        train_step(distiller, model, optimizer, blocks, BatchSizes.of(blocks), step_settings, world)
        sync()
        if index:
            seconds += time.perf_counter() - started
    return seconds


def timed_what(whole: bool, config, seq_len: int, micro: int) -> str:
    shape = f"{micro} x {seq_len} tokens per step, eager"
    if whole:
        return f"the whole model, {shape}"
    return (
        f"{TIMED_LAYERS} layers (1 early, {TIMED_LAYERS - 1} later) at the true width, vocabulary {config.vocab_size:,}, {shape}; scaled "
        "to the run by FLOPs as executed"
    )
