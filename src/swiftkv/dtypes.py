"""The compute dtype, chosen from the hardware: one helper for serve, bench, generate, demo, eval,
distill and convert's calibration.

bf16 halves memory traffic, but only hardware with native bf16 matmuls runs it faster than fp32. A
CPU without AVX512-BF16 or AMX emulates it: measured on an Ice Lake Xeon (AVX-512, no BF16), a
2048^3 matmul ran at 62 GFLOP/s in bf16 and 292 GFLOP/s in fp32, and vLLM's prefill was 3.2x
slower in bf16. A CPU flag is not enough either: a Xeon reporting AVX512-BF16 (no AMX) ran the same
matmul at 102 GFLOP/s in bf16 and 340 in fp32 (2026-11-25). So `auto` is bf16 on CUDA, and on a CPU
only where bf16 is native *and* a short matmul measures it faster than fp32; fp32 everywhere else.
The measurement (about a second) is stored per CPU model, torch version and thread count, so every
stage on one machine makes the same choice.
"""

from __future__ import annotations

import contextlib
import functools
import json
import platform
import time

import torch

from .files import cache_root, write_atomic

AUTO = "auto"
DTYPE_NAMES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}
# What `--dtype` accepts on the command line (aliases are accepted too, but not listed in --help).
DTYPE_CHOICES = (AUTO, "bfloat16", "float32", "float16")


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX, as torch's own CPU capability checks report them."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


# bf16 must beat fp32 by this much to be chosen: below it, fp32's precision is worth more.
BF16_MIN_SPEEDUP = 1.1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor()


def matmul_seconds(dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    """Best time of one size^3 matmul in `dtype` with torch's own threads."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return best


def measure_bf16_speedup(rounds: int = 3) -> float:
    """fp32 time / bf16 time, the two interleaved so that other load on the machine hits both alike."""
    fp32 = bf16 = float("inf")
    for _ in range(rounds):
        fp32 = min(fp32, matmul_seconds(torch.float32))
        bf16 = min(bf16, matmul_seconds(torch.bfloat16))
    return fp32 / bf16


@functools.cache
def cpu_bf16_speedup() -> float:
    """The measured speedup of bf16 over fp32 matmuls on this CPU, read from the cache when this
    machine (CPU model, torch version, threads) was measured before."""
    key = f"{_cpu_model()}|torch {torch.__version__}|{torch.get_num_threads()} threads"
    path = cache_root() / "bf16-speedup.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = round(measure_bf16_speedup(), 3)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(known, indent=1))
    return known[key]


def cpu_bf16_is_faster() -> bool:
    """Native bf16 that also measures faster than fp32 (some CPUs report the flag and run it slower)."""
    return cpu_has_native_bf16() and cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


def has_native_bf16(device: str | torch.device = "cpu") -> bool:
    """bf16 that pays on `device`: CUDA with bf16 support, or a CPU where it is native and faster."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return device.type == "cpu" and cpu_bf16_is_faster()


def compute_device(local_rank: int = 0) -> torch.device:
    """Where the heavy passes run: this process's GPU when there is one, else the CPU."""
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def auto_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 where the hardware runs it natively, fp32 otherwise."""
    return torch.bfloat16 if has_native_bf16(device) else torch.float32


def parse_dtype(name: str, option: str = "--dtype") -> torch.dtype:
    """A dtype name (float32/fp32, bfloat16/bf16, float16/fp16) -> torch dtype; `auto` is not a dtype here."""
    if name not in DTYPE_NAMES:
        raise ValueError(f"{option} {name!r} is unknown; expected one of {[AUTO, *sorted(DTYPE_NAMES)]}")
    return DTYPE_NAMES[name]


def resolve_dtype(
    name: str | torch.dtype | None = AUTO, device: str | torch.device = "cpu", option: str = "--dtype"
) -> torch.dtype:
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
    if dtype == torch.bfloat16:
        reason = "native bf16"
    elif torch.device(device).type == "cpu" and cpu_has_native_bf16():
        reason = f"bf16 is native but measured {cpu_bf16_speedup():.2f}x fp32, not faster"
    else:
        reason = "no native bf16 on this hardware"
    return f"dtype {dtype_name(dtype)} (auto: {reason} on {torch.device(device).type}; --dtype overrides)"


def autocast(dtype: torch.dtype, device: str | torch.device = "cpu"):
    """Matmuls in `dtype` with the weights left as they are (fp32 master weights keep their
    precision); no-op for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=dtype)
