"""The compute dtype, chosen from the hardware: one helper for serve, bench, generate, demo, eval,
distill and convert's calibration.

bf16 halves memory traffic, but only hardware with native bf16 matmuls runs it faster than fp32. A
CPU without AVX512-BF16 or AMX emulates it: measured on an Ice Lake Xeon (AVX-512, no BF16), a
2048^3 matmul ran at 62 GFLOP/s in bf16 and 292 GFLOP/s in fp32, and vLLM's prefill was 3.2x
slower in bf16. So `auto` is bf16 on CUDA and on CPUs whose bf16 is native, fp32 everywhere else.
"""

from __future__ import annotations

import contextlib

import torch

AUTO = "auto"
DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
               "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
# What `--dtype` accepts on the command line (aliases are accepted too, but not listed in --help).
DTYPE_CHOICES = (AUTO, "bfloat16", "float32", "float16")


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX, as torch's own CPU capability checks report them."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def has_native_bf16(device: str | torch.device = "cpu") -> bool:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_has_native_bf16()


def auto_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 where the hardware runs it natively, fp32 otherwise."""
    return torch.bfloat16 if has_native_bf16(device) else torch.float32


def parse_dtype(name: str, option: str = "--dtype") -> torch.dtype:
    """A dtype name (float32/fp32, bfloat16/bf16, float16/fp16) -> torch dtype; `auto` is not a dtype here."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"{option} {name!r} is unknown; expected one of {[AUTO, *sorted(DTYPE_NAMES)]}")
    return DTYPE_NAMES[name]


def resolve_dtype(name: str | torch.dtype | None = AUTO, device: str | torch.device = "cpu",
                  option: str = "--dtype") -> torch.dtype:
    """`auto` / None -> the hardware's choice; a name or a torch dtype -> that dtype."""
    if isinstance(name, torch.dtype):
        return name
    if name is None or name == AUTO:
        return auto_dtype(device)
    return parse_dtype(name, option)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def describe_choice(name: str | torch.dtype | None, device: str | torch.device = "cpu") -> str:
    """One line for the output: which dtype runs and why."""
    dtype = resolve_dtype(name, device)
    if isinstance(name, torch.dtype) or (name not in (None, AUTO)):
        return f"dtype {dtype_name(dtype)} (as requested)"
    reason = "native bf16" if dtype == torch.bfloat16 else "no native bf16 on this hardware"
    return f"dtype {dtype_name(dtype)} (auto: {reason} on {torch.device(device).type}; --dtype overrides)"


def autocast(dtype: torch.dtype, device: str | torch.device = "cpu"):
    """Matmuls in `dtype` with the weights left as they are (fp32 master weights keep their
    precision); no-op for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
