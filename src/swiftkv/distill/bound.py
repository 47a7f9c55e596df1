"""A distillation step's compute bound: its FLOPs per train token (`metrics.distill_flops_per_token`, from the
share of the blocks' tokens that carry the loss) over the device's matmul peak in the compute dtype. The
share depends on the data: teacher replies of at most 64 tokens after a whole conversation carry far fewer
loss tokens than every human answer does, so a bound is only the bound of the blocks it was counted on."""

from __future__ import annotations

import functools

import torch

from ..metrics import distill_flops_per_token, matmul_peak


def step_flops_per_token(config, settings, train) -> float:
    """FLOPs per train token of one shared-prefix step of `settings` on the blocks `train`."""
    target_fraction = float(train.loss_mask.float().mean())
    late_weights = settings.trainable in ("late", "late-norms")
    return distill_flops_per_token(config, settings.seq_len, target_fraction, late_weights=late_weights)


@functools.cache
def device_peak(dtype: torch.dtype, device: torch.device) -> float:
    """The matmul peak in `dtype` on `device`, measured once per process (seconds on a CPU)."""
    return matmul_peak(dtype, device=device)


def bound_of(flops_per_token: float, tokens_per_s: float | None, peak: float) -> dict:
    """The tokens/s a perfectly matmul-bound step would reach, and how close `tokens_per_s` came (None for
    a run that took no step)."""
    return {
        "flops_per_token": round(flops_per_token),
        "matmul_peak_flops": round(peak),
        "bound_tokens_per_s": round(peak / flops_per_token, 1),
        "fraction_of_bound": round(tokens_per_s * flops_per_token / peak, 3) if tokens_per_s else None,
    }


def compute_bound(
    config,
    settings,
    train,
    tokens_per_s: float,
    dtype: torch.dtype,
    device: torch.device,
    peak: float | None = None,
) -> dict:
    """The shared-prefix step's FLOPs per train token on `train` over the matmul peak in the compute
    dtype on the training device (`peak`: measured before, alone; else `device_peak`)."""
    flops = step_flops_per_token(config, settings, train)
    return bound_of(flops, tokens_per_s, peak or device_peak(dtype, device))
