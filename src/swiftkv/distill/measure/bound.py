"""A distillation step's compute bound and MFU: its FLOPs per train token as executed
(`flops.distill_flops_per_token`, on the micro-batches the run cuts its own blocks into) over the device's
matmul peak in the compute dtype, measured, and over its nominal dense bf16 peak (MFU, as torchtitan and
nanoGPT report it). The count depends on the data: the student's later layers run only on the positions a
micro-batch trains, so teacher replies of at most 64 tokens after a whole conversation cost far fewer FLOPs per
token than every human answer does, and a bound is only the bound of the blocks it was counted on."""

from __future__ import annotations

import functools

import torch

from ...flops import MicroBatch, StepPaths, distill_flops_per_token
from ...peaks import matmul_peak, nominal_peak
from ..core.microbatch import AUTO
from ..core.trainable import DEFAULT_LORA_RANK


def step_paths(settings) -> StepPaths:
    """What `settings` make a step run (`metrics.StepPaths`)."""
    return StepPaths(
        trainable=settings.model.trainable,
        lora_rank=settings.model.lora_rank or DEFAULT_LORA_RANK,
        naive=settings.parallel.naive,
        probe=bool(settings.loss.mse_weight),
        recompute=settings.parallel.activation_checkpointing,
    )


def micro_batches(loss_mask: torch.Tensor, micro_batch: int, probe: bool) -> list[MicroBatch]:
    """The micro-batches of consecutive `micro_batch` blocks (how every step cuts its blocks, whatever the
    world size: each process takes consecutive blocks, a multiple of the micro-batch), each with the
    positions the student's later layers run on: the union of the trained ones (every position with the
    probe; position 0 for a micro-batch with none, which runs one stand-in row)."""
    seq_len = loss_mask.shape[1]
    out = []
    for start in range(0, loss_mask.shape[0], micro_batch):
        mask = loss_mask[start : start + micro_batch]
        rows = int(mask.sum())
        positions = seq_len if probe else (int(mask.any(0).sum()) if rows else 1)
        out.append(MicroBatch(mask.shape[0], seq_len, positions, max(rows, 1)))
    return out


def step_flops_per_token(config, settings, train, micro_batch: int | str | None = None) -> float:
    """FLOPs per train token of the steps of `settings` on the blocks `train` (its whole steps), cut into
    `micro_batch` blocks per forward (default: the settings'; `auto` unresolved counts the whole
    per-process batch in one forward, the size CUDA's auto tries first)."""
    micro = settings.parallel.micro_batch if micro_batch is None else micro_batch
    if micro == AUTO:
        micro = settings.optim.batch_size
    steps = len(train) // settings.optim.batch_size
    mask = train.loss_mask[: steps * settings.optim.batch_size] if steps else train.loss_mask
    paths = step_paths(settings)
    return distill_flops_per_token(config, micro_batches(mask, int(micro), paths.probe), paths)


@functools.cache
def device_peak(dtype: torch.dtype, device: torch.device) -> float:
    """The matmul peak in `dtype` on `device`, measured once per process (seconds on a CPU)."""
    return matmul_peak(dtype, device=device)


def device_label(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def bound_of(
    flops_per_token: float,
    tokens_per_s: float | None,
    peak: float,
    nominal: float | None = None,
    device: str | None = None,
) -> dict:
    """The tokens/s a perfectly matmul-bound step would reach, how close `tokens_per_s` came to the measured
    `peak` (None for a run that took no step), and its MFU against the `nominal` peak (None where the device
    has none in `peaks.NOMINAL_BF16_PEAKS`: a CPU, an unlisted GPU)."""
    achieved = tokens_per_s * flops_per_token if tokens_per_s else None
    return {
        "flops_per_token": round(flops_per_token),
        "matmul_peak_flops": round(peak),
        "bound_tokens_per_s": round(peak / flops_per_token, 1),
        "fraction_of_bound": round(achieved / peak, 3) if achieved else None,
        "device": device,
        "nominal_peak_flops": round(nominal) if nominal else None,
        "mfu": round(achieved / nominal, 3) if achieved and nominal else None,
    }


def devices_bound(
    flops_per_token: float,
    tokens_per_s: float | None,
    dtype: torch.dtype,
    device: torch.device,
    devices: int = 1,
    peak: float | None = None,
) -> dict:
    """`bound_of` against `devices` devices like `device` (the measured peak `peak` of one, else
    `device_peak`; the nominal one from its name)."""
    label = device_label(device)
    one = peak or device_peak(dtype, device)
    nominal = nominal_peak(label)
    return bound_of(
        flops_per_token, tokens_per_s, devices * one, devices * nominal if nominal else None, label
    )


def compute_bound(
    config,
    settings,
    train,
    tokens_per_s: float,
    dtype: torch.dtype,
    device: torch.device,
    peak: float | None = None,
    micro_batch: int | str | None = None,
) -> dict:
    """The step's FLOPs per train token on `train` (cut into `micro_batch` blocks per forward) over the matmul
    peak in the compute dtype on the training device (`peak`: measured before, alone; else `device_peak`) and
    over its nominal peak."""
    flops = step_flops_per_token(config, settings, train, micro_batch)
    return devices_bound(flops, tokens_per_s, dtype, device, peak=peak)


def bound_line(bound: dict) -> str:
    """One line for a compute bound: the fraction of the measured peak and the MFU against the nominal one
    ("n/a" where there is no step's rate, or no nominal peak: a CPU, an unlisted GPU)."""

    def share(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.1%}"

    nominal = bound.get("nominal_peak_flops")
    against = f"the nominal {nominal / 1e12:,.0f} TFLOP/s" if nominal else "no nominal peak for this device"
    return (
        f"{share(bound.get('fraction_of_bound'))} of the measured {bound['matmul_peak_flops'] / 1e12:,.3g} "
        f"TFLOP/s matmul peak, MFU {share(bound.get('mfu'))} ({against}; "
        f"{bound['flops_per_token'] / 1e6:,.0f} MFLOP/token as executed)"
    )
