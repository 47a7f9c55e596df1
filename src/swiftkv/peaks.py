"""How fast a device can multiply: the GPUs' nominal bf16 peaks (MFU's denominator) and a measured matmul
peak (beside it, and on a CPU the only one)."""

from __future__ import annotations

import time

import torch

# Nominal dense bf16 tensor-core peaks (FLOP/s), the denominator of MFU, from NVIDIA's datasheets (which print
# them with 2:4 sparsity, twice these): H100 SXM and H200 SXM 1,979 sparse (nvidia.com/en-us/data-center/h100/,
# /h200/), H100 PCIe 1,513, H100 NVL and H200 NVL 1,671; A100 312 dense (A100 datasheet); L40S 733 sparse (L40S datasheet);
# B200 4.5 PFLOP/s sparse (HGX B200 datasheet). Matched in order against `torch.cuda.get_device_name` (the SXM
# H100 reports as "NVIDIA H100 80GB HBM3"); a CPU has none (MFU "n/a").
NOMINAL_BF16_PEAKS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200 NVL", 835e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("B200", 2250e12),
)


def nominal_peak(device_name: str) -> float | None:
    """The nominal dense bf16 peak of the device called `device_name` (None: a CPU, or a GPU not listed)."""
    for key, peak in NOMINAL_BF16_PEAKS:
        if key.lower() in device_name.lower():
            return peak
    return None


def matmul_peak(
    dtype: torch.dtype, size: int | None = None, repeats: int = 10, device: str | torch.device = "cpu"
) -> float:
    """Best observed matmul rate (FLOP/s) in `dtype` on `device` (the CPU with torch's own threads, or
    a GPU, whose peak needs bigger matrices to show)."""
    device = torch.device(device)
    size = size or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b  # warm-up
    sync()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best
